/* Nemotron-H (NVIDIA): a stack of single-purpose blocks, each one mixer behind a pre-norm
 * and a residual: x += mixer(RMSNorm(x)). Unlike Jamba or Falcon-H1, a block holds only
 * one of these (the layer pattern says which):
 *   M  Mamba-2 (common/mixers.h): gate then RMSNorm over n_groups groups of the inner
 *      width; dt clamped below at time_step_min (transformers' time_step_limit is unused).
 *   *  attention with grouped K/V heads and NO positional encoding (no rope: the Mamba
 *      layers carry the order), no biases whatever attention_bias says.
 *   -  MLP without a gate: down(relu(up(x))^2), biases when mlp_bias.
 *   E  mixture of experts, DeepSeek-V3 style: sigmoid scores, the top k chosen by score +
 *      e_score_correction_bias, weighted by their plain scores (renormalised when
 *      norm_topk_prob), times routed_scaling_factor; relu^2 experts (optionally in a
 *      latent width: fc1/fc2_latent_proj) and an always-on relu^2 shared expert.
 * logits = lm_head(RMSNorm(x)) (norm_f; lm_head is its own tensor: transformers never ties
 * it). The pattern comes as layers_block_type (or layer_types) lists of mamba /
 * linear_attention, attention / full_attention, mlp, moe, or as the hub checkpoints'
 * hybrid_override_pattern string of M * - E. Every norm uses layer_norm_epsilon.
 * Checkpoints: backbone.* as on the hub (model.* also read), MLX conversions included. */
#include "lmhost/lmhost.h"
#include "mixers.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { K_MAMBA = 0, K_ATTN = 1, K_MLP = 2, K_MOE = 3 };

typedef struct layer {
    int kind;
    lmh_tensor *norm;
    m2_layer m2;
    lmh_tensor *wq, *wk, *wv, *wo;
    lmh_tensor *up, *up_b, *down, *down_b; /* MLP, and the MoE's shared expert */
    /* MoE: router [E, H] and its score bias [E], experts [E, I, Hin] / [E, Hin, I], the
     * latent projections, and constants for the weights' reorder (see moe_forward) */
    lmh_tensor *gate, *gate_bias, *eup, *edown, *lat_in, *lat_in_b, *lat_out, *lat_out_b;
    lmh_tensor *eye, *fold;
} layer;

struct lmh_model {
    int32_t n_layers, hidden, heads, kv_heads, head_dim, inter, vocab;
    int32_t n_experts, top_k, moe_inter, shared_inter, latent;
    int norm_topk;
    float eps, route_scale;
    int n_kind[4]; /* layers of each kind: what the forward pass needs scratch for */
    m2_cfg c2;
    lmh_tensor *embed, *norm, *lm_head;
    layer *layers;
};

static const char *const model_types[] = {"nemotron_h", NULL};

static void unload(lmh_model *m) {
    if (!m) return;
    free(m->layers); /* tensors belong to the host */
    free(m);
}

/* The config key to read: transformers' legacy alias where the config has it (its
 * __post_init__ lets the alias override the field), else the field. */
static const char *key_or_alias(const lmh_host_api *h, lmh_load_ctx *ld, const char *key,
                                const char *alias) {
    double d;
    return h->cfg_float(ld, alias, &d) != LMH_ENOTFOUND ? alias : key;
}

static int bool_setting(const lmh_host_api *h, lmh_load_ctx *ld, const char *key, int def,
                        int *out) {
    *out = def;
    if (h->cfg_bool(ld, key, out) == LMH_ETYPE)
        return h->fail(ld, "config.json: %s must be true or false", key);
    return 0;
}

static int kind_of_name(const char *t) {
    if (!strcmp(t, "mamba") || !strcmp(t, "linear_attention")) return K_MAMBA;
    if (!strcmp(t, "attention") || !strcmp(t, "full_attention")) return K_ATTN;
    if (!strcmp(t, "mlp")) return K_MLP;
    if (!strcmp(t, "moe")) return K_MOE;
    return -1;
}

static int kind_of_char(char c) {
    switch (c) {
    case 'M':
        return K_MAMBA;
    case '*':
        return K_ATTN;
    case '-':
        return K_MLP;
    case 'E':
        return K_MOE;
    default:
        return -1;
    }
}

/* The layer pattern into a new array of K_* (*n layers): a layers_block_type (or
 * layer_types) list first, as transformers prefers it, else hybrid_override_pattern. */
