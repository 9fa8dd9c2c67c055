/* Llama-style decoders: llama, mistral, qwen2, qwen3, and their mixture-of-experts
 * variants mixtral and qwen3_moe.
 *
 * One block serves them all; they differ only in details read from config.json:
 *   llama      optional attention/MLP biases, llama3 rope scaling, tied embeddings
 *   mistral    sliding-window attention
 *   qwen2      q/k/v biases, optional sliding window on upper layers
 *   qwen3      RMSNorm on q and k per head
 *   mixtral    mistral attention; the MLP is top-k of E experts (renormalised)
 *   qwen3_moe  qwen3 attention; experts on every decoder_sparse_step-th layer not in
 *              mlp_only_layers, top-k renormalised when norm_topk_prob
 *   qwen2_moe  qwen2 attention; experts as qwen3_moe plus a shared expert whose output is
 *              scaled by sigmoid(shared_expert_gate(x))
 * x = embed(tokens); per layer: x += o(attn(rope(q), rope(k), v)); x += mlp(x), where mlp
 * is down(silu(gate) * up) or the routed sum of such experts; logits = lm_head(norm(x)).
 * Experts load from per-expert tensors (Hugging Face) or stacked switch_mlp tensors (MLX). */
#include "lmhost/lmhost.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct layer {
    lmh_tensor *ln1, *ln2;
    lmh_tensor *wq, *wk, *wv, *wo, *bq, *bk, *bv, *bo;
    lmh_tensor *q_norm, *k_norm;
    lmh_tensor *wg, *wu, *wd, *bg, *bu, *bd;
    lmh_tensor *router, *eg, *eu, *ed; /* experts: router [E, H], stacked [E, out, in] */
    lmh_tensor *sg, *su, *sd, *sgate;  /* shared expert and its gate [1, H] */
    int32_t window;
} layer;

struct lmh_model {
    int32_t n_layers, hidden, heads, kv_heads, head_dim, inter, vocab;
    int32_t n_experts, top_k, moe_inter, renorm, shared_inter;
    float eps;
    lmh_tensor *embed, *norm, *lm_head, *inv_freq;
    float rope_factor;
    layer *layers;
};

static const char *const model_types[] = {"llama",   "mistral",   "qwen2",     "qwen3",
                                          "mixtral", "qwen3_moe", "qwen2_moe", NULL};

static void unload(lmh_model *m) {
    if (!m) return;
    free(m->layers); /* tensors belong to the host */
    free(m);
}

/* An integer setting that must be positive; `def` > 0 is used when absent. */
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

static int cfg_flag(const lmh_host_api *h, lmh_load_ctx *ld, const char *key, int def) {
    int v = def;
    h->cfg_bool(ld, key, &v);
    return v;
}

/* Sliding window of layer l: layer_types when given, else the family's rule. */
static int layer_window(const lmh_host_api *h, lmh_load_ctx *ld, const char *type, int32_t l,
                        int32_t n_layers, int32_t *out) {
    int64_t sw = 0;
    int rc = h->cfg_int(ld, "sliding_window", &sw);
    if (rc == LMH_ETYPE) return h->fail(ld, "config.json: sliding_window must be an integer");
    if (sw < 0) return h->fail(ld, "config.json: sliding_window must not be negative");
    char key[64];
    snprintf(key, sizeof key, "layer_types.%d", l);
    const char *lt = NULL;
    *out = 0;
    if (h->cfg_str(ld, key, &lt) == LMH_OK) {
        if (strcmp(lt, "sliding_attention") == 0)
            *out = (int32_t)sw;
        else if (strcmp(lt, "full_attention") != 0)
            return h->fail(ld,
                           "config.json: layer_types[%d] is '%s'; this family has only "
                           "full_attention and sliding_attention layers",
                           l, lt);
        return 0;
    }
    if (strcmp(type, "mistral") == 0 || strcmp(type, "mixtral") == 0) {
        *out = (int32_t)sw;
    } else if (strncmp(type, "qwen", 4) == 0 && cfg_flag(h, ld, "use_sliding_window", 0)) {
        int64_t mwl = n_layers;
        h->cfg_int(ld, "max_window_layers", &mwl);
        if (l >= mwl) *out = (int32_t)sw;
    }
    return 0;
}

static lmh_tensor *w(const lmh_host_api *h, lmh_load_ctx *ld, int32_t l, const char *fmt,
                     int64_t d0, int64_t d1) {
    char name[256];
    snprintf(name, sizeof name, fmt, l);
    int64_t ne[2] = {d0, d1};
    return h->weight(ld, l, name, d1 ? 2 : 1, ne);
}

