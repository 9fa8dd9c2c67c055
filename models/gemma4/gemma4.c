/* Gemma 4 (gemma4_text, and the text part of gemma4 checkpoints).
 *
 * The Gemma 3 block (scaled embeddings, sandwich norms, GeGLU, q/k norm, interleaved
 * sliding and global layers) with these differences:
 * - RMSNorm multiplies by w, not (1 + w); values get a weightless RMSNorm too, and
 *   attention logits are not scaled (q/k norm already fixes their size);
 * - global layers may have their own head size and K/V head count (per_layer_config, or
 *   the older global_head_dim / num_global_key_value_heads keys) and a "proportional"
 *   rope that rotates only the first partial_rotary_factor of each head's pairs;
 * - per-layer inputs: a second embedding table and a projection of the embeddings give
 *   each layer a small vector [hidden_size_per_layer_input] that gates a residual branch
 *   after the MLP;
 * - an optional MoE block beside the dense MLP: a router (weightless norm, scale, proj,
 *   softmax, top-k renormalised, times a per-expert scale) over experts with fused
 *   gate_up [E, 2I, H] and down [E, H, I] tensors (or mlx-lm's experts.switch_glu
 *   gate/up/down, the fused tensor split at I, as MLX quantized checkpoints have them),
 *   each branch with its own norms;
 * - every layer's output is multiplied by its layer_scalar;
 * - attention_k_eq_v: global layers without v_proj use the raw keys as values;
 * - num_kv_shared_layers: the last layers reuse the keys and values of the last earlier
 *   layer of their type. Here such a layer stores that layer's keys and values again in
 *   its own cache: the attention is the same, only the memory saving is lost. */
#include "lmhost/lmhost.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct layer {
    lmh_tensor *ln_in, *ln_post_attn, *ln_pre_ffn, *ln_post_ffn;
    lmh_tensor *wq, *wk, *wv, *wo, *q_norm, *k_norm;
    lmh_tensor *wg, *wu, *wd;
    /* MoE block */
    lmh_tensor *r_scale, *r_proj, *r_expert_scale, *e_gate_up, *e_down;
    lmh_tensor *e_gate, *e_up; /* MLX layout: gate and up stacked apart, [E, I, H] each */
    lmh_tensor *ln_post_ffn1, *ln_post_ffn2, *ln_pre_ffn2;
    /* per-layer input branch */
    lmh_tensor *pl_gate, *pl_proj, *ln_post_pl;
    lmh_tensor *scalar, *inv_freq;
    float rope_factor;
    int32_t heads, kv_heads, head_dim, inter, window;
    int sliding, k_eq_v;
    int32_t kv_src; /* the layer whose keys and values this one reuses; -1: its own */
    int kv_kept;    /* later layers reuse this layer's keys and values */
} layer;

struct lmh_model {
    int32_t n_layers, hidden, vocab, ple_dim, n_experts, top_k, moe_inter;
    float eps, final_softcap;
    lmh_tensor *embed, *lm_head, *norm;
    lmh_tensor *embed_pl, *pl_model_proj, *pl_proj_norm; /* per-layer inputs; NULL: none */
    layer *layers;
};

static const char *const model_types[] = {"gemma4_text", "gemma4", NULL};

static void unload(lmh_model *m) {
    if (!m) return;
    free(m->layers);
    free(m);
}

/* Config keys under the text config (`text_config.` for multimodal gemma4 checkpoints). */
typedef struct cfg {
    const lmh_host_api *h;
    lmh_load_ctx *ld;
    const char *pre;
    char buf[256];
} cfg;

static const char *key(cfg *c, const char *k) {
    snprintf(c->buf, sizeof c->buf, "%s%s", c->pre, k);
    return c->buf;
}

/* A positive integer; `def` > 0 is used when the key is absent or null, def <= 0 makes it
 * required. */
static int get_int(cfg *c, const char *k, int64_t def, int32_t *out) {
    int64_t v = def;
    int rc = c->h->cfg_int(c->ld, key(c, k), &v);
    if (rc == LMH_ETYPE) return c->h->fail(c->ld, "config.json: %s must be an integer", k);
    if (rc == LMH_ENOTFOUND && def <= 0) return c->h->fail(c->ld, "config.json: %s is missing", k);
    if (v <= 0 || v > (1 << 30))
        return c->h->fail(c->ld, "config.json: %s must be positive (got %lld)", k, (long long)v);
    *out = (int32_t)v;
    return 0;
}

