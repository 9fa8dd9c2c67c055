/* Gemma 2 and Gemma 3 (gemma2, gemma3_text, and the text part of gemma3 checkpoints).
 *
 * Differences from a Llama-style block: embeddings scaled by sqrt(hidden); RMSNorm with
 * (1 + w); a norm after attention and around the MLP as well ("sandwich"); GeGLU (tanh)
 * MLP; attention scaled by query_pre_attn_scalar^-1/2; interleaved sliding-window and
 * global layers with their own rope bases (and scaling on the global ones); Gemma 2
 * soft-caps attention and final logits; Gemma 3 normalizes q and k per head. */
#include "lmhost/lmhost.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct layer {
    lmh_tensor *ln_in, *ln_post_attn, *ln_pre_ffn, *ln_post_ffn;
    lmh_tensor *wq, *wk, *wv, *wo, *q_norm, *k_norm;
    lmh_tensor *wg, *wu, *wd;
    int32_t window;
    int sliding;
} layer;

struct lmh_model {
    int32_t n_layers, hidden, heads, kv_heads, head_dim, inter, vocab;
    float eps, embed_scale, attn_scale, attn_softcap, final_softcap;
    float rope_factor[2];
    lmh_tensor *embed, *norm, *inv_freq[2]; /* [0] global layers, [1] sliding layers */
    layer *layers;
};

static const char *const model_types[] = {"gemma2", "gemma3_text", "gemma3", NULL};

static void unload(lmh_model *m) {
    if (!m) return;
    free(m->layers);
    free(m);
}

/* Reads `key` under the text config (`text_config.` for multimodal gemma3 checkpoints). */
typedef struct cfg {
    const lmh_host_api *h;
    lmh_load_ctx *ld;
    const char *pre;
} cfg;

static const char *key(const cfg *c, const char *k) {
    static char buf[256];
    snprintf(buf, sizeof buf, "%s%s", c->pre, k);
    return buf;
}

static int need_int(const cfg *c, const char *k, int64_t def, int32_t *out) {
    int64_t v = def;
    int rc = c->h->cfg_int(c->ld, key(c, k), &v);
    if (rc == LMH_ETYPE) return c->h->fail(c->ld, "config.json: %s must be an integer", k);
    if (rc == LMH_ENOTFOUND && def <= 0) return c->h->fail(c->ld, "config.json: %s is missing", k);
    if (v <= 0 || v > (1 << 30))
        return c->h->fail(c->ld, "config.json: %s must be positive (got %lld)", k, (long long)v);
    *out = (int32_t)v;
    return 0;
}

static double opt_float(const cfg *c, const char *k, double def) {
    double v = def;
    if (c->h->cfg_float(c->ld, key(c, k), &v) != LMH_OK) v = def;
    return v;
}

/* Checkpoint tensor prefix: text-only checkpoints use model., multimodal ones nest the
 * language model. */
static const char *weight_prefix(const lmh_host_api *h, lmh_load_ctx *ld) {
    static const char *const cands[] = {"model.", "model.language_model.", "language_model.model.",
                                        NULL};
    lmh_weight_info wi;
    char name[256];
    for (int i = 0; cands[i]; i++) {
        snprintf(name, sizeof name, "%sembed_tokens.weight", cands[i]);
        if (h->weight_info(ld, name, &wi) == LMH_OK) return cands[i];
    }
    return "model.";
}

static lmh_tensor *w(const lmh_host_api *h, lmh_load_ctx *ld, const char *pre, int32_t l,
                     const char *name, int64_t d0, int64_t d1) {
    char full[320];
    snprintf(full, sizeof full, "%slayers.%d.%s", pre, l, name);
    int64_t ne[2] = {d0, d1};
    return h->weight(ld, l, full, d1 ? 2 : 1, ne);
}