/* A tensor the checkpoint may or may not have (biases when the config does not say). */
static lmh_tensor *w_opt(const lmh_host_api *h, lmh_load_ctx *ld, int32_t l, const char *fmt,
                         int64_t d0, int want) {
    char name[256];
    snprintf(name, sizeof name, fmt, l);
    lmh_weight_info wi;
    if (!want && h->weight_info(ld, name, &wi) != LMH_OK) return NULL;
    return h->weight(ld, l, name, 1, &d0);
}

/* Whether layer l has experts (qwen3_moe: every decoder_sparse_step-th layer that
 * mlp_only_layers does not name; mixtral: all). */
static int moe_layer(const lmh_host_api *h, lmh_load_ctx *ld, const lmh_model *m, int32_t l) {
    if (m->n_experts == 0) return 0;
    int64_t step = 1, n = 0;
    h->cfg_int(ld, "decoder_sparse_step", &step);
    if (h->cfg_len(ld, "mlp_only_layers", &n) == LMH_OK)
        for (int64_t i = 0; i < n; i++) {
            char k[64];
            int64_t v;
            snprintf(k, sizeof k, "mlp_only_layers.%lld", (long long)i);
            if (h->cfg_int(ld, k, &v) == LMH_OK && v == l) return 0;
        }
    return step <= 1 || (l + 1) % step == 0;
}

/* One stacked expert matrix: the MLX layout when present, else the per-expert tensors. */
static lmh_tensor *experts(const lmh_host_api *h, lmh_load_ctx *ld, const lmh_model *m, int32_t l,
                           const char *stacked, const char *each, int64_t d0, int64_t d1) {
    char name[256];
    snprintf(name, sizeof name, stacked, l);
    lmh_weight_info wi;
    if (h->weight_info(ld, name, &wi) == LMH_OK) {
        int64_t ne[3] = {m->n_experts, d0, d1};
        return h->weight(ld, l, name, 3, ne);
    }
    snprintf(name, sizeof name, each, l);
    int64_t ne[2] = {d0, d1};
    return h->weight_stack(ld, l, name, m->n_experts, 2, ne);
}

/* Llama 3.1's rope scaling: long wavelengths slowed by `factor`, short ones kept, a smooth
 * blend between the two bands. */
static int llama3_freqs(const lmh_host_api *h, lmh_load_ctx *ld, int32_t rot, float *inv) {
    double theta = 0, factor = 0, lo = 1, hi = 4, orig = 0;
    if (h->rope_setting(ld, NULL, "rope_theta", &theta) != LMH_OK ||
        h->rope_setting(ld, NULL, "factor", &factor) != LMH_OK ||
        h->rope_setting(ld, NULL, "low_freq_factor", &lo) == LMH_ETYPE ||
        h->rope_setting(ld, NULL, "high_freq_factor", &hi) == LMH_ETYPE ||
        h->rope_setting(ld, NULL, "original_max_position_embeddings", &orig) != LMH_OK ||
        !(theta > 0) || !(factor > 0) || !(orig > 0) || !(hi > lo))
        return h->fail(ld, "config.json: llama3 rope scaling needs rope_theta, factor and "
                           "original_max_position_embeddings > 0 and high_freq_factor > "
                           "low_freq_factor");
    const double lo_wave = orig / lo, hi_wave = orig / hi;
    for (int32_t i = 0; i < rot / 2; i++) {
        double f = 1.0 / pow(theta, (double)(2 * i) / (double)rot);
        double wave = 2.0 * M_PI / f;
        if (wave > lo_wave) {
            f /= factor;
        } else if (wave >= hi_wave) {
            double s = (orig / wave - lo) / (hi - lo);
            f = (1.0 - s) * f / factor + s * f;
        }
        inv[i] = (float)f;
    }
    return 0;
}