/* Like get_int, but absent, null or 0 leave *out at its default. */
static int opt_int(cfg *c, const char *k, int32_t *out) {
    int64_t v = 0;
    int rc = c->h->cfg_int(c->ld, key(c, k), &v);
    if (rc == LMH_ENOTFOUND || (rc == LMH_OK && v == 0)) return 0;
    if (rc != LMH_OK) return c->h->fail(c->ld, "config.json: %s must be an integer", k);
    if (v < 0 || v > (1 << 30))
        return c->h->fail(c->ld, "config.json: %s must be positive (got %lld)", k, (long long)v);
    *out = (int32_t)v;
    return 0;
}

static int opt_bool(cfg *c, const char *k, int *out) {
    int v = 0;
    int rc = c->h->cfg_bool(c->ld, key(c, k), &v);
    if (rc == LMH_ETYPE) return c->h->fail(c->ld, "config.json: %s must be true or false", k);
    *out = rc == LMH_OK && v;
    return 0;
}

static int opt_float(cfg *c, const char *k, double def, double *out) {
    double v = def;
    int rc = c->h->cfg_float(c->ld, key(c, k), &v);
    if (rc == LMH_ETYPE) return c->h->fail(c->ld, "config.json: %s must be a number", k);
    *out = rc == LMH_OK ? v : def;
    return 0;
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

/* Layer tensor `pre`layers.l.`name` of shape ne[0..ndim-1]. */
static lmh_tensor *lw(const lmh_host_api *h, lmh_load_ctx *ld, const char *pre, int32_t l,
                      const char *name, int32_t ndim, int64_t d0, int64_t d1, int64_t d2) {
    char full[320];
    snprintf(full, sizeof full, "%slayers.%d.%s", pre, l, name);
    int64_t ne[3] = {d0, d1, d2};
    return h->weight(ld, l, full, ndim, ne);
}

/* Attention geometry of layer l: the model-wide values, then the global-layer keys of
 * older configs, then per_layer_config's entry for l. */
static int layer_geometry(cfg *c, lmh_model *m, int32_t l, int32_t heads, int32_t kv_heads,
                          int32_t head_dim) {
    layer *L = &m->layers[l];
    L->heads = heads;
    L->kv_heads = kv_heads;
    L->head_dim = head_dim;
    if (!L->sliding) {
        if (opt_int(c, "global_head_dim", &L->head_dim)) return LMH_EINVAL;
        if (L->k_eq_v && opt_int(c, "num_global_key_value_heads", &L->kv_heads)) return LMH_EINVAL;
    }
    char k[96];
    snprintf(k, sizeof k, "per_layer_config.%d.head_dim", l);
    if (opt_int(c, k, &L->head_dim)) return LMH_EINVAL;
    snprintf(k, sizeof k, "per_layer_config.%d.num_attention_heads", l);
    if (opt_int(c, k, &L->heads)) return LMH_EINVAL;
    snprintf(k, sizeof k, "per_layer_config.%d.num_key_value_heads", l);
    if (opt_int(c, k, &L->kv_heads)) return LMH_EINVAL;
    if (L->heads % L->kv_heads)
        return c->h->fail(c->ld,
                          "config.json: layer %d has %d attention heads, not a multiple "
                          "of its %d key/value heads",
                          l, L->heads, L->kv_heads);
    if (L->head_dim % 2 || L->head_dim > 1024)
        return c->h->fail(c->ld,
                          "config.json: layer %d head size %d is not supported (even, "
                          "at most 1024)",
                          l, L->head_dim);
    return 0;
}

static int load_layer(const lmh_host_api *h, lmh_load_ctx *ld, lmh_model *m, const char *pre,
                      int32_t l) {
    layer *L = &m->layers[l];
    const int64_t H = m->hidden, hd = L->head_dim, qd = (int64_t)L->heads * hd,
                  kd = (int64_t)L->kv_heads * hd;
    L->ln_in = lw(h, ld, pre, l, "input_layernorm.weight", 1, H, 0, 0);
    L->ln_post_attn = lw(h, ld, pre, l, "post_attention_layernorm.weight", 1, H, 0, 0);
    L->ln_pre_ffn = lw(h, ld, pre, l, "pre_feedforward_layernorm.weight", 1, H, 0, 0);
    L->ln_post_ffn = lw(h, ld, pre, l, "post_feedforward_layernorm.weight", 1, H, 0, 0);
    L->wq = lw(h, ld, pre, l, "self_attn.q_proj.weight", 2, qd, H, 0);
    L->q_norm = lw(h, ld, pre, l, "self_attn.q_norm.weight", 1, hd, 0, 0);
    L->wo = lw(h, ld, pre, l, "self_attn.o_proj.weight", 2, H, qd, 0);
    if (!L->ln_in || !L->ln_post_attn || !L->ln_pre_ffn || !L->ln_post_ffn || !L->wq ||
        !L->q_norm || !L->wo)
        return LMH_EINVAL;
    if (L->kv_src < 0) { /* shared layers have no key/value weights */
        L->wk = lw(h, ld, pre, l, "self_attn.k_proj.weight", 2, kd, H, 0);
        L->k_norm = lw(h, ld, pre, l, "self_attn.k_norm.weight", 1, hd, 0, 0);
        if (!L->k_eq_v) L->wv = lw(h, ld, pre, l, "self_attn.v_proj.weight", 2, kd, H, 0);
        if (!L->wk || !L->k_norm || (!L->k_eq_v && !L->wv)) return LMH_EINVAL;
    }
    L->wg = lw(h, ld, pre, l, "mlp.gate_proj.weight", 2, L->inter, H, 0);
    L->wu = lw(h, ld, pre, l, "mlp.up_proj.weight", 2, L->inter, H, 0);
    L->wd = lw(h, ld, pre, l, "mlp.down_proj.weight", 2, H, L->inter, 0);
    if (!L->wg || !L->wu || !L->wd) return LMH_EINVAL;
    if (m->n_experts) {
        const int64_t E = m->n_experts, I = m->moe_inter;
        L->r_scale = lw(h, ld, pre, l, "router.scale", 1, H, 0, 0);
        L->r_proj = lw(h, ld, pre, l, "router.proj.weight", 2, E, H, 0);
        L->r_expert_scale = lw(h, ld, pre, l, "router.per_expert_scale", 1, E, 0, 0);
        /* experts: Hugging Face's fused gate_up_proj [E, 2I, H] and down_proj [E, H, I], or
         * mlx-lm's experts.switch_glu.{gate,up,down}_proj (the fused tensor split at I),
         * quantized or not */
        char sw[320];
        lmh_weight_info swi;
        snprintf(sw, sizeof sw, "%slayers.%d.experts.switch_glu.gate_proj.weight", pre, l);
        if (h->weight_info(ld, sw, &swi) == LMH_OK) {
            L->e_gate = lw(h, ld, pre, l, "experts.switch_glu.gate_proj.weight", 3, E, I, H);
            L->e_up = lw(h, ld, pre, l, "experts.switch_glu.up_proj.weight", 3, E, I, H);
            L->e_down = lw(h, ld, pre, l, "experts.switch_glu.down_proj.weight", 3, E, H, I);
            if (!L->e_gate || !L->e_up) return LMH_EINVAL;
        } else {
            L->e_gate_up = lw(h, ld, pre, l, "experts.gate_up_proj", 3, E, 2 * I, H);
            L->e_down = lw(h, ld, pre, l, "experts.down_proj", 3, E, H, I);
            if (!L->e_gate_up) return LMH_EINVAL;
        }
        L->ln_post_ffn1 = lw(h, ld, pre, l, "post_feedforward_layernorm_1.weight", 1, H, 0, 0);
        L->ln_post_ffn2 = lw(h, ld, pre, l, "post_feedforward_layernorm_2.weight", 1, H, 0, 0);
        L->ln_pre_ffn2 = lw(h, ld, pre, l, "pre_feedforward_layernorm_2.weight", 1, H, 0, 0);
        if (!L->r_scale || !L->r_proj || !L->r_expert_scale || !L->e_down || !L->ln_post_ffn1 ||
            !L->ln_post_ffn2 || !L->ln_pre_ffn2)
            return LMH_EINVAL;
    }
    if (m->ple_dim) {
        const int64_t P = m->ple_dim;
        L->pl_gate = lw(h, ld, pre, l, "per_layer_input_gate.weight", 2, P, H, 0);
        L->pl_proj = lw(h, ld, pre, l, "per_layer_projection.weight", 2, H, P, 0);
        L->ln_post_pl = lw(h, ld, pre, l, "post_per_layer_input_norm.weight", 1, H, 0, 0);
        if (!L->pl_gate || !L->pl_proj || !L->ln_post_pl) return LMH_EINVAL;
    }
    /* a buffer of the checkpoint; a missing one means its initial value 1 */
    char name[320];
    lmh_weight_info wi;
    snprintf(name, sizeof name, "%slayers.%d.layer_scalar", pre, l);
    if (h->weight_info(ld, name, &wi) == LMH_OK) {
        int64_t one = 1;
        if (!(L->scalar = h->weight(ld, l, name, 1, &one))) return LMH_EINVAL;
    }
    /* rope table for this layer's type and head size */
    float inv[512];
    lmh_rope_info ri;
    if (h->rope_freqs(ld, L->sliding ? "sliding_attention" : "full_attention", L->head_dim, inv,
                      &ri))
        return LMH_EINVAL;
    int64_t nf = hd / 2;
    L->rope_factor = ri.attn_factor;
    if (!(L->inv_freq = h->constant(ld, l, LMH_F32, 1, &nf, inv))) return LMH_EINVAL;
    return LMH_OK;
}

static int load(const lmh_host_api *h, lmh_load_ctx *ld, lmh_model **out) {
    const char *type = "";
    h->cfg_str(ld, "model_type", &type);
    cfg c = {.h = h, .ld = ld, .pre = ""};
    int64_t dummy;
    if (strcmp(type, "gemma4") == 0 && h->cfg_len(ld, "text_config", &dummy) != LMH_ENOTFOUND)
        c.pre = "text_config.";
    lmh_model *m = calloc(1, sizeof *m);
    if (!m) return h->fail(ld, "out of memory");
    *out = m;
    int32_t heads, kv_heads, head_dim, inter;
    if (get_int(&c, "hidden_size", 0, &m->hidden) ||
        get_int(&c, "num_hidden_layers", 0, &m->n_layers) ||
        get_int(&c, "num_attention_heads", 0, &heads) ||
        get_int(&c, "num_key_value_heads", heads, &kv_heads) ||
        get_int(&c, "head_dim", m->hidden / heads, &head_dim) ||
        get_int(&c, "intermediate_size", 0, &inter) || get_int(&c, "vocab_size", 0, &m->vocab))
        return LMH_EINVAL;
    double eps = 0, cap = 0; /* set by opt_float (initialised for -O3's flow analysis) */
    if (opt_float(&c, "rms_norm_eps", 1e-6, &eps) ||
        opt_float(&c, "final_logit_softcapping", 0, &cap))
        return LMH_EINVAL;
    if (!(eps > 0) || cap < 0)
        return h->fail(ld, "config.json: rms_norm_eps must be positive and "
                           "final_logit_softcapping not negative");
    m->eps = (float)eps;
    m->final_softcap = (float)cap;
    const char *act = "gelu_pytorch_tanh";
    if (h->cfg_str(ld, key(&c, "hidden_activation"), &act) != LMH_OK)
        h->cfg_str(ld, key(&c, "hidden_act"), &act);
    if (strcmp(act, "gelu_pytorch_tanh") != 0)
        return h->fail(ld, "config.json: activation '%s' is not supported (gelu_pytorch_tanh)",
                       act);
    const char *bidir = NULL;
    if (h->cfg_str(ld, key(&c, "use_bidirectional_attention"), &bidir) == LMH_OK &&
        strcmp(bidir, "all") == 0)
        return h->fail(ld, "config.json: use_bidirectional_attention 'all' (an encoder) is not "
                           "supported; this plugin runs causal decoders");

    int k_eq_v = 0, moe = 0, double_mlp = 0, tied = 1;
    int32_t n_shared = 0, window = 0;
    if (opt_bool(&c, "attention_k_eq_v", &k_eq_v) || opt_bool(&c, "enable_moe_block", &moe) ||
        opt_bool(&c, "use_double_wide_mlp", &double_mlp) ||
        opt_int(&c, "num_kv_shared_layers", &n_shared) || opt_int(&c, "sliding_window", &window) ||
        opt_int(&c, "hidden_size_per_layer_input", &m->ple_dim))
        return LMH_EINVAL;
    if (h->cfg_bool(ld, key(&c, "tie_word_embeddings"), &tied) == LMH_ENOTFOUND &&
        h->cfg_bool(ld, "tie_word_embeddings", &tied) != LMH_OK)
        tied = 1;
    if (n_shared >= m->n_layers)
        return h->fail(ld,
                       "config.json: num_kv_shared_layers %d leaves no layer of its own "
                       "keys and values (%d layers)",
                       n_shared, m->n_layers);
    if (moe) {
        if (get_int(&c, "num_experts", 0, &m->n_experts) ||
            get_int(&c, "top_k_experts", 0, &m->top_k) ||
            get_int(&c, "moe_intermediate_size", 0, &m->moe_inter))
            return LMH_EINVAL;
        if (m->top_k > m->n_experts)
            return h->fail(ld, "config.json: top_k_experts %d exceeds the %d experts", m->top_k,
                           m->n_experts);
    }
    if (h->declare_model(ld, m->n_layers, m->vocab)) return LMH_EINVAL;
    /* (ABI 1.11) experts the host may stream from disk; the router takes lmh_batch.moe_top_k */
    if (m->n_experts > 1 && h->abi_minor >= 11 && h->declare_moe(ld, m->n_experts, m->top_k))
        return LMH_EINVAL;

    m->layers = calloc((size_t)m->n_layers, sizeof *m->layers);
    if (!m->layers) return h->fail(ld, "out of memory");
    const int32_t first_shared = m->n_layers - n_shared;
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
            L->sliding = (l + 1) % 6 != 0; /* the default: five sliding, one global */
        }
        /* like transformers: the last layer is always global */
        if (l == m->n_layers - 1) L->sliding = 0;
        L->window = L->sliding ? window : 0;
        if (L->sliding && window <= 0)
            return h->fail(ld, "config.json: sliding_window is missing for sliding layers");
        L->k_eq_v = k_eq_v && !L->sliding;
        L->kv_src = -1;
        L->inter = inter * (double_mlp && l >= first_shared ? 2 : 1);
        if (layer_geometry(&c, m, l, heads, kv_heads, head_dim)) return LMH_EINVAL;
    }
    for (int32_t l = first_shared; l < m->n_layers; l++) {
        layer *L = &m->layers[l];
        for (int32_t s = first_shared - 1; s >= 0 && L->kv_src < 0; s--)
            if (m->layers[s].sliding == L->sliding) L->kv_src = s;
        if (L->kv_src < 0)
            return h->fail(ld,
                           "config.json: layer %d shares keys and values, but no earlier "
                           "layer is of its type",
                           l);
        layer *S = &m->layers[L->kv_src];
        if (S->head_dim != L->head_dim || S->heads % S->kv_heads || L->heads % S->kv_heads)
            return h->fail(ld,
                           "config.json: layer %d cannot share the keys and values of layer "
                           "%d (head size %d against %d)",
                           l, L->kv_src, L->head_dim, S->head_dim);
        L->kv_heads = S->kv_heads;
        S->kv_kept = 1;
    }
    for (int32_t l = 0; l < m->n_layers; l++) {
        const layer *L = &m->layers[l];
        lmh_layer_state st = {.kind = LMH_STATE_KV,
                              .n_kv_heads = L->kv_heads,
                              .head_dim_k = L->head_dim,
                              .head_dim_v = L->head_dim,
                              .window = L->window};
        if (h->declare_layer(ld, l, &st)) return LMH_EINVAL;
    }

    const char *pre = weight_prefix(h, ld);
    for (int32_t l = 0; l < m->n_layers; l++)
        if (load_layer(h, ld, m, pre, l)) return LMH_EINVAL;

    const int64_t H = m->hidden;
    char name[256];
    int64_t ene[2] = {m->vocab, H};
    snprintf(name, sizeof name, "%sembed_tokens.weight", pre);
    m->embed = h->weight(ld, LMH_LAYER_INPUT, name, 2, ene);
    snprintf(name, sizeof name, "%snorm.weight", pre);
    m->norm = h->weight(ld, LMH_LAYER_OUTPUT, name, 1, &H);
    if (!m->embed || !m->norm) return LMH_EINVAL;
    m->lm_head = m->embed;
    lmh_weight_info wi;
    if (!tied || h->weight_info(ld, "lm_head.weight", &wi) == LMH_OK) {
        if (!(m->lm_head = h->weight(ld, LMH_LAYER_OUTPUT, "lm_head.weight", 2, ene)))
            return LMH_EINVAL;
    }
    if (m->ple_dim) {
        int32_t pl_vocab = m->vocab;
        if (opt_int(&c, "vocab_size_per_layer_input", &pl_vocab)) return LMH_EINVAL;
        const int64_t LP = (int64_t)m->n_layers * m->ple_dim, P = m->ple_dim;
        int64_t pne[2] = {pl_vocab, LP}, mne[2] = {LP, H};
        snprintf(name, sizeof name, "%sembed_tokens_per_layer.weight", pre);
        m->embed_pl = h->weight(ld, LMH_LAYER_INPUT, name, 2, pne);
        snprintf(name, sizeof name, "%sper_layer_model_projection.weight", pre);
        m->pl_model_proj = h->weight(ld, LMH_LAYER_INPUT, name, 2, mne);
        snprintf(name, sizeof name, "%sper_layer_projection_norm.weight", pre);
        m->pl_proj_norm = h->weight(ld, LMH_LAYER_INPUT, name, 1, &P);
        if (!m->embed_pl || !m->pl_model_proj || !m->pl_proj_norm) return LMH_EINVAL;
    }
    return LMH_OK;
}

