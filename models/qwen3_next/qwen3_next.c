/* Qwen3-Next and Qwen3.5: hybrid decoders of Gated DeltaNet (linear attention) layers and
 * gated full attention layers, model_types qwen3_next, qwen3_5_text, qwen3_5_moe_text, and
 * qwen3_5 and qwen3_5_moe (their language model: settings under text_config, weights under
 * model.language_model. or language_model.model.).
 *
 * x = embed(tokens); per layer: x += mixer(norm(x)); x += mlp(norm(x));
 * logits = lm_head(norm(x)). How they differ from the Llama-style decoders:
 *   - layer_types (or every full_attention_interval-th layer) picks the mixer: Gated
 *     DeltaNet (common/mixers.h: a convolution window and a [Hv, dk, dv] state per
 *     sequence, no keys and values) or attention;
 *   - every RMSNorm scales by (1 + w) (weights centred on 0), except the DeltaNet's output
 *     norm (plain w); MLX conversions store 1 + w already (spotted by their [C, K, 1]
 *     convolution weights, which the same conversion writes);
 *   - attention: q_proj gives each head [query | gate], the output is multiplied by
 *     sigmoid(gate) before o_proj; q/k norms per head; rope on the first
 *     partial_rotary_factor of each head only;
 *   - qwen3_next: DeltaNet projections fused per key head (in_proj_qkvz, in_proj_ba); MLP
 *     is softmax top-k experts plus a shared expert gated by sigmoid(shared_expert_gate(x))
 *     on the layers decoder_sparse_step and mlp_only_layers pick, a dense MLP elsewhere;
 *   - qwen3_5: separate DeltaNet projections, dense MLP (qwen3_5_moe: qwen3_next's experts
 *     on every layer); its rope is mrope, which for text (all three position components
 *     equal) is ordinary rope.
 * Experts load from per-expert tensors, transformers' fused experts.gate_up_proj or MLX's
 * stacked switch_mlp. */
#include "lmhost/lmhost.h"
#include "mixers.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct layer {
    int linear; /* Gated DeltaNet; else attention */
    lmh_tensor *ln1, *ln2;
    gdn_layer gdn;
    lmh_tensor *wq, *wk, *wv, *wo, *bq, *bk, *bv, *bo, *q_norm, *k_norm;
    lmh_tensor *wg, *wu, *wd;                /* dense MLP */
    lmh_tensor *router, *eg, *eu, *egu, *ed; /* experts [E, out, in]; egu: fused gate|up */
    lmh_tensor *sg, *su, *sd, *sgate;        /* shared expert and its gate [1, H] */
} layer;

struct lmh_model {
    int32_t n_layers, hidden, heads, kv_heads, head_dim, inter, vocab, rot;
    int32_t n_experts, top_k, moe_inter, shared_inter, renorm;
    float eps, norm_ofs, rope_factor;
    gdn_cfg gc;
    lmh_tensor *embed, *norm, *lm_head, *inv_freq;
    layer *layers;
};

static const char *const model_types[] = {"qwen3_next",       "qwen3_5_text", "qwen3_5",
                                          "qwen3_5_moe_text", "qwen3_5_moe",  NULL};

static void unload(lmh_model *m) {
    if (!m) return;
    free(m->layers); /* tensors belong to the host */
    free(m);
}

/* Settings under `pre` ("" or "text_config."). */
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

static int c_int(const cfg *c, const char *k, int64_t def, int32_t *out) {
    return mx_int(c->h, c->ld, key(c, k), def, out);
}

/* A count that may be 0 (num_experts, shared_expert_intermediate_size). */
static int c_count(const cfg *c, const char *k, int64_t def, int32_t *out) {
    int64_t v = def;
    int rc = c->h->cfg_int(c->ld, key(c, k), &v);
    if (rc == LMH_ETYPE) return c->h->fail(c->ld, "config.json: %s must be an integer", k);
    if (v < 0 || v > (1 << 30))
        return c->h->fail(c->ld, "config.json: %s must not be negative (got %lld)", k,
                          (long long)v);
    *out = (int32_t)v;
    return 0;
}

/* Whether layer l is a Gated DeltaNet layer: layer_types (with transformers' legacy names
 * "mamba" and "attention"), else every full_attention_interval-th layer is attention. */