static int load(const lmh_host_api *h, lmh_load_ctx *ld, lmh_model **out) {
    const char *type = NULL;
    h->cfg_str(ld, "model_type", &type);
    lmh_model *m = calloc(1, sizeof *m);
    if (!m) return h->fail(ld, "out of memory");
    *out = m;
    if (pos_int(h, ld, "hidden_size", 0, &m->hidden) ||
        pos_int(h, ld, "num_hidden_layers", 0, &m->n_layers) ||
        pos_int(h, ld, "num_attention_heads", 0, &m->heads) ||
        pos_int(h, ld, "num_key_value_heads", m->heads, &m->kv_heads) ||
        pos_int(h, ld, "head_dim", m->hidden / m->heads, &m->head_dim) ||
        pos_int(h, ld, "intermediate_size", 0, &m->inter) ||
        pos_int(h, ld, "vocab_size", 0, &m->vocab))
        return LMH_EINVAL;
    if (m->heads % m->kv_heads)
        return h->fail(ld,
                       "config.json: num_attention_heads %d is not a multiple of "
                       "num_key_value_heads %d",
                       m->heads, m->kv_heads);
    double eps = 1e-6;
    if (h->cfg_float(ld, "rms_norm_eps", &eps) == LMH_ETYPE || !(eps > 0))
        return h->fail(ld, "config.json: rms_norm_eps must be a positive number");
    m->eps = (float)eps;
    const char *act = "silu";
    if (h->cfg_str(ld, "hidden_act", &act) == LMH_ETYPE || strcmp(act, "silu") != 0)
        return h->fail(ld, "config.json: hidden_act '%s' is not supported (this family uses silu)",
                       act);
    const int mixtral = strcmp(type, "mixtral") == 0, qwen3_moe = strcmp(type, "qwen3_moe") == 0,
              qwen2_moe = strcmp(type, "qwen2_moe") == 0, qwen_moe = qwen3_moe || qwen2_moe;
    if (mixtral || qwen_moe) {
        if (pos_int(h, ld,
                    h->cfg_int(ld, "num_experts", &(int64_t){0}) == LMH_OK ? "num_experts"
                                                                           : "num_local_experts",
                    0, &m->n_experts) ||
            pos_int(h, ld, "num_experts_per_tok", 0, &m->top_k))
            return LMH_EINVAL;
        if (m->top_k > m->n_experts)
            return h->fail(ld, "config.json: num_experts_per_tok %d exceeds the %d experts",
                           m->top_k, m->n_experts);
        m->moe_inter = m->inter;
        if (qwen_moe && pos_int(h, ld, "moe_intermediate_size", 0, &m->moe_inter))
            return LMH_EINVAL;
        m->renorm = mixtral || cfg_flag(h, ld, "norm_topk_prob", 0);
        if (qwen2_moe && pos_int(h, ld, "shared_expert_intermediate_size", 0, &m->shared_inter))
            return LMH_EINVAL;
    }
    if (h->declare_model(ld, m->n_layers, m->vocab)) return LMH_EINVAL;
    /* (ABI 1.11) experts the host may stream from disk; the router takes lmh_batch.moe_top_k */
    if (m->n_experts > 1 && h->abi_minor >= 11 && h->declare_moe(ld, m->n_experts, m->top_k))
        return LMH_EINVAL;

    const int qwen2 = strcmp(type, "qwen2") == 0 || qwen2_moe,
              qwen3 = strcmp(type, "qwen3") == 0 || qwen3_moe;
    const int attn_bias = cfg_flag(h, ld, "attention_bias", 0);
    const int mlp_bias = cfg_flag(h, ld, "mlp_bias", 0);
    const int64_t H = m->hidden, qd = (int64_t)m->heads * m->head_dim,
                  kd = (int64_t)m->kv_heads * m->head_dim;

    m->layers = calloc((size_t)m->n_layers, sizeof *m->layers);
    if (!m->layers) return h->fail(ld, "out of memory");
    for (int32_t l = 0; l < m->n_layers; l++) {
        layer *L = &m->layers[l];
        if (layer_window(h, ld, type, l, m->n_layers, &L->window)) return LMH_EINVAL;
        lmh_layer_state st = {.kind = LMH_STATE_KV,
                              .n_kv_heads = m->kv_heads,
                              .head_dim_k = m->head_dim,
                              .head_dim_v = m->head_dim,
                              .window = L->window};
        if (h->declare_layer(ld, l, &st)) return LMH_EINVAL;
        L->ln1 = w(h, ld, l, "model.layers.%d.input_layernorm.weight", H, 0);
        L->ln2 = w(h, ld, l, "model.layers.%d.post_attention_layernorm.weight", H, 0);
        L->wq = w(h, ld, l, "model.layers.%d.self_attn.q_proj.weight", qd, H);
        L->wk = w(h, ld, l, "model.layers.%d.self_attn.k_proj.weight", kd, H);
        L->wv = w(h, ld, l, "model.layers.%d.self_attn.v_proj.weight", kd, H);
        L->wo = w(h, ld, l, "model.layers.%d.self_attn.o_proj.weight", H, qd);
        /* Qwen2 always has q/k/v biases; Llama only when attention_bias says so. */
        const int qkv_bias = qwen2 || attn_bias;
        L->bq = w_opt(h, ld, l, "model.layers.%d.self_attn.q_proj.bias", qd, qkv_bias);
        L->bk = w_opt(h, ld, l, "model.layers.%d.self_attn.k_proj.bias", kd, qkv_bias);
        L->bv = w_opt(h, ld, l, "model.layers.%d.self_attn.v_proj.bias", kd, qkv_bias);
        if (attn_bias && !qwen2)
            L->bo = w_opt(h, ld, l, "model.layers.%d.self_attn.o_proj.bias", H, 1);
        if (qwen3) {
            L->q_norm = w(h, ld, l, "model.layers.%d.self_attn.q_norm.weight", m->head_dim, 0);
            L->k_norm = w(h, ld, l, "model.layers.%d.self_attn.k_norm.weight", m->head_dim, 0);
        }
        if (moe_layer(h, ld, m, l)) {
            const int64_t I = m->moe_inter, E = m->n_experts;
            if (mixtral) {
                L->router = w(h, ld, l, "model.layers.%d.block_sparse_moe.gate.weight", E, H);
                L->eg = experts(h, ld, m, l,
                                "model.layers.%d.block_sparse_moe.switch_mlp.gate_proj.weight",
                                "model.layers.%d.block_sparse_moe.experts.%%d.w1.weight", I, H);
                L->eu = experts(h, ld, m, l,
                                "model.layers.%d.block_sparse_moe.switch_mlp.up_proj.weight",
                                "model.layers.%d.block_sparse_moe.experts.%%d.w3.weight", I, H);
                L->ed = experts(h, ld, m, l,
                                "model.layers.%d.block_sparse_moe.switch_mlp.down_proj.weight",
                                "model.layers.%d.block_sparse_moe.experts.%%d.w2.weight", H, I);
            } else {
                L->router = w(h, ld, l, "model.layers.%d.mlp.gate.weight", E, H);
                L->eg = experts(h, ld, m, l, "model.layers.%d.mlp.switch_mlp.gate_proj.weight",
                                "model.layers.%d.mlp.experts.%%d.gate_proj.weight", I, H);
                L->eu = experts(h, ld, m, l, "model.layers.%d.mlp.switch_mlp.up_proj.weight",
                                "model.layers.%d.mlp.experts.%%d.up_proj.weight", I, H);
                L->ed = experts(h, ld, m, l, "model.layers.%d.mlp.switch_mlp.down_proj.weight",
                                "model.layers.%d.mlp.experts.%%d.down_proj.weight", H, I);
            }
            if (m->shared_inter) {
                const int64_t S = m->shared_inter;
                L->sg = w(h, ld, l, "model.layers.%d.mlp.shared_expert.gate_proj.weight", S, H);
                L->su = w(h, ld, l, "model.layers.%d.mlp.shared_expert.up_proj.weight", S, H);
                L->sd = w(h, ld, l, "model.layers.%d.mlp.shared_expert.down_proj.weight", H, S);
                L->sgate = w(h, ld, l, "model.layers.%d.mlp.shared_expert_gate.weight", 1, H);
                if (!L->sg || !L->su || !L->sd || !L->sgate) return LMH_EINVAL;
            }
            if (!L->router || !L->eg || !L->eu || !L->ed) return LMH_EINVAL;
        } else {
            L->wg = w(h, ld, l, "model.layers.%d.mlp.gate_proj.weight", m->inter, H);
            L->wu = w(h, ld, l, "model.layers.%d.mlp.up_proj.weight", m->inter, H);
            L->wd = w(h, ld, l, "model.layers.%d.mlp.down_proj.weight", H, m->inter);
            if (!L->wg || !L->wu || !L->wd) return LMH_EINVAL;
        }
        if (mlp_bias) {
            L->bg = w_opt(h, ld, l, "model.layers.%d.mlp.gate_proj.bias", m->inter, 1);
            L->bu = w_opt(h, ld, l, "model.layers.%d.mlp.up_proj.bias", m->inter, 1);
            L->bd = w_opt(h, ld, l, "model.layers.%d.mlp.down_proj.bias", H, 1);
        }
        if (!L->ln1 || !L->ln2 || !L->wq || !L->wk || !L->wv || !L->wo ||
            (qkv_bias && (!L->bq || !L->bk || !L->bv)) || (qwen3 && (!L->q_norm || !L->k_norm)))
            return LMH_EINVAL; /* the host has the message */
    }
    int64_t ene[2] = {m->vocab, H};
    m->embed = h->weight(ld, LMH_LAYER_INPUT, "model.embed_tokens.weight", 2, ene);
    m->norm = h->weight(ld, LMH_LAYER_OUTPUT, "model.norm.weight", 1, &H);
    if (!m->embed || !m->norm) return LMH_EINVAL;
    /* Tied unless the config says otherwise and the checkpoint has its own head. */
    lmh_weight_info wi;
    int tie = cfg_flag(h, ld, "tie_word_embeddings", 0);
    if (!tie && h->weight_info(ld, "lm_head.weight", &wi) == LMH_OK)
        m->lm_head = h->weight(ld, LMH_LAYER_OUTPUT, "lm_head.weight", 2, ene);
    else if (!tie && h->weight_info(ld, "lm_head.weight", &wi) != LMH_OK)
        return h->fail(ld, "missing tensor lm_head.weight (tie_word_embeddings is false)");
    else
        m->lm_head = m->embed; /* one table serves both ends */
    if (!m->lm_head) return LMH_EINVAL;

    float inv[1024];
    lmh_rope_info ri = {.attn_factor = 1.0f, .n_pairs = m->head_dim / 2};
    if (m->head_dim > 2048 || m->head_dim % 2)
        return h->fail(ld, "config.json: head_dim %d is not supported", m->head_dim);
    const char *rt = "default";
    h->rope_type(ld, NULL, &rt);
    if (strcmp(rt, "llama3") == 0) {
        if (llama3_freqs(h, ld, m->head_dim, inv)) return LMH_EINVAL;
    } else if (h->rope_freqs(ld, NULL, m->head_dim, inv, &ri)) {
        return LMH_EINVAL;
    }
    int64_t nf = m->head_dim / 2;
    m->inv_freq = h->constant(ld, LMH_LAYER_INPUT, LMH_F32, 1, &nf, inv);
    m->rope_factor = ri.attn_factor;
    return m->inv_freq ? LMH_OK : LMH_EINVAL;
}