/* ---- forward pass ------------------------------------------------------------------ */

/* The first rows*cols elements of t as [rows, cols]. */
static lmh_tensor *v2(lmh_build *b, lmh_tensor *t, int64_t rows, int64_t cols) {
    if (!t) return NULL;
    int64_t ne[2] = {rows, cols};
    return b->h->fwd_view(b->f, t, 0, 2, ne);
}

static lmh_tensor *v3(lmh_build *b, lmh_tensor *t, int64_t rows, int64_t a, int64_t c) {
    if (!t) return NULL;
    int64_t ne[3] = {rows, a, c};
    return b->h->fwd_view(b->f, t, 0, 3, ne);
}

/* Per-layer inputs [n_layers, n, P]: (norm(proj(x) / sqrt(H)) + embed_pl(ids) * sqrt(P)) /
 * sqrt(2), laid out so that each layer's rows are one contiguous view. */
static lmh_tensor *per_layer_inputs(lmh_model *m, lmh_build *b, const lmh_batch *bt,
                                    lmh_tensor *x) {
    const int64_t n = bt->n_rows, L = m->n_layers, P = m->ple_dim;
    lmh_tensor *tok = lmh_b_get_rows(b, NULL, m->embed_pl, bt->tokens);
    lmh_b_scale(b, tok, tok, sqrtf((float)P));
    lmh_tensor *proj = lmh_b_matmul(b, NULL, x, m->pl_model_proj, NULL);
    lmh_b_scale(b, proj, proj, (float)pow((double)m->hidden, -0.5));
    lmh_tensor *pr = v2(b, proj, n * L, P);
    lmh_b_rms_norm(b, pr, pr, m->pl_proj_norm, m->eps, 0);
    lmh_b_op(b, LMH_OP_ADD, proj, proj, tok, NULL);
    lmh_b_scale(b, proj, proj, (float)pow(2.0, -0.5));
    int64_t tne[3] = {L, n, P};
    lmh_tensor *out = lmh_b_new(b, 3, tne);
    return lmh_b_op(b, LMH_OP_TRANSPOSE, out, v3(b, proj, n, L, P), NULL, NULL);
}