static int layer_kinds(const lmh_host_api *h, lmh_load_ctx *ld, int **kinds, int32_t *n) {
    const char *lkey = "layers_block_type";
    int64_t len = 0;
    int rc = h->cfg_len(ld, lkey, &len);
    if (rc == LMH_ENOTFOUND) {
        lkey = "layer_types"; /* transformers' attribute_map alias */
        rc = h->cfg_len(ld, lkey, &len);
    }
    if (rc == LMH_ETYPE) return h->fail(ld, "config.json: %s must be a list", lkey);
    const char *pat = NULL;
    if (rc == LMH_ENOTFOUND) {
        rc = h->cfg_str(ld, "hybrid_override_pattern", &pat);
        if (rc == LMH_ETYPE)
            return h->fail(ld, "config.json: hybrid_override_pattern must be a string");
        if (rc != LMH_OK)
            return h->fail(ld, "config.json: no layer pattern (layers_block_type or "
                               "hybrid_override_pattern)");
        len = (int64_t)strlen(pat);
    }
    if (len < 1 || len > 100000)
        return h->fail(ld, "config.json: the layer pattern has %lld layers", (long long)len);
    *kinds = malloc((size_t)len * sizeof **kinds);
    if (!*kinds) return h->fail(ld, "out of memory");
    for (int64_t l = 0; l < len; l++) {
        if (pat) {
            (*kinds)[l] = kind_of_char(pat[l]);
            if ((*kinds)[l] < 0)
                return h->fail(ld,
                               "config.json: hybrid_override_pattern has '%c' at layer %lld; "
                               "Nemotron-H knows M (mamba), * (attention), - (mlp) and E (moe)",
                               pat[l], (long long)l);
            continue;
        }
        char key[64];
        const char *t = NULL;
        snprintf(key, sizeof key, "%s.%lld", lkey, (long long)l);
        if (h->cfg_str(ld, key, &t) != LMH_OK)
            return h->fail(ld, "config.json: %s[%lld] must be a string", lkey, (long long)l);
        (*kinds)[l] = kind_of_name(t);
        if ((*kinds)[l] < 0)
            return h->fail(ld,
                           "config.json: %s[%lld] is '%s'; Nemotron-H has only mamba "
                           "(linear_attention), attention (full_attention), mlp and moe layers",
                           lkey, (long long)l, t);
    }
    *n = (int32_t)len;
    int64_t nl = 0; /* transformers ignores num_hidden_layers beside a pattern, as here */
    if (h->cfg_int(ld, "num_hidden_layers", &nl) == LMH_OK && nl != len)
        h->log(LMH_LOG_WARN,
               "nemotron_h: num_hidden_layers %lld differs from the pattern's %lld "
               "layers; the pattern wins",
               (long long)nl, (long long)len);
    return 0;
}

static int has(const lmh_host_api *h, lmh_load_ctx *ld, const char *pre, const char *what) {
    char name[320];
    lmh_weight_info wi;
    snprintf(name, sizeof name, "%s%s", pre, what);
    return h->weight_info(ld, name, &wi) == LMH_OK;
}

/* Stacked experts [E, d0, d1] under one name (transformers' experts.up_proj, MLX's
 * switch_mlp.fc1.weight) or per-expert tensors experts.<e>.<proj>.weight. */
static lmh_tensor *experts(const lmh_host_api *h, lmh_load_ctx *ld, const lmh_model *m, int32_t l,
                           const char *pre, const char *stacked, const char *mlx, const char *proj,
                           int64_t d0, int64_t d1) {
    char name[320];
    int64_t ne[3] = {m->n_experts, d0, d1};
    if (has(h, ld, pre, stacked) || !has(h, ld, pre, mlx)) {
        if (has(h, ld, pre, stacked)) {
            snprintf(name, sizeof name, "%s%s", pre, stacked);
            return h->weight(ld, l, name, 3, ne);
        }
        snprintf(name, sizeof name, "%sexperts.%%d.%s.weight", pre, proj);
        return h->weight_stack(ld, l, name, m->n_experts, 2, ne + 1);
    }
    snprintf(name, sizeof name, "%s%s", pre, mlx);
    return h->weight(ld, l, name, 3, ne);
}

