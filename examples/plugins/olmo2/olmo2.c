/* OLMo 2 (model_type "olmo2"): an architecture plugin written against the installed plugin
 * development kit alone, as an outside author would. docs/plugins.md walks through it.
 *
 * OLMo 2 is a Llama-style decoder with two differences:
 *   - its norms come after each sublayer, on the sublayer's output, instead of before it:
 *       x = x + post_attention_layernorm(attn(x))
 *       x = x + post_feedforward_layernorm(mlp(x))
 *   - q and k get an RMSNorm over the whole projection (all heads at once, one weight of
 *     heads * head_dim), before they are split into heads and rotated.
 * Everything else (rope, grouped K/V heads, SwiGLU MLP, final norm, lm_head) is as in Llama.
 * It uses nothing newer than ABI 1.0 on purpose: tests/abi builds it against 1.0's headers
 * and runs it in today's host. */
#include <lmhost/lmhost.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* The weights of one decoder layer. The host owns the tensors; we keep pointers. */
typedef struct layer {
    lmh_tensor *wq, *wk, *wv, *wo; /* attention projections [out, in] */
    lmh_tensor *q_norm, *k_norm;   /* [heads * head_dim], [kv_heads * head_dim] */
    lmh_tensor *post_attn_norm, *post_mlp_norm;
    lmh_tensor *wg, *wu, *wd; /* the SwiGLU MLP */
} layer;

/* The plugin's own model: whatever forward() needs, read once in load(). */
struct lmh_model {
    int32_t n_layers, hidden, heads, kv_heads, head_dim, inter, vocab;
    float eps, rope_factor;
    lmh_tensor *embed, *norm, *lm_head, *inv_freq;
    layer *layers;
};

/* The checkpoints this plugin claims: config.json's model_type. */
static const char *const model_types[] = {"olmo2", NULL};

/* A positive integer from config.json; `def` > 0 stands in when the key is absent. */
static int cfg_pos(const lmh_host_api *h, lmh_load_ctx *ld, const char *key, int64_t def,
                   int32_t *out) {
    int64_t v = def;
    int rc = h->cfg_int(ld, key, &v);
    if (rc == LMH_ETYPE) return h->fail(ld, "config.json: %s must be an integer", key);
    if (rc == LMH_ENOTFOUND && def <= 0) return h->fail(ld, "config.json: %s is missing", key);
    if (v <= 0 || v > (1 << 30))
        return h->fail(ld, "config.json: %s must be positive (got %lld)", key, (long long)v);
    *out = (int32_t)v;
    return 0;
}

/* Checkpoint tensor "model.layers.<l>.<suffix>" of shape [d0] or [d0, d1], placed on the
 * backend that runs layer l. NULL (after the host recorded why) if missing or misshapen. */
static lmh_tensor *layer_weight(const lmh_host_api *h, lmh_load_ctx *ld, int32_t l,
                                const char *suffix, int64_t d0, int64_t d1) {
    char name[256];
    snprintf(name, sizeof name, "model.layers.%d.%s", l, suffix);
    int64_t ne[2] = {d0, d1};
    return h->weight(ld, l, name, d1 ? 2 : 1, ne);
}

static void unload(lmh_model *m) {
    if (!m) return;
    free(m->layers);
    free(m);
}