static int layer_is_linear(const cfg *c, int32_t l, int32_t n_layers, int *linear) {
    const lmh_host_api *h = c->h;
    int64_t len = 0;
    int rc = h->cfg_len(c->ld, key(c, "layer_types"), &len);
    if (rc == LMH_ETYPE) return h->fail(c->ld, "config.json: layer_types must be an array");
    if (rc == LMH_OK) {
        if (len != n_layers)
            return h->fail(c->ld, "config.json: layer_types has %lld entries for %d layers",
                           (long long)len, n_layers);
        char k[64];
        const char *t = NULL;
        snprintf(k, sizeof k, "layer_types.%d", l);
        if (h->cfg_str(c->ld, key(c, k), &t) != LMH_OK)
            return h->fail(c->ld, "config.json: layer_types[%d] must be a string", l);
        if (!strcmp(t, "linear_attention") || !strcmp(t, "mamba"))
            *linear = 1;
        else if (!strcmp(t, "full_attention") || !strcmp(t, "attention"))
            *linear = 0;
        else
            return h->fail(c->ld,
                           "config.json: layer_types[%d] is '%s'; this family has only "
                           "linear_attention and full_attention layers",
                           l, t);
        return 0;
    }
    int32_t every = 4;
    if (c_int(c, "full_attention_interval", 4, &every)) return LMH_EINVAL;
    *linear = (l + 1) % every != 0;
    return 0;
}

/* Whether layer l's MLP is the experts (qwen3_next): l not in mlp_only_layers and every
 * decoder_sparse_step-th layer. */
static int moe_layer(const cfg *c, const lmh_model *m, int32_t l, int32_t step, int *moe) {
    *moe = 0;
    if (m->n_experts == 0) return 0;
    int64_t n = 0;
    int rc = c->h->cfg_len(c->ld, key(c, "mlp_only_layers"), &n);
    if (rc == LMH_ETYPE) return c->h->fail(c->ld, "config.json: mlp_only_layers must be an array");
    for (int64_t i = 0; i < n; i++) {
        char k[64];
        int64_t v;
        snprintf(k, sizeof k, "mlp_only_layers.%lld", (long long)i);
        if (c->h->cfg_int(c->ld, key(c, k), &v) != LMH_OK)
            return c->h->fail(c->ld, "config.json: mlp_only_layers must hold layer numbers");
        if (v == l) return 0;
    }
    *moe = (l + 1) % step == 0;
    return 0;
}

/* Checkpoint tensor prefix of the language model. */
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

static int has(const lmh_host_api *h, lmh_load_ctx *ld, const char *name) {
    lmh_weight_info wi;
    return h->weight_info(ld, name, &wi) == LMH_OK;
}

/* Tensor `pre`layers.l.`name` of shape [d0] or [d0, d1]. */
static lmh_tensor *lw(const lmh_host_api *h, lmh_load_ctx *ld, const char *pre, int32_t l,
                      const char *name, int64_t d0, int64_t d1) {
    char full[320];
    snprintf(full, sizeof full, "%slayers.%d.%s", pre, l, name);
    int64_t ne[2] = {d0, d1};
    return h->weight(ld, l, full, d1 ? 2 : 1, ne);
}

/* The same where the config does not say whether it exists (biases). */
static lmh_tensor *lw_opt(const lmh_host_api *h, lmh_load_ctx *ld, const char *pre, int32_t l,
                          const char *name, int64_t d0) {
    char full[320];
    snprintf(full, sizeof full, "%slayers.%d.%s", pre, l, name);
    return has(h, ld, full) ? h->weight(ld, l, full, 1, &d0) : NULL;
}