static int forward(lmh_model *m, const lmh_host_api *h, lmh_fwd *f, const lmh_batch *bt) {
    const int64_t n = bt->n_rows, H = m->hidden;
    lmh_build b = {.h = h, .f = f, .layer = LMH_LAYER_INPUT};
    lmh_tensor *x = lmh_b_get_rows(&b, NULL, m->embed, bt->tokens);
    lmh_b_scale(&b, x, x, sqrtf((float)H));
    lmh_tensor *ple = m->ple_dim ? per_layer_inputs(m, &b, bt, x) : NULL;
    if (m->ple_dim && !ple) return LMH_EINVAL;

    /* Scratch reused by every layer (ops run in order), sized for the largest layer. */
    int64_t qd = 0, kd = 0, inter = 0;
    for (int32_t l = 0; l < m->n_layers; l++) {
        const layer *L = &m->layers[l];
        int64_t q = (int64_t)L->heads * L->head_dim, k = (int64_t)L->kv_heads * L->head_dim;
        qd = q > qd ? q : qd;
        kd = k > kd ? k : kd;
        inter = L->inter > inter ? L->inter : inter;
    }
    if (m->ple_dim > inter) inter = m->ple_dim; /* g also holds the per-layer gate */
    lmh_tensor *hn = lmh_b_new2(&b, n, H), *o = lmh_b_new2(&b, n, H), *q = lmh_b_new2(&b, n, qd),
               *k = lmh_b_new2(&b, n, kd), *v = lmh_b_new2(&b, n, kd), *att = lmh_b_new2(&b, n, qd),
               *g = lmh_b_new2(&b, n, inter), *u = lmh_b_new2(&b, n, inter);
    lmh_tensor *rl = NULL, *rw = NULL, *ri = NULL, *rs = NULL, *egu = NULL, *eact = NULL,
               *ey = NULL, *o2 = NULL, *ri1 = NULL;
    if (m->n_experts) {
        const int64_t K = m->top_k, I = m->moe_inter, ine[2] = {n, K}, nk = n * K;
        int64_t gne[3] = {n, K, 2 * I}, ane[3] = {n, K, I}, yne[3] = {n, K, H};
        rl = lmh_b_new2(&b, n, m->n_experts);
        rw = lmh_b_new(&b, 2, ine);
        rs = lmh_b_new2(&b, nk, 1);
        ri = h->fwd_tensor(f, b.layer, LMH_I32, 2, ine);
        ri1 = ri ? h->fwd_view(f, ri, 0, 1, &nk) : NULL;
        egu = lmh_b_new(&b, 3, gne);
        eact = lmh_b_new(&b, 3, ane);
        ey = lmh_b_new(&b, 3, yne);
        o2 = lmh_b_new2(&b, n, H);
    }
    lmh_tensor *kept_k[2] = {NULL, NULL}, *kept_v[2] = {NULL, NULL}; /* [global, sliding] */

    for (int32_t l = 0; l < m->n_layers; l++) {
        const layer *L = &m->layers[l];
        const int64_t hd = L->head_dim, lq = (int64_t)L->heads * hd, lk = (int64_t)L->kv_heads * hd;
        b.layer = l;
        lmh_tensor *ql = v2(&b, q, n, lq), *attl = v2(&b, att, n, lq);
        lmh_tensor *q3 = v3(&b, q, n, L->heads, hd), *att3 = v3(&b, att, n, L->heads, hd);
        lmh_b_rms_norm(&b, hn, x, L->ln_in, m->eps, 0);
        lmh_b_matmul(&b, ql, hn, L->wq, NULL);
        lmh_b_rms_norm(&b, q3, q3, L->q_norm, m->eps, 0);
        lmh_b_rope(&b, q3, bt->positions, L->inv_freq, (int32_t)hd, LMH_ROPE_HALF, L->rope_factor);
        lmh_tensor *k3, *v3t;
        if (L->kv_src >= 0) {
            k3 = kept_k[L->sliding];
            v3t = kept_v[L->sliding];
        } else {
            lmh_tensor *kl = v2(&b, k, n, lk), *vl = v2(&b, v, n, lk);
            if (L->kv_kept) { /* later layers read these: give them their own memory */
                kl = lmh_b_new2(&b, n, lk);
                vl = lmh_b_new2(&b, n, lk);
            }
            k3 = v3(&b, kl, n, L->kv_heads, hd);
            v3t = v3(&b, vl, n, L->kv_heads, hd);
            lmh_b_matmul(&b, kl, hn, L->wk, NULL);
            if (L->k_eq_v) /* values are the keys before their norm and rope */
                lmh_b_op(&b, LMH_OP_COPY, vl, kl, NULL, NULL);
            else
                lmh_b_matmul(&b, vl, hn, L->wv, NULL);
            lmh_b_rms_norm(&b, k3, k3, L->k_norm, m->eps, 0);
            lmh_b_rope(&b, k3, bt->positions, L->inv_freq, (int32_t)hd, LMH_ROPE_HALF,
                       L->rope_factor);
            lmh_b_rms_norm(&b, v3t, v3t, NULL, m->eps, 0);
            if (L->kv_kept) {
                kept_k[L->sliding] = k3;
                kept_v[L->sliding] = v3t;
            }
        }
        lmh_attn_params ap = {.scale = 1.0f, .softcap = 0, .window = L->window};
        if (!q3 || !k3 || !v3t || !att3 || h->fwd_attention(f, l, q3, k3, v3t, att3, &ap))
            return LMH_EINVAL;
        lmh_b_matmul(&b, o, attl, L->wo, NULL);
        lmh_b_rms_norm(&b, o, o, L->ln_post_attn, m->eps, 0);
        lmh_b_op(&b, LMH_OP_ADD, x, x, o, NULL);

        /* dense MLP on norm(x); x is still the residual */
        lmh_tensor *gl = v2(&b, g, n, L->inter), *ul = v2(&b, u, n, L->inter);
        lmh_b_rms_norm(&b, hn, x, L->ln_pre_ffn, m->eps, 0);
        lmh_b_matmul(&b, gl, hn, L->wg, NULL);
        lmh_b_matmul(&b, ul, hn, L->wu, NULL);
        lmh_b_op(&b, LMH_OP_GEGLU, gl, gl, ul, NULL);
        lmh_b_matmul(&b, o, gl, L->wd, NULL);
        if (L->e_gate_up || L->e_gate) {
            lmh_b_rms_norm(&b, o, o, L->ln_post_ffn1, m->eps, 0);
            /* router on the residual: norm, * scale / sqrt(H), proj */
            lmh_b_rms_norm(&b, hn, x, L->r_scale, m->eps, 0);
            lmh_b_scale(&b, hn, hn, (float)pow((double)H, -0.5));
            lmh_b_matmul_exact(&b, rl, hn, L->r_proj, NULL);
            lmh_op route = {.code = LMH_OP_MOE_ROUTE, .dst = rw, .src = {rl, ri}};
            route.p.i[0] = m->top_k;
            route.p.i[1] = 1;                                     /* renormalised top-k */
            if (h->abi_minor >= 11) route.src[2] = bt->moe_top_k; /* fewer experts a row */
            if (!rl || !rw || !ri || h->fwd_op(f, l, &route) != LMH_OK) return LMH_EINVAL;
            /* then each weight times its expert's scale */
            lmh_tensor *es = v2(&b, L->r_expert_scale, m->n_experts, 1);
            lmh_b_get_rows(&b, rs, es, ri1);
            lmh_b_op(&b, LMH_OP_MUL, rw, rw, rs, NULL);
            /* experts on their own norm of the residual */
            lmh_b_rms_norm(&b, hn, x, L->ln_pre_ffn2, m->eps, 0);
            if (L->e_gate) { /* gate and up apart: the two halves of egu's memory */
                int64_t ne3[3] = {n, m->top_k, m->moe_inter};
                lmh_tensor *eg = egu ? h->fwd_view(f, egu, 0, 3, ne3) : NULL,
                           *eu = egu ? h->fwd_view(f, egu, n * m->top_k * m->moe_inter, 3, ne3)
                                     : NULL;
                if (!eg || !eu) return LMH_EINVAL;
                lmh_b_op(&b, LMH_OP_MOE_MATMUL, eg, hn, L->e_gate, ri);
                lmh_b_op(&b, LMH_OP_MOE_MATMUL, eu, hn, L->e_up, ri);
                lmh_b_op(&b, LMH_OP_GEGLU, eact, eg, eu, NULL);
            } else {
                lmh_b_op(&b, LMH_OP_MOE_MATMUL, egu, hn, L->e_gate_up, ri);
                lmh_b_op(&b, LMH_OP_GEGLU, eact, egu, NULL, NULL);
            }
            lmh_b_op(&b, LMH_OP_MOE_MATMUL, ey, eact, L->e_down, ri);
            lmh_b_op(&b, LMH_OP_MOE_COMBINE, o2, ey, rw, NULL);
            lmh_b_rms_norm(&b, o2, o2, L->ln_post_ffn2, m->eps, 0);
            lmh_b_op(&b, LMH_OP_ADD, o, o, o2, NULL);
        }
        lmh_b_rms_norm(&b, o, o, L->ln_post_ffn, m->eps, 0);
        lmh_b_op(&b, LMH_OP_ADD, x, x, o, NULL);

        if (ple) { /* x += norm(proj(gelu(gate(x)) * per-layer input)) */
            int64_t P = m->ple_dim, pne[2] = {n, P};
            lmh_tensor *pl = h->fwd_view(f, ple, (int64_t)l * n * P, 2, pne);
            lmh_tensor *gp = v2(&b, g, n, P);
            lmh_b_matmul(&b, gp, x, L->pl_gate, NULL);
            lmh_b_op(&b, LMH_OP_GEGLU, gp, gp, pl, NULL);
            lmh_b_matmul(&b, o, gp, L->pl_proj, NULL);
            lmh_b_rms_norm(&b, o, o, L->ln_post_pl, m->eps, 0);
            lmh_b_op(&b, LMH_OP_ADD, x, x, o, NULL);
        }
        if (L->scalar) lmh_b_op(&b, LMH_OP_MUL, x, x, L->scalar, NULL);
        if (!x || !o) return LMH_EINVAL;
    }
    b.layer = LMH_LAYER_OUTPUT;
    lmh_tensor *xo = lmh_b_get_rows(&b, NULL, x, bt->out_rows);
    lmh_tensor *hf = lmh_b_rms_norm(&b, NULL, xo, m->norm, m->eps, 0);
    if (!lmh_b_matmul(&b, bt->logits, hf, m->lm_head, NULL)) return LMH_EINVAL;
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
    .name = "gemma4",
    .version = "0.1.0",
    .summary = "Gemma 4: per-layer inputs, per-layer head sizes, proportional rope, MoE block "
               "beside the dense MLP, layer scalars, K/V sharing",
    .init = NULL,
    .api = &api,
};

LMH_EXPORT const lmh_plugin_info *lmhost_plugin_entry(void) {
    return &info;
}