static int load(const lmh_host_api *h, lmh_load_ctx *ld, lmh_model **out) {
    lmh_model *m = calloc(1, sizeof *m);
    if (!m) return h->fail(ld, "out of memory");
    *out = m; /* from here on the host calls unload() whatever happens */
    if (cfg_pos(h, ld, "hidden_size", 0, &m->hidden) ||
        cfg_pos(h, ld, "num_hidden_layers", 0, &m->n_layers) ||
        cfg_pos(h, ld, "num_attention_heads", 0, &m->heads) ||
        cfg_pos(h, ld, "num_key_value_heads", m->heads, &m->kv_heads) ||
        cfg_pos(h, ld, "head_dim", m->hidden / m->heads, &m->head_dim) ||
        cfg_pos(h, ld, "intermediate_size", 0, &m->inter) ||
        cfg_pos(h, ld, "vocab_size", 0, &m->vocab))
        return LMH_EINVAL;
    if (m->heads % m->kv_heads)
        return h->fail(ld, "config.json: %d heads are not a multiple of %d key/value heads",
                       m->heads, m->kv_heads);
    if (m->head_dim % 2 || m->head_dim > 1024)
        return h->fail(ld, "config.json: head_dim %d is not supported", m->head_dim);
    double eps = 1e-6;
    if (h->cfg_float(ld, "rms_norm_eps", &eps) == LMH_ETYPE || !(eps > 0))
        return h->fail(ld, "config.json: rms_norm_eps must be a positive number");
    m->eps = (float)eps;
    int bias = 0;
    h->cfg_bool(ld, "attention_bias", &bias);
    if (bias) return h->fail(ld, "config.json: attention_bias is not supported by this plugin");

    /* Declare the model, then what each layer keeps between steps: keys and values,
     * which the cache plugin chosen for the request stores. */
    if (h->declare_model(ld, m->n_layers, m->vocab)) return LMH_EINVAL;
    const int64_t H = m->hidden, qd = (int64_t)m->heads * m->head_dim,
                  kd = (int64_t)m->kv_heads * m->head_dim;
    m->layers = calloc((size_t)m->n_layers, sizeof *m->layers);
    if (!m->layers) return h->fail(ld, "out of memory");
    for (int32_t l = 0; l < m->n_layers; l++) {
        lmh_layer_state st = {.kind = LMH_STATE_KV,
                              .n_kv_heads = m->kv_heads,
                              .head_dim_k = m->head_dim,
                              .head_dim_v = m->head_dim,
                              .window = 0};
        if (h->declare_layer(ld, l, &st)) return LMH_EINVAL;
        layer *L = &m->layers[l];
        L->wq = layer_weight(h, ld, l, "self_attn.q_proj.weight", qd, H);
        L->wk = layer_weight(h, ld, l, "self_attn.k_proj.weight", kd, H);
        L->wv = layer_weight(h, ld, l, "self_attn.v_proj.weight", kd, H);
        L->wo = layer_weight(h, ld, l, "self_attn.o_proj.weight", H, qd);
        L->q_norm = layer_weight(h, ld, l, "self_attn.q_norm.weight", qd, 0);
        L->k_norm = layer_weight(h, ld, l, "self_attn.k_norm.weight", kd, 0);
        L->post_attn_norm = layer_weight(h, ld, l, "post_attention_layernorm.weight", H, 0);
        L->post_mlp_norm = layer_weight(h, ld, l, "post_feedforward_layernorm.weight", H, 0);
        L->wg = layer_weight(h, ld, l, "mlp.gate_proj.weight", m->inter, H);
        L->wu = layer_weight(h, ld, l, "mlp.up_proj.weight", m->inter, H);
        L->wd = layer_weight(h, ld, l, "mlp.down_proj.weight", H, m->inter);
        if (!L->wq || !L->wk || !L->wv || !L->wo || !L->q_norm || !L->k_norm ||
            !L->post_attn_norm || !L->post_mlp_norm || !L->wg || !L->wu || !L->wd)
            return LMH_EINVAL; /* the host has the message */
    }

    /* The embedding sits with the first layer's inputs, the final norm and head with the
     * output: the host may place those on different backends (--gpu-layers). */
    int64_t ene[2] = {m->vocab, H};
    m->embed = h->weight(ld, LMH_LAYER_INPUT, "model.embed_tokens.weight", 2, ene);
    m->norm = h->weight(ld, LMH_LAYER_OUTPUT, "model.norm.weight", 1, &H);
    int tied = 0;
    h->cfg_bool(ld, "tie_word_embeddings", &tied);
    m->lm_head = tied ? m->embed : h->weight(ld, LMH_LAYER_OUTPUT, "lm_head.weight", 2, ene);
    if (!m->embed || !m->norm || !m->lm_head) return LMH_EINVAL;

    /* Rope: the host reads rope_theta / rope_scaling (or rope_parameters) and computes the
     * inverse frequencies of every rope type it knows. */
    float inv[512];
    lmh_rope_info ri = {.attn_factor = 1.0f, .n_pairs = m->head_dim / 2};
    if (h->rope_freqs(ld, NULL, m->head_dim, inv, &ri)) return LMH_EINVAL;
    int64_t n_pairs = m->head_dim / 2;
    m->inv_freq = h->constant(ld, LMH_LAYER_INPUT, LMH_F32, 1, &n_pairs, inv);
    m->rope_factor = ri.attn_factor;
    return m->inv_freq ? LMH_OK : LMH_EINVAL;
}

/* One forward pass over the batch's rows. Nothing runs here: each helper enqueues an op on
 * the backend of b.layer, and the host runs the queue after forward() returns. */