static int load_attention(const lmh_host_api *h, lmh_load_ctx *ld, const char *pre, int32_t l,
                          const lmh_model *m, layer *L) {
    const int64_t H = m->hidden, hd = m->head_dim, qd = (int64_t)m->heads * hd,
                  kd = (int64_t)m->kv_heads * hd;
    lmh_layer_state st = {.kind = LMH_STATE_KV,
                          .n_kv_heads = m->kv_heads,
                          .head_dim_k = m->head_dim,
                          .head_dim_v = m->head_dim};
    if (h->declare_layer(ld, l, &st)) return LMH_EINVAL;
    L->wq = lw(h, ld, pre, l, "self_attn.q_proj.weight", 2 * qd, H); /* [query | gate] a head */
    L->wk = lw(h, ld, pre, l, "self_attn.k_proj.weight", kd, H);
    L->wv = lw(h, ld, pre, l, "self_attn.v_proj.weight", kd, H);
    L->wo = lw(h, ld, pre, l, "self_attn.o_proj.weight", H, qd);
    L->q_norm = lw(h, ld, pre, l, "self_attn.q_norm.weight", hd, 0);
    L->k_norm = lw(h, ld, pre, l, "self_attn.k_norm.weight", hd, 0);
    L->bq = lw_opt(h, ld, pre, l, "self_attn.q_proj.bias", 2 * qd);
    L->bk = lw_opt(h, ld, pre, l, "self_attn.k_proj.bias", kd);
    L->bv = lw_opt(h, ld, pre, l, "self_attn.v_proj.bias", kd);
    L->bo = lw_opt(h, ld, pre, l, "self_attn.o_proj.bias", H);
    return L->wq && L->wk && L->wv && L->wo && L->q_norm && L->k_norm ? 0 : LMH_EINVAL;
}

/* One stacked expert matrix [E, d0, d1]: MLX's switch_mlp, else the per-expert tensors. */
static lmh_tensor *experts(const lmh_host_api *h, lmh_load_ctx *ld, const char *pre, int32_t l,
                           int32_t E, const char *proj, int64_t d0, int64_t d1) {
    char name[320];
    snprintf(name, sizeof name, "%slayers.%d.mlp.switch_mlp.%s.weight", pre, l, proj);
    if (has(h, ld, name)) {
        int64_t ne[3] = {E, d0, d1};
        return h->weight(ld, l, name, 3, ne);
    }
    snprintf(name, sizeof name, "%slayers.%d.mlp.experts.%%d.%s.weight", pre, l, proj);
    int64_t ne[2] = {d0, d1};
    return h->weight_stack(ld, l, name, E, 2, ne);
}

static int load_moe(const lmh_host_api *h, lmh_load_ctx *ld, const char *pre, int32_t l,
                    const lmh_model *m, layer *L) {
    const int64_t H = m->hidden, I = m->moe_inter, E = m->n_experts;
    char name[320];
    L->router = lw(h, ld, pre, l, "mlp.gate.weight", E, H);
    snprintf(name, sizeof name, "%slayers.%d.mlp.experts.gate_up_proj", pre, l);
    if (has(h, ld, name)) { /* transformers' fused layout: [E, 2I, H] gate then up, [E, H, I] */
        int64_t gne[3] = {E, 2 * I, H}, dne[3] = {E, H, I};
        L->egu = h->weight(ld, l, name, 3, gne);
        snprintf(name, sizeof name, "%slayers.%d.mlp.experts.down_proj", pre, l);
        L->ed = h->weight(ld, l, name, 3, dne);
        if (!L->egu) return LMH_EINVAL;
    } else {
        L->eg = experts(h, ld, pre, l, m->n_experts, "gate_proj", I, H);
        L->eu = experts(h, ld, pre, l, m->n_experts, "up_proj", I, H);
        L->ed = experts(h, ld, pre, l, m->n_experts, "down_proj", H, I);
        if (!L->eg || !L->eu) return LMH_EINVAL;
    }
    if (!L->router || !L->ed) return LMH_EINVAL;
    if (m->shared_inter) {
        const int64_t S = m->shared_inter;
        L->sg = lw(h, ld, pre, l, "mlp.shared_expert.gate_proj.weight", S, H);
        L->su = lw(h, ld, pre, l, "mlp.shared_expert.up_proj.weight", S, H);
        L->sd = lw(h, ld, pre, l, "mlp.shared_expert.down_proj.weight", H, S);
        L->sgate = lw(h, ld, pre, l, "mlp.shared_expert_gate.weight", 1, H);
        if (!L->sg || !L->su || !L->sd || !L->sgate) return LMH_EINVAL;
    }
    return 0;
}

