/* gpt-oss (OpenAI's open-weight mixture-of-experts models), an example of the plugin
 * development kit: it includes only the kit's headers, as an outside author's plugin does.
 *
 * The block, per layer (pre-norm, RMSNorm with weight w):
 *   attention: q/k/v/o projections with biases, rope (YaRN, computed by the host, with its
 *     attention factor), grouped K/V heads, a sliding window on the layers layer_types
 *     marks "sliding_attention", and per-head attention sinks: a learned logit per head that
 *     joins the softmax's denominator only (lmh_attn_params.sinks, ABI 1.10);
 *   MoE: router logits = x R^T + r (exact arithmetic: they choose experts), the top k,
 *     softmax over those k (= MOE_ROUTE's renormalised top-k); each expert
 *     y = down(swiglu_oai(gate_up(x) + b_gu)) + b_d, where gate_up's columns interleave
 *     gate and up and swiglu_oai is the clamped SwiGLU (LMH_OP_SWIGLU_OAI, ABI 1.10).
 * Experts are stored fused. Hugging Face's float checkpoints hold them input-major,
 * gate_up_proj [E, H, 2I] and down_proj [E, I, H]: the host's weight_transposed (ABI 1.10)
 * gives the [E, out, in] that MOE_MATMUL takes. Where weight_info reports another dtype
 * (MXFP4 blocks, already [E, out, in]), weight() loads it as it is. */
#include "lmhost/lmhost.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct layer {
    lmh_tensor *ln1, *ln2;
    lmh_tensor *wq, *wk, *wv, *wo, *bq, *bk, *bv, *bo, *sinks;
    lmh_tensor *router, *router_b;
    lmh_tensor *gate_up, *gate_up_b, *down, *down_b; /* [E, 2I, H], [E, 2I], [E, H, I], [E, H] */
    lmh_tensor *inv_freq;
    float rope_factor;
    int32_t window;
} layer;

struct lmh_model {
    int32_t n_layers, hidden, heads, kv_heads, head_dim, inter, vocab, n_experts, top_k;
    float eps, swiglu_limit;
    lmh_tensor *embed, *norm, *lm_head;
    layer *layers;
};

static const char *const model_types[] = {"gpt_oss", NULL};

/* The clamped SwiGLU's alpha: fixed in the reference, not a config key. */
#define SWIGLU_ALPHA 1.702f

static void unload(lmh_model *m) {
    if (!m) return;
    free(m->layers); /* tensors belong to the host */
    free(m);
}