static int load(const lmh_host_api *h, lmh_load_ctx *ld, lmh_model **out) {
    const char *type = NULL;
    h->cfg_str(ld, "model_type", &type);
    cfg c = {h, ld, ""};
    int64_t dummy;
    if (strcmp(type, "gemma3") == 0 && h->cfg_len(ld, "text_config", &dummy) != LMH_ENOTFOUND)
        c.pre = "text_config.";
    const int gemma3 = strcmp(type, "gemma2") != 0;
    lmh_model *m = calloc(1, sizeof *m);
    if (!m) return h->fail(ld, "out of memory");
    *out = m;
    if (need_int(&c, "hidden_size", 0, &m->hidden) ||
        need_int(&c, "num_hidden_layers", 0, &m->n_layers) ||
        need_int(&c, "num_attention_heads", 0, &m->heads) ||
        need_int(&c, "num_key_value_heads", m->heads, &m->kv_heads) ||
        need_int(&c, "head_dim", m->hidden / m->heads, &m->head_dim) ||
        need_int(&c, "intermediate_size", 0, &m->inter) || need_int(&c, "vocab_size", 0, &m->vocab))
        return LMH_EINVAL;
    if (m->heads % m->kv_heads)
        return h->fail(ld,
                       "config.json: num_attention_heads %d is not a multiple of "
                       "num_key_value_heads %d",
                       m->heads, m->kv_heads);
    m->eps = (float)opt_float(&c, "rms_norm_eps", 1e-6);
    const char *act = "gelu_pytorch_tanh";
    if (h->cfg_str(ld, key(&c, "hidden_activation"), &act) != LMH_OK)
        h->cfg_str(ld, key(&c, "hidden_act"), &act);
    if (strcmp(act, "gelu_pytorch_tanh") != 0 && strcmp(act, "gelu") != 0)
        return h->fail(ld, "config.json: activation '%s' is not supported (gelu_pytorch_tanh)",
                       act);
    m->embed_scale = sqrtf((float)m->hidden);
    m->attn_scale = 1.0f / sqrtf((float)opt_float(&c, "query_pre_attn_scalar", m->head_dim));
    m->attn_softcap = (float)opt_float(&c, "attn_logit_softcapping", 0);
    m->final_softcap = (float)opt_float(&c, "final_logit_softcapping", 0);
    if (m->attn_softcap < 0 || m->final_softcap < 0)
        return h->fail(ld, "config.json: soft-capping values must not be negative");
    int64_t window = 0;
    h->cfg_int(ld, key(&c, "sliding_window"), &window);
    int64_t pattern = 6;
    if (h->cfg_int(ld, key(&c, "sliding_window_pattern"), &pattern) != LMH_OK)
        h->cfg_int(ld, key(&c, "_sliding_window_pattern"), &pattern);
    if (pattern <= 0) pattern = 6;
    if (h->declare_model(ld, m->n_layers, m->vocab)) return LMH_EINVAL;

    const char *pre = weight_prefix(h, ld);
    const int64_t H = m->hidden, qd = (int64_t)m->heads * m->head_dim,
                  kd = (int64_t)m->kv_heads * m->head_dim;
    m->layers = calloc((size_t)m->n_layers, sizeof *m->layers);
    if (!m->layers) return h->fail(ld, "out of memory");
    for (int32_t l = 0; l < m->n_layers; l++) {
        layer *L = &m->layers[l];
        char k[64];
        const char *lt = NULL;
        snprintf(k, sizeof k, "layer_types.%d", l);
        if (h->cfg_str(ld, key(&c, k), &lt) == LMH_OK) {
            if (strcmp(lt, "sliding_attention") && strcmp(lt, "full_attention"))
                return h->fail(ld, "config.json: layer_types[%d] '%s' is not an attention type", l,
                               lt);
            L->sliding = strcmp(lt, "sliding_attention") == 0;
        } else {
            /* the older keys: Gemma 2 alternates, Gemma 3 has one global layer in `pattern` */
            L->sliding = gemma3 ? (l + 1) % pattern != 0 : l % 2 == 0;
        }
        L->window = L->sliding ? (int32_t)window : 0;
        lmh_layer_state st = {.kind = LMH_STATE_KV,
                              .n_kv_heads = m->kv_heads,
                              .head_dim_k = m->head_dim,
                              .head_dim_v = m->head_dim,
                              .window = L->window};
        if (h->declare_layer(ld, l, &st)) return LMH_EINVAL;
        L->ln_in = w(h, ld, pre, l, "input_layernorm.weight", H, 0);
        L->ln_post_attn = w(h, ld, pre, l, "post_attention_layernorm.weight", H, 0);
        L->ln_pre_ffn = w(h, ld, pre, l, "pre_feedforward_layernorm.weight", H, 0);
        L->ln_post_ffn = w(h, ld, pre, l, "post_feedforward_layernorm.weight", H, 0);
        L->wq = w(h, ld, pre, l, "self_attn.q_proj.weight", qd, H);
        L->wk = w(h, ld, pre, l, "self_attn.k_proj.weight", kd, H);
        L->wv = w(h, ld, pre, l, "self_attn.v_proj.weight", kd, H);
        L->wo = w(h, ld, pre, l, "self_attn.o_proj.weight", H, qd);
        if (gemma3) {
            L->q_norm = w(h, ld, pre, l, "self_attn.q_norm.weight", m->head_dim, 0);
            L->k_norm = w(h, ld, pre, l, "self_attn.k_norm.weight", m->head_dim, 0);
        }
        L->wg = w(h, ld, pre, l, "mlp.gate_proj.weight", m->inter, H);
        L->wu = w(h, ld, pre, l, "mlp.up_proj.weight", m->inter, H);
        L->wd = w(h, ld, pre, l, "mlp.down_proj.weight", H, m->inter);
        if (!L->ln_in || !L->ln_post_attn || !L->ln_pre_ffn || !L->ln_post_ffn || !L->wq ||
            !L->wk || !L->wv || !L->wo || !L->wg || !L->wu || !L->wd ||
            (gemma3 && (!L->q_norm || !L->k_norm)))
            return LMH_EINVAL;
    }
    char name[256];
    int64_t ene[2] = {m->vocab, H};
    snprintf(name, sizeof name, "%sembed_tokens.weight", pre);
    m->embed = h->weight(ld, LMH_LAYER_INPUT, name, 2, ene);
    snprintf(name, sizeof name, "%snorm.weight", pre);
    m->norm = h->weight(ld, LMH_LAYER_OUTPUT, name, 1, &H);
    if (!m->embed || !m->norm) return LMH_EINVAL;

    /* rope tables: global layers, and sliding layers with their own base */
    float inv[1024];
    lmh_rope_info ri;
    if (m->head_dim > 2048 || m->head_dim % 2)
        return h->fail(ld, "config.json: head_dim %d is not supported", m->head_dim);
    int64_t nf = m->head_dim / 2;
    static const char *const kinds[2] = {"full_attention", "sliding_attention"};
    for (int i = 0; i < 2; i++) {
        if (h->rope_freqs(ld, kinds[i], m->head_dim, inv, &ri)) return LMH_EINVAL;
        m->inv_freq[i] = h->constant(ld, LMH_LAYER_INPUT, LMH_F32, 1, &nf, inv);
        m->rope_factor[i] = ri.attn_factor;
        if (!m->inv_freq[i]) return LMH_EINVAL;
    }
    return LMH_OK;
}