/* The rope's inverse frequencies over the first m->rot dims of each head. */
static int load_rope(const lmh_host_api *h, lmh_load_ctx *ld, lmh_model *m) {
    float inv[512];
    lmh_rope_info ri = {.attn_factor = 1.0f, .n_pairs = m->rot / 2};
    const char *rt = "default";
    h->rope_type(ld, NULL, &rt);
    if (!strcmp(rt, "mrope")) {
        /* older multimodal configs: mrope's frequencies are the default ones (the sections
         * only choose which position component each pair reads; text has one) */
        double theta = 10000.0;
        if (h->rope_setting(ld, NULL, "rope_theta", &theta) != LMH_OK || !(theta > 0))
            return h->fail(ld, "config.json: rope_theta must be a positive number");
        for (int32_t i = 0; i < m->rot / 2; i++)
            inv[i] = (float)(1.0 / pow(theta, (double)(2 * i) / (double)m->rot));
    } else if (h->rope_freqs(ld, NULL, m->rot, inv, &ri)) {
        return LMH_EINVAL;
    }
    int64_t nf = m->rot / 2;
    m->inv_freq = h->constant(ld, LMH_LAYER_INPUT, LMH_F32, 1, &nf, inv);
    m->rope_factor = ri.attn_factor;
    return m->inv_freq ? 0 : LMH_EINVAL;
}

/* Rotary width: partial_rotary_factor of head_dim, from the rope parameters, else the
 * config's top level, else 0.25 (transformers' default for this family). */
static int rotary_dims(const cfg *c, lmh_model *m) {
    double prf = 0.25;
    int rc = c->h->rope_setting(c->ld, NULL, "partial_rotary_factor", &prf);
    if (rc == LMH_ETYPE)
        return c->h->fail(c->ld, "config.json: partial_rotary_factor must be a number");
    if (rc != LMH_OK && c->h->cfg_float(c->ld, key(c, "partial_rotary_factor"), &prf) == LMH_ETYPE)
        return c->h->fail(c->ld, "config.json: partial_rotary_factor must be a number");
    if (!(prf > 0 && prf <= 1))
        return c->h->fail(c->ld, "config.json: partial_rotary_factor must be in (0, 1] (got %g)",
                          prf);
    m->rot = (int32_t)(m->head_dim * prf); /* truncated, as transformers' int() */
    if (m->rot < 2 || m->rot % 2 || m->rot > 1024)
        return c->h->fail(c->ld,
                          "config.json: a rotary width of %d (head_dim %d x "
                          "partial_rotary_factor %g) is not supported: it must be even, 2 to 1024",
                          m->rot, m->head_dim, prf);
    return 0;
}

/* tie_word_embeddings where transformers reads it: the top-level config (it is the model's
 * config, also for the multimodal one), text_config's only when the top level lacks it. */
static int tied(const lmh_host_api *h, lmh_load_ctx *ld, const cfg *c) {
    int v = 0;
    if (h->cfg_bool(ld, "tie_word_embeddings", &v) == LMH_OK) return v;
    v = 0;
    if (*c->pre) h->cfg_bool(ld, key(c, "tie_word_embeddings"), &v);
    return v;
}

static int load_head(const lmh_host_api *h, lmh_load_ctx *ld, const cfg *c, const char *pre,
                     lmh_model *m) {
    const int64_t H = m->hidden, ene[2] = {m->vocab, H};
    char name[256];
    snprintf(name, sizeof name, "%sembed_tokens.weight", pre);
    m->embed = h->weight(ld, LMH_LAYER_INPUT, name, 2, ene);
    snprintf(name, sizeof name, "%snorm.weight", pre);
    m->norm = h->weight(ld, LMH_LAYER_OUTPUT, name, 1, &H);
    if (!m->embed || !m->norm) return LMH_EINVAL;
    static const char *const heads[] = {"lm_head.weight", "language_model.lm_head.weight", NULL};
    const char *head = NULL;
    for (int i = 0; heads[i] && !head; i++)
        if (has(h, ld, heads[i])) head = heads[i];
    int tie = tied(h, ld, c);
    if (!tie && !head) {
        int other = 0; /* the level transformers does not read: a head-less checkpoint's hint */
        if (*c->pre) h->cfg_bool(ld, key(c, "tie_word_embeddings"), &other);
        if (!other)
            return h->fail(ld, "missing tensor lm_head.weight (tie_word_embeddings is false)");
        tie = 1;
    }
    m->lm_head = tie ? m->embed : h->weight(ld, LMH_LAYER_OUTPUT, head, 2, ene);
    return m->lm_head ? 0 : LMH_EINVAL;
}