/* A positive integer setting; `def` > 0 is used when absent, def <= 0 makes it required. */
static int pos_int(const lmh_host_api *h, lmh_load_ctx *ld, const char *key, int64_t def,
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

static int opt_float(const lmh_host_api *h, lmh_load_ctx *ld, const char *key, double def,
                     double *out) {
    double v = def;
    int rc = h->cfg_float(ld, key, &v);
    if (rc == LMH_ETYPE) return h->fail(ld, "config.json: %s must be a number", key);
    *out = rc == LMH_OK ? v : def;
    return 0;
}

static int opt_bool(const lmh_host_api *h, lmh_load_ctx *ld, const char *key, int def, int *out) {
    int v = def;
    int rc = h->cfg_bool(ld, key, &v);
    if (rc == LMH_ETYPE) return h->fail(ld, "config.json: %s must be true or false", key);
    *out = rc == LMH_OK ? v : def;
    return 0;
}

/* model.layers.l.`name`, of shape ne[0..ndim-1]; NULL after the host's fail(). */
static lmh_tensor *lw(const lmh_host_api *h, lmh_load_ctx *ld, int32_t l, const char *name,
                      int32_t ndim, int64_t d0, int64_t d1, int64_t d2) {
    char full[256];
    snprintf(full, sizeof full, "model.layers.%d.%s", l, name);
    int64_t ne[3] = {d0, d1, d2};
    return h->weight(ld, l, full, ndim, ne);
}

/* A fused expert tensor as [E, out, in]: float checkpoints store it [E, in, out] (loaded
 * transposed); other dtypes (MXFP4, whose blocks are stored output-major) come as they are. */
static lmh_tensor *experts(const lmh_host_api *h, lmh_load_ctx *ld, int32_t l, const char *name,
                           int64_t E, int64_t out, int64_t in) {
    char full[256];
    snprintf(full, sizeof full, "model.layers.%d.mlp.experts.%s", l, name);
    lmh_weight_info wi;
    if (h->weight_info(ld, full, &wi) != LMH_OK) {
        h->fail(ld, "missing tensor %s", full);
        return NULL;
    }
    int64_t ne[3] = {E, out, in};
    if (!lmh_dtype_is_float(wi.dtype)) /* e.g. LMH_MXFP4 (13, ABI 1.10): [E, out, in] */
        return h->weight(ld, l, full, 3, ne);
    return h->weight_transposed(ld, l, full, 3, ne);
}

static int load_layer(const lmh_host_api *h, lmh_load_ctx *ld, lmh_model *m, int32_t l, int bias) {
    layer *L = &m->layers[l];
    const int64_t H = m->hidden, qd = (int64_t)m->heads * m->head_dim,
                  kd = (int64_t)m->kv_heads * m->head_dim, E = m->n_experts, I = m->inter;
    L->ln1 = lw(h, ld, l, "input_layernorm.weight", 1, H, 0, 0);
    L->ln2 = lw(h, ld, l, "post_attention_layernorm.weight", 1, H, 0, 0);
    L->wq = lw(h, ld, l, "self_attn.q_proj.weight", 2, qd, H, 0);
    L->wk = lw(h, ld, l, "self_attn.k_proj.weight", 2, kd, H, 0);
    L->wv = lw(h, ld, l, "self_attn.v_proj.weight", 2, kd, H, 0);
    L->wo = lw(h, ld, l, "self_attn.o_proj.weight", 2, H, qd, 0);
    L->sinks = lw(h, ld, l, "self_attn.sinks", 1, m->heads, 0, 0);
    if (!L->ln1 || !L->ln2 || !L->wq || !L->wk || !L->wv || !L->wo || !L->sinks) return LMH_EINVAL;
    if (bias) {
        L->bq = lw(h, ld, l, "self_attn.q_proj.bias", 1, qd, 0, 0);
        L->bk = lw(h, ld, l, "self_attn.k_proj.bias", 1, kd, 0, 0);
        L->bv = lw(h, ld, l, "self_attn.v_proj.bias", 1, kd, 0, 0);
        L->bo = lw(h, ld, l, "self_attn.o_proj.bias", 1, H, 0, 0);
        if (!L->bq || !L->bk || !L->bv || !L->bo) return LMH_EINVAL;
    }
    L->router = lw(h, ld, l, "mlp.router.weight", 2, E, H, 0);
    L->router_b = lw(h, ld, l, "mlp.router.bias", 1, E, 0, 0);
    L->gate_up = experts(h, ld, l, "gate_up_proj", E, 2 * I, H);
    L->gate_up_b = lw(h, ld, l, "mlp.experts.gate_up_proj_bias", 2, E, 2 * I, 0);
    L->down = experts(h, ld, l, "down_proj", E, H, I);
    L->down_b = lw(h, ld, l, "mlp.experts.down_proj_bias", 2, E, H, 0);
    if (!L->router || !L->router_b || !L->gate_up || !L->gate_up_b || !L->down || !L->down_b)
        return LMH_EINVAL;

    /* rope for the layer's type (rope_parameters may be keyed by it) */
    float inv[512];
    lmh_rope_info ri;
    if (h->rope_freqs(ld, L->window ? "sliding_attention" : "full_attention", m->head_dim, inv,
                      &ri))
        return LMH_EINVAL;
    int64_t nf = m->head_dim / 2;
    L->rope_factor = ri.attn_factor;
    return (L->inv_freq = h->constant(ld, l, LMH_F32, 1, &nf, inv)) ? LMH_OK : LMH_EINVAL;
}

static int load(const lmh_host_api *h, lmh_load_ctx *ld, lmh_model **out) {
    /* weight_transposed and lmh_attn_params.sinks came with ABI 1.10 */
    if (h->abi_minor < 10 ||
        h->size < offsetof(lmh_host_api, weight_transposed) + sizeof h->weight_transposed)
        return h->fail(ld, "gpt_oss needs a host of plugin ABI 1.10 or later (this one is 1.%u)",
                       h->abi_minor);
    lmh_model *m = calloc(1, sizeof *m);
    if (!m) return h->fail(ld, "out of memory");
    *out = m;
    if (pos_int(h, ld, "hidden_size", 0, &m->hidden) ||
        pos_int(h, ld, "num_hidden_layers", 0, &m->n_layers) ||
        pos_int(h, ld, "num_attention_heads", 0, &m->heads) ||
        pos_int(h, ld, "num_key_value_heads", m->heads, &m->kv_heads) ||
        pos_int(h, ld, "head_dim", m->hidden / m->heads, &m->head_dim) ||
        pos_int(h, ld, "intermediate_size", 0, &m->inter) ||
        pos_int(h, ld, "vocab_size", 0, &m->vocab) ||
        pos_int(h, ld, "num_local_experts", 0, &m->n_experts))
        return LMH_EINVAL;
    /* num_experts_per_tok, or the original config's experts_per_token */
    int64_t k = 0;
    const char *k_key = h->cfg_int(ld, "num_experts_per_tok", &k) == LMH_ENOTFOUND
                            ? "experts_per_token"
                            : "num_experts_per_tok";
    if (pos_int(h, ld, k_key, 0, &m->top_k)) return LMH_EINVAL;
    if (m->top_k > m->n_experts)
        return h->fail(ld, "config.json: num_experts_per_tok %d exceeds the %d experts", m->top_k,
                       m->n_experts);
    if (m->heads % m->kv_heads)
        return h->fail(ld,
                       "config.json: %d attention heads are not a multiple of %d key/value heads",
                       m->heads, m->kv_heads);
    if (m->head_dim % 2 || m->head_dim > 1024)
        return h->fail(ld, "config.json: head_dim %d is not supported (even, at most 1024)",
                       m->head_dim);
    double eps = 1e-5, limit = 7.0;
    if (opt_float(h, ld, "rms_norm_eps", 1e-5, &eps) ||
        opt_float(h, ld, "swiglu_limit", 7.0, &limit))
        return LMH_EINVAL;
    if (!(eps > 0) || !(limit > 0) || !isfinite(limit))
        return h->fail(ld, "config.json: rms_norm_eps and swiglu_limit must be positive");
    m->eps = (float)eps;
    m->swiglu_limit = (float)limit;
    int bias = 1, tied = 0;
    if (opt_bool(h, ld, "attention_bias", 1, &bias) ||
        opt_bool(h, ld, "tie_word_embeddings", 0, &tied))
        return LMH_EINVAL;
    int64_t sw = 0;
    int rc = h->cfg_int(ld, "sliding_window", &sw);
    if (rc == LMH_ETYPE || sw < 0 || sw > (1 << 30))
        return h->fail(ld, "config.json: sliding_window must be a non-negative integer");

    if (h->declare_model(ld, m->n_layers, m->vocab)) return LMH_EINVAL;
    /* (ABI 1.11) experts the host may stream from disk; the router takes lmh_batch.moe_top_k */
    if (h->abi_minor >= 11 && h->declare_moe(ld, m->n_experts, m->top_k)) return LMH_EINVAL;
    m->layers = calloc((size_t)m->n_layers, sizeof *m->layers);
    if (!m->layers) return h->fail(ld, "out of memory");
    for (int32_t l = 0; l < m->n_layers; l++) {
        layer *L = &m->layers[l];
        char key[64];
        snprintf(key, sizeof key, "layer_types.%d", l);
        const char *lt = NULL;
        int sliding = l % 2 == 0; /* the family's default: sliding, full, sliding, ... */
        rc = h->cfg_str(ld, key, &lt);
        if (rc == LMH_OK) {
            if (strcmp(lt, "sliding_attention") && strcmp(lt, "full_attention"))
                return h->fail(ld, "config.json: layer_types[%d] '%s' is not an attention type", l,
                               lt);
            sliding = strcmp(lt, "sliding_attention") == 0;
        } else if (rc == LMH_ETYPE) {
            return h->fail(ld, "config.json: layer_types[%d] must be a string", l);
        }
        if (sliding && sw <= 0)
            return h->fail(ld, "config.json: layer %d slides, but sliding_window is missing", l);
        L->window = sliding ? (int32_t)sw : 0;
        lmh_layer_state st = {.kind = LMH_STATE_KV,
                              .n_kv_heads = m->kv_heads,
                              .head_dim_k = m->head_dim,
                              .head_dim_v = m->head_dim,
                              .window = L->window};
        if (h->declare_layer(ld, l, &st)) return LMH_EINVAL;
    }
    for (int32_t l = 0; l < m->n_layers; l++)
        if (load_layer(h, ld, m, l, bias)) return LMH_EINVAL;

    const int64_t H = m->hidden, ene[2] = {m->vocab, H};
    m->embed = h->weight(ld, LMH_LAYER_INPUT, "model.embed_tokens.weight", 2, ene);
    m->norm = h->weight(ld, LMH_LAYER_OUTPUT, "model.norm.weight", 1, &H);
    if (!m->embed || !m->norm) return LMH_EINVAL;
    lmh_weight_info wi;
    if (!tied || h->weight_info(ld, "lm_head.weight", &wi) == LMH_OK)
        m->lm_head = h->weight(ld, LMH_LAYER_OUTPUT, "lm_head.weight", 2, ene);
    else
        m->lm_head = m->embed;
    return m->lm_head ? LMH_OK : LMH_EINVAL;
}

/* ---- forward pass ------------------------------------------------------------------ */

static lmh_tensor *view(lmh_build *b, lmh_tensor *t, int32_t ndim, int64_t d0, int64_t d1,
                        int64_t d2) {
    if (!t) return NULL;
    int64_t ne[3] = {d0, d1, d2};
    return b->h->fwd_view(b->f, t, 0, ndim, ne);
}

static int forward(lmh_model *m, const lmh_host_api *h, lmh_fwd *f, const lmh_batch *bt) {
    const int64_t n = bt->n_rows, H = m->hidden, hd = m->head_dim, qd = m->heads * hd,
                  kd = m->kv_heads * hd, E = m->n_experts, K = m->top_k, I = m->inter, nk = n * K;
    lmh_build b = {.h = h, .f = f, .layer = LMH_LAYER_INPUT};
    lmh_tensor *x = lmh_b_get_rows(&b, NULL, m->embed, bt->tokens);

    /* scratch reused by every layer (ops run in order) */
    lmh_tensor *hn = lmh_b_new2(&b, n, H), *o = lmh_b_new2(&b, n, H), *q = lmh_b_new2(&b, n, qd),
               *k = lmh_b_new2(&b, n, kd), *v = lmh_b_new2(&b, n, kd), *att = lmh_b_new2(&b, n, qd),
               *rl = lmh_b_new2(&b, n, E), *rw = lmh_b_new2(&b, n, K),
               *gu = lmh_b_new2(&b, nk, 2 * I), *act = lmh_b_new2(&b, nk, I),
               *ey = lmh_b_new2(&b, nk, H), *eb = lmh_b_new2(&b, nk, 2 * I > H ? 2 * I : H);
    int64_t ine[2] = {n, K};
    lmh_tensor *ri = h->fwd_tensor(f, b.layer, LMH_I32, 2, ine);
    lmh_tensor *ri1 = ri ? h->fwd_view(f, ri, 0, 1, &nk) : NULL;
    lmh_tensor *gu3 = view(&b, gu, 3, n, K, 2 * I), *act3 = view(&b, act, 3, n, K, I),
               *ey3 = view(&b, ey, 3, n, K, H);
    lmh_tensor *gub = view(&b, eb, 2, nk, 2 * I, 0), *db = view(&b, eb, 2, nk, H, 0);
    lmh_tensor *sinks32 = NULL; /* the sinks as f32, where the checkpoint's are not */
    if (!x || !ri1 || !gu3 || !act3 || !ey3 || !gub || !db) return LMH_EINVAL;

    for (int32_t l = 0; l < m->n_layers; l++) {
        const layer *L = &m->layers[l];
        b.layer = l;
        lmh_tensor *q3 = lmh_b_heads(&b, q, m->heads, hd),
                   *k3 = lmh_b_heads(&b, k, m->kv_heads, hd),
                   *v3 = lmh_b_heads(&b, v, m->kv_heads, hd),
                   *att3 = lmh_b_heads(&b, att, m->heads, hd);
        lmh_b_rms_norm(&b, hn, x, L->ln1, m->eps, 0);
        lmh_b_matmul(&b, q, hn, L->wq, L->bq);
        lmh_b_matmul(&b, k, hn, L->wk, L->bk);
        lmh_b_matmul(&b, v, hn, L->wv, L->bv);
        lmh_b_rope(&b, q3, bt->positions, L->inv_freq, (int32_t)hd, LMH_ROPE_HALF, L->rope_factor);
        lmh_b_rope(&b, k3, bt->positions, L->inv_freq, (int32_t)hd, LMH_ROPE_HALF, L->rope_factor);
        lmh_tensor *sinks = L->sinks;
        if (sinks->dtype != LMH_F32) { /* attention takes f32 sinks */
            int64_t nh = m->heads;
            sinks32 = h->fwd_tensor(f, l, LMH_F32, 1, &nh);
            sinks = lmh_b_op(&b, LMH_OP_COPY, sinks32, L->sinks, NULL, NULL);
        }
        lmh_attn_params ap = {
            .scale = 1.0f / sqrtf((float)hd), .softcap = 0, .window = L->window, .sinks = sinks};
        if (!q3 || !k3 || !v3 || !att3 || !sinks ||
            h->fwd_attention(f, l, q3, k3, v3, att3, &ap) != LMH_OK)
            return LMH_EINVAL;
        lmh_b_matmul(&b, o, att, L->wo, L->bo);
        lmh_b_op(&b, LMH_OP_ADD, x, x, o, NULL);

        /* experts: route on the exact router logits, top k renormalised = softmax over k */
        lmh_b_rms_norm(&b, hn, x, L->ln2, m->eps, 0);
        lmh_b_matmul_exact(&b, rl, hn, L->router, L->router_b);
        lmh_op route = {.code = LMH_OP_MOE_ROUTE, .dst = rw, .src = {rl, ri}};
        route.p.i[0] = (int32_t)K;
        route.p.i[1] = 1;
        if (h->abi_minor >= 11) route.src[2] = bt->moe_top_k; /* fewer experts a row */
        if (!rl || !rw || h->fwd_op(f, l, &route) != LMH_OK) return LMH_EINVAL;
        lmh_b_op(&b, LMH_OP_MOE_MATMUL, gu3, hn, L->gate_up, ri);
        lmh_b_get_rows(&b, gub, L->gate_up_b, ri1);
        lmh_b_op(&b, LMH_OP_ADD, gu, gu, gub, NULL);
        lmh_op sw = {.code = LMH_OP_SWIGLU_OAI, .dst = act, .src = {gu}};
        sw.p.f[0] = SWIGLU_ALPHA;
        sw.p.f[1] = m->swiglu_limit;
        if (h->fwd_op(f, l, &sw) != LMH_OK) return LMH_EINVAL;
        lmh_b_op(&b, LMH_OP_MOE_MATMUL, ey3, act3, L->down, ri);
        lmh_b_get_rows(&b, db, L->down_b, ri1);
        lmh_b_op(&b, LMH_OP_ADD, ey, ey, db, NULL);
        lmh_b_op(&b, LMH_OP_MOE_COMBINE, o, ey3, rw, NULL);
        if (!lmh_b_op(&b, LMH_OP_ADD, x, x, o, NULL)) return LMH_EINVAL;
    }
    b.layer = LMH_LAYER_OUTPUT;
    lmh_tensor *xo = lmh_b_get_rows(&b, NULL, x, bt->out_rows);
    lmh_tensor *hf = lmh_b_rms_norm(&b, NULL, xo, m->norm, m->eps, 0);
    return lmh_b_matmul(&b, bt->logits, hf, m->lm_head, NULL) ? LMH_OK : LMH_EINVAL;
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
    .name = "gpt_oss",
    .version = "0.1.0",
    .summary = "gpt-oss: attention sinks, q/k/v/o biases, alternating sliding window, YaRN, "
               "MoE with a biased router and fused interleaved experts, clamped SwiGLU",
    .init = NULL,
    .api = &api,
};

LMH_EXPORT const lmh_plugin_info *lmhost_plugin_entry(void) {
    return &info;
}