static int forward(lmh_model *m, const lmh_host_api *h, lmh_fwd *f, const lmh_batch *bt) {
    const int64_t n = bt->n_rows, H = m->hidden, hd = m->head_dim;
    const int64_t qd = (int64_t)m->heads * hd, kd = (int64_t)m->kv_heads * hd;
    lmh_build b = {.h = h, .f = f, .layer = LMH_LAYER_INPUT};
    lmh_tensor *x = lmh_b_get_rows(&b, NULL, m->embed, bt->tokens);
    /* Scratch shared by all layers (ops run in order): activations are f32 [rows, width]. */
    lmh_tensor *q = lmh_b_new2(&b, n, qd), *k = lmh_b_new2(&b, n, kd), *v = lmh_b_new2(&b, n, kd),
               *att = lmh_b_new2(&b, n, qd), *o = lmh_b_new2(&b, n, H),
               *g = lmh_b_new2(&b, n, m->inter), *u = lmh_b_new2(&b, n, m->inter);
    /* The same memory seen as [rows, heads, head_dim] for rope and attention. */
    lmh_tensor *q3 = lmh_b_heads(&b, q, m->heads, hd), *k3 = lmh_b_heads(&b, k, m->kv_heads, hd),
               *v3 = lmh_b_heads(&b, v, m->kv_heads, hd),
               *att3 = lmh_b_heads(&b, att, m->heads, hd);
    const lmh_attn_params ap = {.scale = 1.0f / sqrtf((float)hd), .softcap = 0, .window = 0};
    for (int32_t l = 0; l < m->n_layers; l++) {
        const layer *L = &m->layers[l];
        b.layer = l;
        /* attention on the un-normalised stream; q/k norms span all heads */
        lmh_b_matmul(&b, q, x, L->wq, NULL);
        lmh_b_matmul(&b, k, x, L->wk, NULL);
        lmh_b_matmul(&b, v, x, L->wv, NULL);
        lmh_b_rms_norm(&b, q, q, L->q_norm, m->eps, 0);
        lmh_b_rms_norm(&b, k, k, L->k_norm, m->eps, 0);
        lmh_b_rope(&b, q3, bt->positions, m->inv_freq, (int32_t)hd, LMH_ROPE_HALF, m->rope_factor);
        lmh_b_rope(&b, k3, bt->positions, m->inv_freq, (int32_t)hd, LMH_ROPE_HALF, m->rope_factor);
        /* the cache plugin stores this pass's k, v and attends over each row's sequence */
        if (!q3 || h->fwd_attention(f, l, q3, k3, v3, att3, &ap) != LMH_OK) return LMH_EINVAL;
        lmh_b_matmul(&b, o, att, L->wo, NULL);
        lmh_b_rms_norm(&b, o, o, L->post_attn_norm, m->eps, 0); /* norm after, not before */
        lmh_b_op(&b, LMH_OP_ADD, x, x, o, NULL);
        /* the MLP, normalised the same way */
        lmh_b_matmul(&b, g, x, L->wg, NULL);
        lmh_b_matmul(&b, u, x, L->wu, NULL);
        lmh_b_op(&b, LMH_OP_SWIGLU, g, g, u, NULL);
        lmh_b_matmul(&b, o, g, L->wd, NULL);
        lmh_b_rms_norm(&b, o, o, L->post_mlp_norm, m->eps, 0);
        if (!lmh_b_op(&b, LMH_OP_ADD, x, x, o, NULL)) return LMH_EINVAL;
    }
    /* Logits only for the rows the host asks for (usually each sequence's last). */
    b.layer = LMH_LAYER_OUTPUT;
    lmh_tensor *xo = lmh_b_get_rows(&b, NULL, x, bt->out_rows);
    lmh_tensor *hn = lmh_b_rms_norm(&b, NULL, xo, m->norm, m->eps, 0);
    return lmh_b_matmul(&b, bt->logits, hn, m->lm_head, NULL) ? LMH_OK : LMH_EINVAL;
}

static const lmh_arch_api api = {
    .size = sizeof(lmh_arch_api),
    .model_types = model_types,
    .load = load,
    .forward = forward,
    .unload = unload,
};

static const lmh_plugin_info info = {
    LMH_PLUGIN_HEADER,
    .kind = LMH_KIND_ARCH,
    .name = "olmo2",
    .version = "1.0.0",
    .summary = "OLMo 2: norms after attention and after the MLP, q/k norm over all heads",
    .init = NULL,
    .api = &api,
};

/* The one symbol the host looks up. */
LMH_EXPORT const lmh_plugin_info *lmhost_plugin_entry(void) {
    return &info;
}