static int load(const lmh_host_api *h, lmh_load_ctx *ld, lmh_model **out) {
    if (h->abi_minor < 7 || h->size < offsetof(lmh_host_api, fwd_recurrent) + sizeof(void *))
        return h->fail(ld, "this host keeps no recurrent state (plugin ABI 1.7)");
    const char *type = "";
    h->cfg_str(ld, "model_type", &type);
    cfg c = {h, ld, ""};
    int64_t dummy;
    if ((!strcmp(type, "qwen3_5") || !strcmp(type, "qwen3_5_moe")) &&
        h->cfg_len(ld, "text_config", &dummy) != LMH_ENOTFOUND)
        c.pre = "text_config.";
    const int next = !strcmp(type, "qwen3_next");
    const int moe35 = !strncmp(type, "qwen3_5_moe", 11); /* Qwen3.5's experts: every layer */
    lmh_model *m = calloc(1, sizeof *m);
    if (!m) return h->fail(ld, "out of memory");
    *out = m;
    gdn_cfg *g = &m->gc;
    /* absent settings take transformers' defaults for the family */
    if (c_int(&c, "hidden_size", 0, &m->hidden) ||
        c_int(&c, "num_hidden_layers", 0, &m->n_layers) ||
        c_int(&c, "num_attention_heads", 0, &m->heads) ||
        c_int(&c, "num_key_value_heads", next ? 2 : 4, &m->kv_heads) ||
        c_int(&c, "head_dim", 256, &m->head_dim) ||
        c_int(&c, "intermediate_size", next ? 5632 : 12288, &m->inter) ||
        c_int(&c, "vocab_size", 0, &m->vocab) ||
        c_int(&c, "linear_num_key_heads", 16, &g->k_heads) ||
        c_int(&c, "linear_num_value_heads", 32, &g->v_heads) ||
        c_int(&c, "linear_key_head_dim", 128, &g->k_dim) ||
        c_int(&c, "linear_value_head_dim", 128, &g->v_dim) ||
        c_int(&c, "linear_conv_kernel_dim", 4, &g->conv))
        return LMH_EINVAL;
    if (m->heads % m->kv_heads)
        return h->fail(ld,
                       "config.json: num_attention_heads %d is not a multiple of "
                       "num_key_value_heads %d",
                       m->heads, m->kv_heads);
    if (g->v_heads % g->k_heads)
        return h->fail(ld,
                       "config.json: linear_num_value_heads %d is not a multiple of "
                       "linear_num_key_heads %d",
                       g->v_heads, g->k_heads);
    if (g->k_dim > 1024) /* the delta rule keeps a key head's values on the stack */
        return h->fail(ld, "config.json: linear_key_head_dim %d is not supported (at most 1024)",
                       g->k_dim);
    if (g->conv < 2 || g->conv > 64)
        return h->fail(ld, "config.json: linear_conv_kernel_dim %d is not supported (2 to 64)",
                       g->conv);
    double eps = 1e-6;
    if (h->cfg_float(ld, key(&c, "rms_norm_eps"), &eps) == LMH_ETYPE || !(eps > 0))
        return h->fail(ld, "config.json: rms_norm_eps must be a positive number");
    m->eps = (float)eps;
    const char *act = "silu";
    if (h->cfg_str(ld, key(&c, "hidden_act"), &act) == LMH_ETYPE || strcmp(act, "silu") != 0)
        return h->fail(ld, "config.json: hidden_act '%s' is not supported (this family uses silu)",
                       act);
    int32_t step = 1;
    if (next || moe35) {
        if (c_count(&c, "num_experts", 512, &m->n_experts) ||
            c_count(&c, "shared_expert_intermediate_size", 512, &m->shared_inter) ||
            c_int(&c, "decoder_sparse_step", 1, &step))
            return LMH_EINVAL;
        if (m->n_experts) {
            if (c_int(&c, "num_experts_per_tok", 10, &m->top_k) ||
                c_int(&c, "moe_intermediate_size", 512, &m->moe_inter))
                return LMH_EINVAL;
            if (m->top_k > m->n_experts)
                return h->fail(ld, "config.json: num_experts_per_tok %d exceeds the %d experts",
                               m->top_k, m->n_experts);
            m->renorm = mx_flag(h, ld, key(&c, "norm_topk_prob"), 1);
        }
    }
    if (rotary_dims(&c, m)) return LMH_EINVAL;
    if (h->declare_model(ld, m->n_layers, m->vocab)) return LMH_EINVAL;
    /* (ABI 1.11) experts the host may stream from disk; the router takes lmh_batch.moe_top_k */
    if (m->n_experts > 1 && h->abi_minor >= 11 && h->declare_moe(ld, m->n_experts, m->top_k))
        return LMH_EINVAL;
    m->layers = calloc((size_t)m->n_layers, sizeof *m->layers);
    if (!m->layers) return h->fail(ld, "out of memory");

    const char *pre = weight_prefix(h, ld);
    char name[320];
    g->hidden = m->hidden;
    g->eps = m->eps;
    /* the DeltaNet's projections: fused per key head (qwen3_next) or separate (qwen3_5), as
     * the checkpoint has them */
    g->layout = next ? GDN_FUSED : GDN_SEPARATE;
    for (int32_t l = 0; l < m->n_layers; l++) {
        snprintf(name, sizeof name, "%slayers.%d.linear_attn.in_proj_qkvz.weight", pre, l);
        int fused = has(h, ld, name);
        snprintf(name, sizeof name, "%slayers.%d.linear_attn.in_proj_qkv.weight", pre, l);
        if (fused || has(h, ld, name)) {
            g->layout = fused ? GDN_FUSED : GDN_SEPARATE;
            break;
        }
    }
    int mlx_norms = -1; /* whether the (1 + w) norms were stored as 1 + w (MLX), once known */
    for (int32_t l = 0; l < m->n_layers; l++) {
        layer *L = &m->layers[l];
        int moe = 0;
        if (layer_is_linear(&c, l, m->n_layers, &L->linear) || moe_layer(&c, m, l, step, &moe))
            return LMH_EINVAL;
        L->ln1 = lw(h, ld, pre, l, "input_layernorm.weight", m->hidden, 0);
        L->ln2 = lw(h, ld, pre, l, "post_attention_layernorm.weight", m->hidden, 0);
        if (!L->ln1 || !L->ln2) return LMH_EINVAL;
        if (L->linear) {
            char gpre[128];
            snprintf(gpre, sizeof gpre, "%slayers.%d.linear_attn.", pre, l);
            if (gdn_load(h, ld, l, gpre, g, &L->gdn)) return LMH_EINVAL;
            if (mlx_norms < 0) mlx_norms = L->gdn.conv_w->ne[2] == 1;
        } else if (load_attention(h, ld, pre, l, m, L)) {
            return LMH_EINVAL;
        }
        if (moe) {
            if (load_moe(h, ld, pre, l, m, L)) return LMH_EINVAL;
        } else {
            L->wg = lw(h, ld, pre, l, "mlp.gate_proj.weight", m->inter, m->hidden);
            L->wu = lw(h, ld, pre, l, "mlp.up_proj.weight", m->inter, m->hidden);
            L->wd = lw(h, ld, pre, l, "mlp.down_proj.weight", m->hidden, m->inter);
            if (!L->wg || !L->wu || !L->wd) return LMH_EINVAL;
        }
    }
    m->norm_ofs = mlx_norms > 0 ? 0.0f : 1.0f;
    if (load_head(h, ld, &c, pre, m) || load_rope(h, ld, m)) return LMH_EINVAL;
    return LMH_OK;
}