static int forward(lmh_model *m, const lmh_host_api *h, lmh_fwd *f, const lmh_batch *bt) {
    const int64_t n = bt->n_rows, H = m->hidden, hd = m->head_dim;
    const int64_t qd = (int64_t)m->heads * hd, kd = (int64_t)m->kv_heads * hd;
    lmh_build b = {.h = h, .f = f, .layer = LMH_LAYER_INPUT};
    lmh_tensor *x = lmh_b_get_rows(&b, NULL, m->embed, bt->tokens);
    /* Scratch reused by every layer: ops run in order on one queue. */
    lmh_tensor *hn = lmh_b_new2(&b, n, H), *q = lmh_b_new2(&b, n, qd), *k = lmh_b_new2(&b, n, kd),
               *v = lmh_b_new2(&b, n, kd), *att = lmh_b_new2(&b, n, qd), *o = lmh_b_new2(&b, n, H),
               *g = lmh_b_new2(&b, n, m->inter), *u = lmh_b_new2(&b, n, m->inter);
    /* expert scratch: routing [n, k], expert activations [n, k, moe_inter / hidden] */
    lmh_tensor *rl = NULL, *rw = NULL, *ri = NULL, *eg = NULL, *eu = NULL, *ey = NULL;
    lmh_tensor *sg = NULL, *su = NULL, *sd = NULL, *sgl = NULL;
    if (m->shared_inter) {
        sg = lmh_b_new2(&b, n, m->shared_inter);
        su = lmh_b_new2(&b, n, m->shared_inter);
        sd = lmh_b_new2(&b, n, H);
        sgl = lmh_b_new2(&b, n, 1);
    }
    if (m->n_experts) {
        int64_t k = m->top_k, ine[2] = {n, k}, gne[3] = {n, k, m->moe_inter}, yne[3] = {n, k, H};
        rl = lmh_b_new2(&b, n, m->n_experts);
        rw = lmh_b_new(&b, 2, ine);
        ri = h->fwd_tensor(f, b.layer, LMH_I32, 2, ine);
        eg = lmh_b_new(&b, 3, gne);
        eu = lmh_b_new(&b, 3, gne);
        ey = lmh_b_new(&b, 3, yne);
    }
    lmh_tensor *q3 = lmh_b_heads(&b, q, m->heads, hd), *k3 = lmh_b_heads(&b, k, m->kv_heads, hd),
               *v3 = lmh_b_heads(&b, v, m->kv_heads, hd),
               *att3 = lmh_b_heads(&b, att, m->heads, hd);
    const float scale = 1.0f / sqrtf((float)hd);
    for (int32_t l = 0; l < m->n_layers; l++) {
        const layer *L = &m->layers[l];
        b.layer = l;
        lmh_b_rms_norm(&b, hn, x, L->ln1, m->eps, 0);
        lmh_b_matmul(&b, q, hn, L->wq, L->bq);
        lmh_b_matmul(&b, k, hn, L->wk, L->bk);
        lmh_b_matmul(&b, v, hn, L->wv, L->bv);
        /* each head norm right before its rope: a backend may run the two as one kernel */
        if (L->q_norm) lmh_b_rms_norm(&b, q3, q3, L->q_norm, m->eps, 0);
        lmh_b_rope(&b, q3, bt->positions, m->inv_freq, (int32_t)hd, LMH_ROPE_HALF, m->rope_factor);
        if (L->q_norm) lmh_b_rms_norm(&b, k3, k3, L->k_norm, m->eps, 0);
        lmh_b_rope(&b, k3, bt->positions, m->inv_freq, (int32_t)hd, LMH_ROPE_HALF, m->rope_factor);
        lmh_attn_params ap = {.scale = scale, .softcap = 0, .window = L->window};
        if (!q3 || h->fwd_attention(f, l, q3, k3, v3, att3, &ap) != LMH_OK) return LMH_EINVAL;
        lmh_b_matmul(&b, o, att, L->wo, L->bo);
        lmh_b_op(&b, LMH_OP_ADD, x, x, o, NULL);
        lmh_b_rms_norm(&b, hn, x, L->ln2, m->eps, 0);
        if (L->router) {
            lmh_b_matmul_exact(&b, rl, hn, L->router, NULL);
            lmh_op route = {.code = LMH_OP_MOE_ROUTE, .dst = rw, .src = {rl, ri}};
            route.p.i[0] = m->top_k;
            route.p.i[1] = m->renorm;
            if (h->abi_minor >= 11) route.src[2] = bt->moe_top_k; /* fewer experts a row */
            if (!rl || !rw || !ri || h->fwd_op(f, l, &route) != LMH_OK) return LMH_EINVAL;
            lmh_b_op(&b, LMH_OP_MOE_MATMUL, eg, hn, L->eg, ri);
            lmh_b_op(&b, LMH_OP_MOE_MATMUL, eu, hn, L->eu, ri);
            lmh_b_op(&b, LMH_OP_SWIGLU, eg, eg, eu, NULL);
            lmh_b_op(&b, LMH_OP_MOE_MATMUL, ey, eg, L->ed, ri);
            lmh_b_op(&b, LMH_OP_MOE_COMBINE, o, ey, rw, NULL);
            if (L->sg) { /* the shared expert, gated per row */
                lmh_b_matmul(&b, sg, hn, L->sg, NULL);
                lmh_b_matmul(&b, su, hn, L->su, NULL);
                lmh_b_op(&b, LMH_OP_SWIGLU, sg, sg, su, NULL);
                lmh_b_matmul(&b, sd, sg, L->sd, NULL);
                lmh_b_matmul(&b, sgl, hn, L->sgate, NULL);
                lmh_b_op(&b, LMH_OP_SIGMOID_GATE, sd, sd, sgl, NULL);
                lmh_b_op(&b, LMH_OP_ADD, o, o, sd, NULL);
            }
        } else {
            lmh_b_matmul(&b, g, hn, L->wg, L->bg);
            lmh_b_matmul(&b, u, hn, L->wu, L->bu);
            lmh_b_op(&b, LMH_OP_SWIGLU, g, g, u, NULL);
            lmh_b_matmul(&b, o, g, L->wd, L->bd);
        }
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
    .name = "llama",
    .version = "0.1.0",
    .summary = "Llama-style decoders: llama (llama3 rope), mistral (sliding window), qwen2 "
               "(q/k/v bias), qwen3 (q/k norm), mixtral, qwen3_moe and qwen2_moe (routed "
               "experts)",
    .init = NULL,
    .api = &api,
};

LMH_EXPORT const lmh_plugin_info *lmhost_plugin_entry(void) {
    return &info;
}