static int load_moe(const lmh_host_api *h, lmh_load_ctx *ld, lmh_model *m, int32_t l,
                    const char *pre, int mlp_bias) {
    layer *L = &m->layers[l];
    const int64_t H = m->hidden, E = m->n_experts, I = m->moe_inter, S = m->shared_inter,
                  Hin = m->latent ? m->latent : m->hidden, k = m->top_k;
    char name[320];
    lmh_weight_info wi;
    snprintf(name, sizeof name, "%sgate.weight", pre);
    /* the router is read again per chosen expert through a view (moe_forward) */
    if (h->weight_info(ld, name, &wi) == LMH_OK && !lmh_dtype_is_float(wi.dtype))
        return h->fail(ld, "tensor %s must be f32, f16 or bf16 (is %s)", name,
                       lmh_dtype_name(wi.dtype));
    L->gate = mx_w(h, ld, l, pre, "gate.weight", E, H);
    L->gate_bias = mx_w_opt(h, ld, l, pre, "gate.e_score_correction_bias", E, 0);
    L->eup =
        experts(h, ld, m, l, pre, "experts.up_proj", "switch_mlp.fc1.weight", "up_proj", I, Hin);
    L->edown = experts(h, ld, m, l, pre, "experts.down_proj", "switch_mlp.fc2.weight", "down_proj",
                       Hin, I);
    L->up = mx_w(h, ld, l, pre, "shared_experts.up_proj.weight", S, H);
    L->down = mx_w(h, ld, l, pre, "shared_experts.down_proj.weight", H, S);
    if (mlp_bias) {
        L->up_b = mx_w(h, ld, l, pre, "shared_experts.up_proj.bias", S, 0);
        L->down_b = mx_w(h, ld, l, pre, "shared_experts.down_proj.bias", H, 0);
    }
    if (m->latent) {
        L->lat_in = mx_w(h, ld, l, pre, "fc1_latent_proj.weight", Hin, H);
        L->lat_out = mx_w(h, ld, l, pre, "fc2_latent_proj.weight", H, Hin);
        if (mlp_bias) {
            L->lat_in_b = mx_w(h, ld, l, pre, "fc1_latent_proj.bias", Hin, 0);
            L->lat_out_b = mx_w(h, ld, l, pre, "fc2_latent_proj.bias", H, 0);
        }
    }
    /* eye [k, k, 1]: expert j of a moe_matmul is the unit column e_j; fold [k, k * k]
     * sums k rows of k: together they put weights back in a given slot order */
    float *eye = calloc((size_t)(k * k), sizeof *eye),
          *fold = calloc((size_t)(k * k * k), sizeof *fold);
    if (!eye || !fold) {
        free(eye);
        free(fold);
        return h->fail(ld, "out of memory");
    }
    for (int64_t j = 0; j < k; j++) eye[j * k + j] = 1.0f;
    for (int64_t j = 0; j < k; j++)
        for (int64_t i = 0; i < k; i++) fold[j * k * k + i * k + j] = 1.0f;
    int64_t ene[3] = {k, k, 1}, fne[2] = {k, k * k};
    L->eye = h->constant(ld, l, LMH_F32, 3, ene, eye);
    L->fold = h->constant(ld, l, LMH_F32, 2, fne, fold);
    free(eye);
    free(fold);
    if (!L->gate || !L->eup || !L->edown || !L->up || !L->down || !L->eye || !L->fold ||
        (mlp_bias && (!L->up_b || !L->down_b)) || (m->latent && (!L->lat_in || !L->lat_out)) ||
        (m->latent && mlp_bias && (!L->lat_in_b || !L->lat_out_b)))
        return LMH_EINVAL;
    return 0;
}

/* The MoE settings (defaults are transformers' NemotronHConfig's), read only when the
 * pattern has an E. */