/* Scratch a pass shares among its layers (ops run in order on one queue). */
typedef struct scratch {
    lmh_tensor *hn, *o;
    lmh_tensor *qg, *q, *k, *v, *gate, *att; /* attention */
    lmh_tensor *g, *u;                       /* dense MLP */
    lmh_tensor *rl, *rw, *ri, *eg, *eu, *egu, *ey;
    lmh_tensor *sg, *su, *sd, *sgl;
    lmh_tensor *moe_k; /* (ABI 1.11) lmh_batch.moe_top_k */
    gdn_scratch gdn;
} scratch;

static scratch scratch_new(lmh_build *b, const lmh_model *m, int64_t n) {
    const int64_t H = m->hidden, hd = m->head_dim, qd = (int64_t)m->heads * hd,
                  kd = (int64_t)m->kv_heads * hd;
    int any_linear = 0, any_attn = 0, any_dense = 0, any_moe = 0, any_fused = 0;
    for (int32_t l = 0; l < m->n_layers; l++) {
        const layer *L = &m->layers[l];
        any_linear |= L->linear;
        any_attn |= !L->linear;
        any_dense |= L->wg != NULL;
        any_moe |= L->router != NULL;
        any_fused |= L->egu != NULL;
    }
    scratch s = {.hn = lmh_b_new2(b, n, H), .o = lmh_b_new2(b, n, H)};
    if (any_linear) s.gdn = gdn_scratch_new(b, n, &m->gc);
    if (any_attn) {
        int64_t qne[3] = {n, m->heads, hd};
        s.qg = lmh_b_new2(b, n, 2 * qd);
        s.q = lmh_b_new(b, 3, qne);
        s.k = lmh_b_new2(b, n, kd);
        s.v = lmh_b_new2(b, n, kd);
        s.gate = lmh_b_new2(b, n, qd);
        s.att = lmh_b_new2(b, n, qd);
    }
    if (any_dense) {
        s.g = lmh_b_new2(b, n, m->inter);
        s.u = lmh_b_new2(b, n, m->inter);
    }
    if (any_moe) {
        const int64_t k = m->top_k, ine[2] = {n, k}, gne[3] = {n, k, m->moe_inter},
                      fne[3] = {n, k, 2 * (int64_t)m->moe_inter}, yne[3] = {n, k, H};
        s.rl = lmh_b_new2(b, n, m->n_experts);
        s.rw = lmh_b_new(b, 2, ine);
        s.ri = b->h->fwd_tensor(b->f, b->layer, LMH_I32, 2, ine);
        s.eg = lmh_b_new(b, 3, gne);
        s.eu = lmh_b_new(b, 3, gne);
        if (any_fused) s.egu = lmh_b_new(b, 3, fne);
        s.ey = lmh_b_new(b, 3, yne);
        if (m->shared_inter) {
            s.sg = lmh_b_new2(b, n, m->shared_inter);
            s.su = lmh_b_new2(b, n, m->shared_inter);
            s.sd = lmh_b_new2(b, n, H);
            s.sgl = lmh_b_new2(b, n, 1);
        }
    }
    return s;
}