static int forward(lmh_model *m, const lmh_host_api *h, lmh_fwd *f, const lmh_batch *bt) {
    const int64_t n = bt->n_rows, H = m->hidden, hd = m->head_dim;
    const int64_t qd = (int64_t)m->heads * hd, kd = (int64_t)m->kv_heads * hd;
    lmh_build b = {.h = h, .f = f, .layer = LMH_LAYER_INPUT};
    lmh_tensor *x = lmh_b_get_rows(&b, NULL, m->embed, bt->tokens);
    lmh_b_scale(&b, x, x, m->embed_scale);
    lmh_tensor *hn = lmh_b_new2(&b, n, H), *q = lmh_b_new2(&b, n, qd), *k = lmh_b_new2(&b, n, kd),
               *v = lmh_b_new2(&b, n, kd), *att = lmh_b_new2(&b, n, qd), *o = lmh_b_new2(&b, n, H),
               *g = lmh_b_new2(&b, n, m->inter), *u = lmh_b_new2(&b, n, m->inter);
    lmh_tensor *q3 = lmh_b_heads(&b, q, m->heads, hd), *k3 = lmh_b_heads(&b, k, m->kv_heads, hd),
               *v3 = lmh_b_heads(&b, v, m->kv_heads, hd),
               *att3 = lmh_b_heads(&b, att, m->heads, hd);
    for (int32_t l = 0; l < m->n_layers; l++) {
        const layer *L = &m->layers[l];
        const int r = L->sliding;
        b.layer = l;
        lmh_b_rms_norm(&b, hn, x, L->ln_in, m->eps, 1);
        lmh_b_matmul(&b, q, hn, L->wq, NULL);
        lmh_b_matmul(&b, k, hn, L->wk, NULL);
        lmh_b_matmul(&b, v, hn, L->wv, NULL);
        /* each head norm right before its rope: a backend may run the two as one kernel */
        if (L->q_norm) lmh_b_rms_norm(&b, q3, q3, L->q_norm, m->eps, 1);
        lmh_b_rope(&b, q3, bt->positions, m->inv_freq[r], (int32_t)hd, LMH_ROPE_HALF,
                   m->rope_factor[r]);
        if (L->q_norm) lmh_b_rms_norm(&b, k3, k3, L->k_norm, m->eps, 1);
        lmh_b_rope(&b, k3, bt->positions, m->inv_freq[r], (int32_t)hd, LMH_ROPE_HALF,
                   m->rope_factor[r]);
        lmh_attn_params ap = {
            .scale = m->attn_scale, .softcap = m->attn_softcap, .window = L->window};
        if (!q3 || h->fwd_attention(f, l, q3, k3, v3, att3, &ap) != LMH_OK) return LMH_EINVAL;
        lmh_b_matmul(&b, o, att, L->wo, NULL);
        lmh_b_rms_norm(&b, o, o, L->ln_post_attn, m->eps, 1);
        lmh_b_op(&b, LMH_OP_ADD, x, x, o, NULL);
        lmh_b_rms_norm(&b, hn, x, L->ln_pre_ffn, m->eps, 1);
        lmh_b_matmul(&b, g, hn, L->wg, NULL);
        lmh_b_matmul(&b, u, hn, L->wu, NULL);
        lmh_b_op(&b, LMH_OP_GEGLU, g, g, u, NULL);
        lmh_b_matmul(&b, o, g, L->wd, NULL);
        lmh_b_rms_norm(&b, o, o, L->ln_post_ffn, m->eps, 1);
        if (!lmh_b_op(&b, LMH_OP_ADD, x, x, o, NULL)) return LMH_EINVAL;
    }
    b.layer = LMH_LAYER_OUTPUT;
    lmh_tensor *xo = lmh_b_get_rows(&b, NULL, x, bt->out_rows);
    lmh_tensor *hf = lmh_b_rms_norm(&b, NULL, xo, m->norm, m->eps, 1);
    if (!lmh_b_matmul(&b, bt->logits, hf, m->embed, NULL)) return LMH_EINVAL;
    if (m->final_softcap > 0) {
        lmh_op op = {.code = LMH_OP_SOFTCAP, .dst = bt->logits, .src = {bt->logits}};
        op.p.f[0] = m->final_softcap;
        return h->fwd_op(f, b.layer, &op);
    }
    return LMH_OK;
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
    .name = "gemma",
    .version = "0.1.0",
    .summary = "Gemma 2 and Gemma 3: scaled embeddings, (1+w) sandwich norms, GeGLU, "
               "local/global layers, soft-capping, q/k norm",
    .init = NULL,
    .api = &api,
};

LMH_EXPORT const lmh_plugin_info *lmhost_plugin_entry(void) {
    return &info;
}