static int moe_config(const lmh_host_api *h, lmh_load_ctx *ld, lmh_model *m) {
    int32_t n_group = 1, topk_group = 1;
    const char *ek = key_or_alias(h, ld, "n_routed_experts", "num_local_experts");
    if (mx_int(h, ld, ek, 8, &m->n_experts) || mx_int(h, ld, "num_experts_per_tok", 2, &m->top_k) ||
        mx_int(h, ld, "moe_intermediate_size", 7688, &m->moe_inter) ||
        mx_int(h, ld, "moe_shared_expert_intermediate_size", 7688, &m->shared_inter) ||
        mx_int(h, ld, "n_group", 1, &n_group) || mx_int(h, ld, "topk_group", 1, &topk_group) ||
        bool_setting(h, ld, "norm_topk_prob", 1, &m->norm_topk) ||
        mx_float(h, ld, "routed_scaling_factor", 1.0, &m->route_scale))
        return LMH_EINVAL;
    int64_t lat = 0;
    int rc = h->cfg_int(ld, "moe_latent_size", &lat);
    if (rc == LMH_ETYPE || (rc == LMH_OK && (lat <= 0 || lat > (1 << 30))))
        return h->fail(ld, "config.json: moe_latent_size must be a positive integer or null");
    m->latent = (int32_t)lat;
    if (m->top_k > m->n_experts)
        return h->fail(ld, "config.json: num_experts_per_tok %d exceeds the %d experts", m->top_k,
                       m->n_experts);
    if (m->top_k > 64)
        return h->fail(ld, "config.json: num_experts_per_tok %d is not supported (at most 64)",
                       m->top_k);
    if (m->n_experts % n_group)
        return h->fail(ld, "config.json: %d experts do not divide into n_group %d groups",
                       m->n_experts, n_group);
    /* Group-limited routing keeps the experts of the topk_group groups whose two best
     * scores sum highest: a per-group top-k with a mask that LMH_OP_MOE_ROUTE (softmax
     * top-k over all experts) cannot make. With every group kept it is plain top-k. */
    if (topk_group < n_group)
        return h->fail(ld,
                       "config.json: group-limited expert routing (n_group %d, topk_group %d) is "
                       "not supported: lmhost has no op for a per-group top-k (only n_group 1 "
                       "or topk_group >= n_group)",
                       n_group, topk_group);
    const char *act = "relu2";
    if (h->cfg_str(ld, "mlp_hidden_act", &act) == LMH_ETYPE || strcmp(act, "relu2") != 0)
        return h->fail(ld,
                       "config.json: mlp_hidden_act '%s' is not supported (Nemotron-H uses "
                       "relu2)",
                       act);
    return 0;
}