/* s->o = gated attention over s->hn. */
static lmh_tensor *attention(lmh_build *b, const lmh_model *m, const layer *L, const scratch *s,
                             const lmh_batch *bt) {
    const int64_t hd = m->head_dim;
    lmh_tensor *q3 = s->q, *k3 = lmh_b_heads(b, s->k, m->kv_heads, hd),
               *v3 = lmh_b_heads(b, s->v, m->kv_heads, hd),
               *att3 = lmh_b_heads(b, s->att, m->heads, hd);
    lmh_b_matmul(b, s->qg, s->hn, L->wq, L->bq);
    /* each head's [query | gate] apart */
    gdn_part_cols(b, q3, s->qg, m->heads, 0, hd);
    gdn_part_cols(b, s->gate, s->qg, m->heads, hd, hd);
    lmh_b_matmul(b, s->k, s->hn, L->wk, L->bk);
    lmh_b_matmul(b, s->v, s->hn, L->wv, L->bv);
    lmh_b_rms_norm(b, q3, q3, L->q_norm, m->eps, m->norm_ofs);
    lmh_b_rope(b, q3, bt->positions, m->inv_freq, m->rot, LMH_ROPE_HALF, m->rope_factor);
    lmh_b_rms_norm(b, k3, k3, L->k_norm, m->eps, m->norm_ofs);
    lmh_b_rope(b, k3, bt->positions, m->inv_freq, m->rot, LMH_ROPE_HALF, m->rope_factor);
    lmh_attn_params ap = {.scale = 1.0f / sqrtf((float)hd), .softcap = 0, .window = 0};
    if (!q3 || !k3 || !v3 || !att3 || b->h->fwd_attention(b->f, b->layer, q3, k3, v3, att3, &ap))
        return NULL;
    lmh_b_op(b, LMH_OP_SIGMOID_GATE, s->att, s->att, s->gate, NULL); /* elementwise */
    return lmh_b_matmul(b, s->o, s->att, L->wo, L->bo);
}