static int load(const lmh_host_api *h, lmh_load_ctx *ld, lmh_model **out) {
    if (h->abi_minor < 7 || h->size < offsetof(lmh_host_api, fwd_recurrent) + sizeof(void *))
        return h->fail(ld, "this host keeps no recurrent state (plugin ABI 1.7)");
    lmh_model *m = calloc(1, sizeof *m);
    if (!m) return h->fail(ld, "out of memory");
    *out = m;
    int *kinds = NULL;
    int rc = layer_kinds(h, ld, &kinds, &m->n_layers);
    if (rc) {
        free(kinds);
        return rc;
    }
    for (int32_t l = 0; l < m->n_layers; l++) m->n_kind[kinds[l]]++;
    m->layers = calloc((size_t)m->n_layers, sizeof *m->layers);
    if (!m->layers) {
        free(kinds);
        return h->fail(ld, "out of memory");
    }
    for (int32_t l = 0; l < m->n_layers; l++) m->layers[l].kind = kinds[l];
    free(kinds);

    /* defaults are transformers' NemotronHConfig's */
    double eps = 1e-5;
    if (mx_int(h, ld, "hidden_size", 0, &m->hidden) || mx_int(h, ld, "vocab_size", 0, &m->vocab))
        return LMH_EINVAL;
    if (h->cfg_float(ld, "layer_norm_epsilon", &eps) == LMH_ETYPE || !(eps > 0))
        return h->fail(ld, "config.json: layer_norm_epsilon must be a positive number");
    m->eps = (float)eps;
    int mlp_bias, use_bias, conv_bias, tie;
    if (bool_setting(h, ld, "mlp_bias", 0, &mlp_bias) ||
        bool_setting(h, ld, "use_bias", 0, &use_bias) ||
        bool_setting(h, ld, key_or_alias(h, ld, "use_conv_bias", "mamba_conv_bias"), 1,
                     &conv_bias) ||
        bool_setting(h, ld, "tie_word_embeddings", 0, &tie))
        return LMH_EINVAL;
    if (m->n_kind[K_ATTN]) {
        /* hub configs name the head width attention_head_dim; transformers reads head_dim */
        const char *hk = key_or_alias(h, ld, "attention_head_dim", "head_dim");
        if (mx_int(h, ld, "num_attention_heads", 32, &m->heads) ||
            mx_int(h, ld, "num_key_value_heads", 8, &m->kv_heads) ||
            mx_int(h, ld, hk, 128, &m->head_dim))
            return LMH_EINVAL;
        if (m->heads % m->kv_heads)
            return h->fail(ld,
                           "config.json: num_attention_heads %d is not a multiple of "
                           "num_key_value_heads %d",
                           m->heads, m->kv_heads);
        int ab = 0;
        h->cfg_bool(ld, "attention_bias", &ab);
        if (ab) /* transformers builds q/k/v/o without biases whatever this says */
            h->log(LMH_LOG_WARN, "nemotron_h: attention_bias is ignored (no attention biases)");
    }
    if (m->n_kind[K_MLP]) {
        if (mx_int(h, ld, "intermediate_size", 21504, &m->inter)) return LMH_EINVAL;
        const char *act = "relu2";
        if (h->cfg_str(ld, "mlp_hidden_act", &act) == LMH_ETYPE || strcmp(act, "relu2") != 0)
            return h->fail(ld,
                           "config.json: mlp_hidden_act '%s' is not supported (Nemotron-H uses "
                           "relu2)",
                           act);
    }
    if (m->n_kind[K_MOE] && moe_config(h, ld, m)) return LMH_EINVAL;
    m2_cfg *c = &m->c2;
    if (m->n_kind[K_MAMBA]) {
        *c = (m2_cfg){.hidden = m->hidden,
                      .norm = M2_NORM_GATED,
                      .conv_bias = conv_bias,
                      .proj_bias = use_bias, /* mamba_proj_bias is unused by transformers */
                      .eps = m->eps};
        float dt_min = 0.001f;
        if (mx_int(h, ld, "mamba_num_heads", 128, &c->heads) ||
            mx_int(h, ld, "mamba_head_dim", 64, &c->head_dim) ||
            mx_int(h, ld, "ssm_state_size", 128, &c->state) ||
            mx_int(h, ld, key_or_alias(h, ld, "n_groups", "mamba_n_groups"), 8, &c->groups) ||
            mx_int(h, ld, key_or_alias(h, ld, "conv_kernel", "mamba_d_conv"), 4, &c->conv) ||
            mx_float(h, ld, key_or_alias(h, ld, "time_step_min", "mamba_dt_min"), 0.001, &dt_min))
            return LMH_EINVAL;
        const char *act = "silu";
        if (h->cfg_str(ld, "mamba_hidden_act", &act) == LMH_ETYPE || strcmp(act, "silu") != 0)
            return h->fail(ld,
                           "config.json: mamba_hidden_act '%s' is not supported (Nemotron-H "
                           "uses silu)",
                           act);
        if (c->conv < 2 || c->conv > 64)
            return h->fail(ld, "config.json: conv_kernel %d is not supported (2 to 64)", c->conv);
        if (!(dt_min >= 0) || !isfinite(dt_min))
            return h->fail(ld, "config.json: time_step_min must be a number >= 0");
        /* the inner width is heads x head_dim (expand does not enter); the scan clamps dt
         * below at time_step_min and never above, as transformers' mixer does */
        c->inner = c->heads * c->head_dim;
        c->dt_min = dt_min;
        c->dt_max = 0;
        if (c->inner % c->groups)
            return h->fail(ld, "config.json: the mixer's %d channels do not divide into %d groups",
                           c->inner, c->groups);
        c->norm_group = c->inner / c->groups; /* the gated norm is grouped, one per B/C group */
    }
    if (h->declare_model(ld, m->n_layers, m->vocab)) return LMH_EINVAL;

    /* hub checkpoints put the stack under backbone.; read model. where that is all */
    lmh_weight_info wi;
    const char *P = h->weight_info(ld, "backbone.embeddings.weight", &wi) != LMH_OK &&
                            h->weight_info(ld, "model.embeddings.weight", &wi) == LMH_OK
                        ? "model."
                        : "backbone.";
    const int64_t H = m->hidden, qd = (int64_t)m->heads * m->head_dim,
                  kd = (int64_t)m->kv_heads * m->head_dim;
    for (int32_t l = 0; l < m->n_layers; l++) {
        layer *L = &m->layers[l];
        char pre[96];
        snprintf(pre, sizeof pre, "%slayers.%d.", P, l);
        L->norm = mx_w(h, ld, l, pre, "norm.weight", H, 0);
        if (!L->norm) return LMH_EINVAL;
        snprintf(pre, sizeof pre, "%slayers.%d.mixer.", P, l);
        switch (L->kind) {
        case K_MAMBA:
            if (m2_load(h, ld, l, pre, c, &L->m2)) return LMH_EINVAL;
            break;
        case K_ATTN: {
            lmh_layer_state st = {.kind = LMH_STATE_KV,
                                  .n_kv_heads = m->kv_heads,
                                  .head_dim_k = m->head_dim,
                                  .head_dim_v = m->head_dim};
            if (h->declare_layer(ld, l, &st)) return LMH_EINVAL;
            L->wq = mx_w(h, ld, l, pre, "q_proj.weight", qd, H);
            L->wk = mx_w(h, ld, l, pre, "k_proj.weight", kd, H);
            L->wv = mx_w(h, ld, l, pre, "v_proj.weight", kd, H);
            L->wo = mx_w(h, ld, l, pre, "o_proj.weight", H, qd);
            if (!L->wq || !L->wk || !L->wv || !L->wo) return LMH_EINVAL;
            break;
        }
        case K_MLP:
            L->up = mx_w(h, ld, l, pre, "up_proj.weight", m->inter, H);
            L->down = mx_w(h, ld, l, pre, "down_proj.weight", H, m->inter);
            if (mlp_bias) {
                L->up_b = mx_w(h, ld, l, pre, "up_proj.bias", m->inter, 0);
                L->down_b = mx_w(h, ld, l, pre, "down_proj.bias", H, 0);
            }
            if (!L->up || !L->down || (mlp_bias && (!L->up_b || !L->down_b))) return LMH_EINVAL;
            break;
        default:
            if (load_moe(h, ld, m, l, pre, mlp_bias)) return LMH_EINVAL;
        }
    }
    char name[96];
    int64_t ene[2] = {m->vocab, H};
    snprintf(name, sizeof name, "%sembeddings.weight", P);
    m->embed = h->weight(ld, LMH_LAYER_INPUT, name, 2, ene);
    snprintf(name, sizeof name, "%snorm_f.weight", P);
    m->norm = h->weight(ld, LMH_LAYER_OUTPUT, name, 1, &H);
    if (!m->embed || !m->norm) return LMH_EINVAL;
    if (h->weight_info(ld, "lm_head.weight", &wi) == LMH_OK)
        m->lm_head = h->weight(ld, LMH_LAYER_OUTPUT, "lm_head.weight", 2, ene);
    else if (tie)
        m->lm_head = m->embed; /* a head-less checkpoint that says it is tied */
    else
        return h->fail(ld, "missing tensor lm_head.weight (tie_word_embeddings is false)");
    return m->lm_head ? LMH_OK : LMH_EINVAL;
}

typedef struct moe_scratch {
    lmh_tensor *rl, *sc, *rw, *ri, *gl, *lw, *sw, *i2, *oh, *w, *xl, *eu, *ey, *ol, *su, *sd;
} moe_scratch;

static moe_scratch moe_scratch_new(lmh_build *b, int64_t n, const lmh_model *m) {
    const int64_t k = m->top_k, I = m->moe_inter, Hin = m->latent ? m->latent : m->hidden;
    int64_t nk[2] = {n, k}, nk1[3] = {n, k, 1}, nkk[3] = {n, k, k}, nki[3] = {n, k, I},
            nkh[3] = {n, k, Hin};
    moe_scratch s = {.rl = lmh_b_new2(b, n, m->n_experts),
                     .sc = lmh_b_new2(b, n, m->n_experts),
                     .rw = lmh_b_new(b, 2, nk),
                     .ri = b->h->fwd_tensor(b->f, b->layer, LMH_I32, 2, nk),
                     .gl = lmh_b_new(b, 3, nk1),
                     .lw = lmh_b_new(b, 2, nk),
                     .sw = lmh_b_new(b, 2, nk),
                     .i2 = b->h->fwd_tensor(b->f, b->layer, LMH_I32, 2, nk),
                     .oh = lmh_b_new(b, 3, nkk),
                     .w = lmh_b_new(b, 2, nk),
                     .eu = lmh_b_new(b, 3, nki),
                     .ey = lmh_b_new(b, 3, nkh),
                     .su = lmh_b_new2(b, n, m->shared_inter),
                     .sd = lmh_b_new2(b, n, m->hidden)};
    if (m->latent) {
        s.xl = lmh_b_new2(b, n, m->latent);
        s.ol = lmh_b_new2(b, n, m->latent);
    }
    return s;
}