/* s->o = the MLP over s->hn. */
static lmh_tensor *mlp(lmh_build *b, const lmh_model *m, const layer *L, const scratch *s) {
    if (!L->router) {
        lmh_b_matmul(b, s->g, s->hn, L->wg, NULL);
        lmh_b_matmul(b, s->u, s->hn, L->wu, NULL);
        lmh_b_op(b, LMH_OP_SWIGLU, s->g, s->g, s->u, NULL);
        return lmh_b_matmul(b, s->o, s->g, L->wd, NULL);
    }
    lmh_b_matmul_exact(b, s->rl, s->hn, L->router, NULL);
    lmh_op route = {.code = LMH_OP_MOE_ROUTE, .dst = s->rw, .src = {s->rl, s->ri}};
    route.p.i[0] = m->top_k;
    route.p.i[1] = m->renorm;
    route.src[2] = s->moe_k;
    if (!s->rl || !s->rw || !s->ri || b->h->fwd_op(b->f, b->layer, &route) != LMH_OK) return NULL;
    if (L->egu) {
        lmh_b_op(b, LMH_OP_MOE_MATMUL, s->egu, s->hn, L->egu, s->ri);
        lmh_b_op(b, LMH_OP_SWIGLU, s->eg, s->egu, NULL, NULL); /* fused [gate | up] */
    } else {
        lmh_b_op(b, LMH_OP_MOE_MATMUL, s->eg, s->hn, L->eg, s->ri);
        lmh_b_op(b, LMH_OP_MOE_MATMUL, s->eu, s->hn, L->eu, s->ri);
        lmh_b_op(b, LMH_OP_SWIGLU, s->eg, s->eg, s->eu, NULL);
    }
    lmh_b_op(b, LMH_OP_MOE_MATMUL, s->ey, s->eg, L->ed, s->ri);
    lmh_tensor *o = lmh_b_op(b, LMH_OP_MOE_COMBINE, s->o, s->ey, s->rw, NULL);
    if (L->sg) { /* the shared expert, scaled by sigmoid(gate(x)) a row */
        lmh_b_matmul(b, s->sg, s->hn, L->sg, NULL);
        lmh_b_matmul(b, s->su, s->hn, L->su, NULL);
        lmh_b_op(b, LMH_OP_SWIGLU, s->sg, s->sg, s->su, NULL);
        lmh_b_matmul(b, s->sd, s->sg, L->sd, NULL);
        lmh_b_matmul(b, s->sgl, s->hn, L->sgate, NULL);
        lmh_b_op(b, LMH_OP_SIGMOID_GATE, s->sd, s->sd, s->sgl, NULL);
        o = lmh_b_op(b, LMH_OP_ADD, s->o, s->o, s->sd, NULL);
    }
    return o;
}

static int forward(lmh_model *m, const lmh_host_api *h, lmh_fwd *f, const lmh_batch *bt) {
    lmh_build b = {.h = h, .f = f, .layer = LMH_LAYER_INPUT};
    lmh_tensor *x = lmh_b_get_rows(&b, NULL, m->embed, bt->tokens);
    scratch s = scratch_new(&b, m, bt->n_rows);
    if (h->abi_minor >= 11) s.moe_k = bt->moe_top_k;
    for (int32_t l = 0; l < m->n_layers; l++) {
        const layer *L = &m->layers[l];
        b.layer = l;
        lmh_b_rms_norm(&b, s.hn, x, L->ln1, m->eps, m->norm_ofs);
        if (!(L->linear ? gdn_forward(&b, &m->gc, &L->gdn, &s.gdn, s.hn, s.o)
                        : attention(&b, m, L, &s, bt)))
            return LMH_EINVAL;
        lmh_b_op(&b, LMH_OP_ADD, x, x, s.o, NULL);
        lmh_b_rms_norm(&b, s.hn, x, L->ln2, m->eps, m->norm_ofs);
        if (!mlp(&b, m, L, &s) || !lmh_b_op(&b, LMH_OP_ADD, x, x, s.o, NULL)) return LMH_EINVAL;
    }
    b.layer = LMH_LAYER_OUTPUT;
    lmh_tensor *xo = lmh_b_get_rows(&b, NULL, x, bt->out_rows);
    lmh_tensor *hf = lmh_b_rms_norm(&b, NULL, xo, m->norm, m->eps, m->norm_ofs);
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
    .name = "qwen3_next",
    .version = "0.1.0",
    .summary = "hybrid Gated DeltaNet / gated attention decoders: qwen3_next (with routed and "
               "shared experts), qwen3_5, qwen3_5_text and their _moe forms",
    .init = NULL,
    .api = &api,
};

LMH_EXPORT const lmh_plugin_info *lmhost_plugin_entry(void) {
    return &info;
}