static lmh_tensor *unary(lmh_build *b, lmh_tensor *dst, lmh_tensor *x, int fn) {
    if (!dst || !x) return NULL;
    lmh_op op = {.code = LMH_OP_UNARY, .dst = dst, .src = {x}};
    op.p.i[0] = fn;
    return b->h->fwd_op(b->f, b->layer, &op) == LMH_OK ? dst : NULL;
}

static lmh_tensor *route(lmh_build *b, lmh_tensor *w, lmh_tensor *ids, lmh_tensor *logits,
                         int32_t k, int renorm) {
    if (!w || !ids || !logits) return NULL;
    lmh_op op = {.code = LMH_OP_MOE_ROUTE, .dst = w, .src = {logits, ids}};
    op.p.i[0] = k;
    op.p.i[1] = renorm;
    return b->h->fwd_op(b->f, b->layer, &op) == LMH_OK ? w : NULL;
}

/* out [n, H] = the MoE block over hn [n, H], with only the existing ops:
 *  1. choice: MOE_ROUTE's softmax keeps the order of its input, so routing on
 *     sigmoid(logits) + bias picks the same top k as transformers (its weights unused);
 *  2. each chosen expert's logit again, as a moe_matmul over the router seen as E
 *     experts of one row, and its score sigmoid(logit);
 *  3. renormalised scores s_j / sum s: the softmax of log s_j = -softplus(-logit), which
 *     a second MOE_ROUTE (k of k) gives best first with its slot order; a moe_matmul of
 *     the unit columns (eye) by that order and a sum over the k rows (fold) put them back
 *     in step 1's slots (products by 1 and sums with 0: no rounding);
 *  4. relu^2 experts on those weights times routed_scaling_factor, plus the shared one. */
static lmh_tensor *moe_forward(lmh_build *b, const lmh_model *m, const layer *L,
                               const moe_scratch *s, lmh_tensor *hn, lmh_tensor *out) {
    const lmh_host_api *h = b->h;
    const int64_t n = hn->ne[0], k = m->top_k, H = m->hidden;
    lmh_b_matmul_exact(b, s->rl, hn, L->gate, NULL);
    unary(b, s->sc, s->rl, LMH_UNARY_SIGMOID);
    if (L->gate_bias) lmh_b_op(b, LMH_OP_ADD, s->sc, s->sc, L->gate_bias, NULL);
    if (!route(b, s->rw, s->ri, s->sc, m->top_k, 0)) return NULL;
    int64_t gne[3] = {m->n_experts, 1, H}, nk[2] = {n, k}, nk1[3] = {n, k, 1}, nkk[2] = {n, k * k};
    lmh_tensor *g3 = h->fwd_view(b->f, L->gate, 0, 3, gne);
    lmh_b_op(b, LMH_OP_MOE_MATMUL, s->gl, hn, g3, s->ri);
    lmh_tensor *gl = s->gl ? h->fwd_view(b->f, s->gl, 0, 2, nk) : NULL;
    if (m->norm_topk) { /* (one expert: the softmax of one value, 1) */
        lmh_b_scale(b, s->lw, gl, -1.0f);
        unary(b, s->lw, s->lw, LMH_UNARY_SOFTPLUS);
        lmh_b_scale(b, s->lw, s->lw, -1.0f);
        route(b, s->sw, s->i2, s->lw, m->top_k, 1);
        lmh_tensor *sw3 = s->sw ? h->fwd_view(b->f, s->sw, 0, 3, nk1) : NULL;
        lmh_b_op(b, LMH_OP_MOE_MATMUL, s->oh, sw3, L->eye, s->i2);
        lmh_tensor *oh2 = s->oh ? h->fwd_view(b->f, s->oh, 0, 2, nkk) : NULL;
        lmh_b_matmul(b, s->w, oh2, L->fold, NULL);
    } else {
        unary(b, s->w, gl, LMH_UNARY_SIGMOID);
    }
    if (m->route_scale != 1.0f) lmh_b_scale(b, s->w, s->w, m->route_scale);
    lmh_tensor *xe = hn;
    if (m->latent) xe = lmh_b_matmul(b, s->xl, hn, L->lat_in, L->lat_in_b);
    lmh_b_op(b, LMH_OP_MOE_MATMUL, s->eu, xe, L->eup, s->ri);
    unary(b, s->eu, s->eu, LMH_UNARY_RELU2);
    lmh_b_op(b, LMH_OP_MOE_MATMUL, s->ey, s->eu, L->edown, s->ri);
    if (m->latent) {
        lmh_b_op(b, LMH_OP_MOE_COMBINE, s->ol, s->ey, s->w, NULL);
        lmh_b_matmul(b, out, s->ol, L->lat_out, L->lat_out_b);
    } else {
        lmh_b_op(b, LMH_OP_MOE_COMBINE, out, s->ey, s->w, NULL);
    }
    lmh_b_matmul(b, s->su, hn, L->up, L->up_b);
    unary(b, s->su, s->su, LMH_UNARY_RELU2);
    lmh_b_matmul(b, s->sd, s->su, L->down, L->down_b);
    return lmh_b_op(b, LMH_OP_ADD, out, out, s->sd, NULL);
}

static int forward(lmh_model *m, const lmh_host_api *h, lmh_fwd *f, const lmh_batch *bt) {
    const int64_t n = bt->n_rows, H = m->hidden, hd = m->head_dim;
    const int64_t qd = (int64_t)m->heads * hd, kd = (int64_t)m->kv_heads * hd;
    lmh_build b = {.h = h, .f = f, .layer = LMH_LAYER_INPUT};
    lmh_tensor *x = lmh_b_get_rows(&b, NULL, m->embed, bt->tokens);
    /* Scratch reused by every layer (ops run in order on one queue), made only for the
     * kinds of layer the model has. */
    lmh_tensor *hn = lmh_b_new2(&b, n, H), *o = lmh_b_new2(&b, n, H);
    lmh_tensor *q = NULL, *k = NULL, *v = NULL, *att = NULL, *u = NULL;
    lmh_tensor *q3 = NULL, *k3 = NULL, *v3 = NULL, *att3 = NULL;
    if (m->n_kind[K_ATTN]) {
        q = lmh_b_new2(&b, n, qd);
        k = lmh_b_new2(&b, n, kd);
        v = lmh_b_new2(&b, n, kd);
        att = lmh_b_new2(&b, n, qd);
        q3 = lmh_b_heads(&b, q, m->heads, hd);
        k3 = lmh_b_heads(&b, k, m->kv_heads, hd);
        v3 = lmh_b_heads(&b, v, m->kv_heads, hd);
        att3 = lmh_b_heads(&b, att, m->heads, hd);
    }
    m2_scratch s2 = {0};
    if (m->n_kind[K_MAMBA]) s2 = m2_scratch_new(&b, n, &m->c2);
    if (m->n_kind[K_MLP]) u = lmh_b_new2(&b, n, m->inter);
    moe_scratch se = {0};
    if (m->n_kind[K_MOE]) se = moe_scratch_new(&b, n, m);
    const float scale = 1.0f / sqrtf((float)(hd ? hd : 1));
    for (int32_t l = 0; l < m->n_layers; l++) {
        const layer *L = &m->layers[l];
        b.layer = l;
        lmh_b_rms_norm(&b, hn, x, L->norm, m->eps, 0);
        switch (L->kind) {
        case K_MAMBA:
            if (!m2_forward(&b, &m->c2, &L->m2, &s2, hn, NULL, o)) return LMH_EINVAL;
            break;
        case K_ATTN: {
            /* no rope: keys and values go to the cache as projected */
            lmh_b_matmul(&b, q, hn, L->wq, NULL);
            lmh_b_matmul(&b, k, hn, L->wk, NULL);
            lmh_b_matmul(&b, v, hn, L->wv, NULL);
            lmh_attn_params ap = {.scale = scale, .softcap = 0, .window = 0};
            if (!q3 || !k3 || !v3 || !att3 ||
                h->fwd_attention(f, l, q3, k3, v3, att3, &ap) != LMH_OK)
                return LMH_EINVAL;
            lmh_b_matmul(&b, o, att, L->wo, NULL);
            break;
        }
        case K_MLP:
            lmh_b_matmul(&b, u, hn, L->up, L->up_b);
            unary(&b, u, u, LMH_UNARY_RELU2);
            lmh_b_matmul(&b, o, u, L->down, L->down_b);
            break;
        default:
            if (!moe_forward(&b, m, L, &se, hn, o)) return LMH_EINVAL;
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
    .name = "nemotron_h",
    .version = "0.1.0",
    .summary = "nemotron_h: single-purpose blocks of Mamba-2 (grouped gated norm), rope-free "
               "attention, relu^2 MLP or sigmoid-routed relu^2 experts",
    .init = NULL,
    .api = &api,
};

LMH_EXPORT const lmh_plugin_info *lmhost_plugin_entry(void) {
    return &info;
}
