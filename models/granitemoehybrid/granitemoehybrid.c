/* IBM Granite 4.0-H: hybrid Mamba-2 / attention decoders with mixture-of-experts MLPs,
 * model_type granitemoehybrid.
 *
 * Each layer is EITHER a Mamba-2 mixer or grouped-query attention (layer_types, "mamba" /
 * "linear_attention" or "attention" / "full_attention"; all Mamba when absent), then a
 * MoE block beside an always-on shared SwiGLU MLP:
 *   x = embedding_multiplier * embed(tokens)
 *   x += residual_multiplier * mixer_or_attn(RMSNorm(x))
 *   x += residual_multiplier * (moe(h) + shared_mlp(h)),  h = RMSNorm(x)
 *   logits = lm_head(RMSNorm(x)) / logits_scaling
 * Unlike Llama-style models the attention's logit scale is attention_multiplier (not
 * 1/sqrt(head_dim)), rope is optional (position_embedding_type "rope"; absent or "nope":
 * no positions at all, the Mamba layers order the tokens), the router softmaxes its top-k
 * logits only, and num_local_experts 0 leaves the shared MLP alone (dense). The mixer's
 * gated norm is y * silu(z) then one RMSNorm over the whole row whatever n_groups. Only
 * attention layers keep keys and values; Mamba layers keep recurrent state.
 * Checkpoints: the Hugging Face layout (block_sparse_moe.{router.layer,input_linear,
 * output_linear}, shared_mlp.{input_linear,output_linear}, fused gate|up halves) and
 * mlx-lm's (block_sparse_moe.switch_mlp.{gate,up,down}_proj, dense models' mlp.*,
 * [C, K, 1] convolutions, quantized projections). */
#include "lmhost/lmhost.h"
#include "mixers.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct layer {
    int attn; /* attention, else Mamba-2 */
    lmh_tensor *ln1, *ln2;
    lmh_tensor *wq, *wk, *wv, *wo, *bq, *bk, *bv, *bo;
    m2_layer m2;
    lmh_tensor *router, *egu, *eg, *eu, *ed; /* experts: fused gate|up or split (MLX) */
    lmh_tensor *sgu, *sg, *su, *sd;          /* shared MLP: fused gate|up or split (MLX) */
} layer;

struct lmh_model {
    int32_t n_layers, hidden, heads, kv_heads, head_dim, inter, shared, vocab;
    int32_t n_experts, top_k;
    float eps, emb_mult, res_mult, attn_scale, logit_div;
    int rope;
    m2_cfg c2;
    lmh_tensor *embed, *norm, *lm_head, *inv_freq;
    float rope_factor;
    layer *layers;
};

static const char *const model_types[] = {"granitemoehybrid", NULL};

static void unload(lmh_model *m) {
    if (!m) return;
    free(m->layers); /* tensors belong to the host */
    free(m);
}

static lmh_tensor *w(const lmh_host_api *h, lmh_load_ctx *ld, int32_t l, const char *fmt,
                     int64_t d0, int64_t d1) {
    char name[256];
    snprintf(name, sizeof name, fmt, l);
    int64_t ne[2] = {d0, d1};
    return h->weight(ld, l, name, d1 ? 2 : 1, ne);
}

static int has(const lmh_host_api *h, lmh_load_ctx *ld, int32_t l, const char *fmt) {
    char name[256];
    lmh_weight_info wi;
    snprintf(name, sizeof name, fmt, l);
    return h->weight_info(ld, name, &wi) == LMH_OK;
}

/* Stacked experts [E, d0, d1]. */
static lmh_tensor *w3(const lmh_host_api *h, lmh_load_ctx *ld, int32_t l, const char *fmt,
                      int64_t E, int64_t d0, int64_t d1) {
    char name[256];
    snprintf(name, sizeof name, fmt, l);
    int64_t ne[3] = {E, d0, d1};
    return h->weight(ld, l, name, 3, ne);
}

/* Layer l's kind from layer_types (or the older layers_block_type); all Mamba when neither
 * is given, as GraniteMoeHybridConfig. */
static int layer_kind(const lmh_host_api *h, lmh_load_ctx *ld, int32_t l, int32_t n_layers,
                      int *attn) {
    const char *key = "layer_types";
    int64_t len = 0;
    int rc = h->cfg_len(ld, key, &len);
    if (rc == LMH_ENOTFOUND) {
        key = "layers_block_type";
        rc = h->cfg_len(ld, key, &len);
    }
    *attn = 0;
    if (rc == LMH_ENOTFOUND) return 0;
    if (rc != LMH_OK) return h->fail(ld, "config.json: %s must be a list of layer type names", key);
    if (len != n_layers)
        return h->fail(ld, "config.json: %s has %lld entries for %d layers", key, (long long)len,
                       n_layers);
    char k[64];
    const char *t = NULL;
    snprintf(k, sizeof k, "%s.%d", key, l);
    if (h->cfg_str(ld, k, &t) != LMH_OK)
        return h->fail(ld, "config.json: %s[%d] must be a string", key, l);
    if (strcmp(t, "attention") == 0 || strcmp(t, "full_attention") == 0)
        *attn = 1;
    else if (strcmp(t, "mamba") != 0 && strcmp(t, "linear_attention") != 0)
        return h->fail(ld,
                       "config.json: %s[%d] is '%s'; granitemoehybrid layers are 'mamba' "
                       "('linear_attention') or 'attention' ('full_attention')",
                       key, l, t);
    return 0;
}

static int load_mixer_cfg(const lmh_host_api *h, lmh_load_ctx *ld, lmh_model *m) {
    m2_cfg *c = &m->c2;
    int32_t expand = 2;
    *c = (m2_cfg){.hidden = m->hidden, .eps = m->eps, .norm = M2_NORM_GATED};
    c->conv_bias = mx_flag(h, ld, "mamba_conv_bias", 1);
    c->proj_bias = mx_flag(h, ld, "mamba_proj_bias", 0); /* in_proj and out_proj */
    if (mx_int(h, ld, "mamba_expand", 2, &expand) ||
        mx_int(h, ld, "mamba_n_heads", 128, &c->heads) ||
        mx_int(h, ld, "mamba_n_groups", 1, &c->groups) ||
        mx_int(h, ld, "mamba_d_state", 256, &c->state) ||
        mx_int(h, ld, "mamba_d_conv", 4, &c->conv) || m2_dt_limit(h, ld, "time_step_limit", c))
        return LMH_EINVAL;
    if ((int64_t)expand * m->hidden > (1 << 30))
        return h->fail(ld, "config.json: mamba_expand %d is too large", expand);
    c->inner = expand * m->hidden;
    const char *s = NULL;
    if (h->cfg_str(ld, "mamba_d_head", &s) == LMH_OK) {
        if (strcmp(s, "auto") != 0)
            return h->fail(ld, "config.json: mamba_d_head '%s' is neither a number nor auto", s);
        c->head_dim = c->inner / c->heads;
    } else if (mx_int(h, ld, "mamba_d_head", c->inner / c->heads > 0 ? c->inner / c->heads : 1,
                      &c->head_dim)) {
        return LMH_EINVAL;
    }
    if (c->conv < 2 || c->conv > 64)
        return h->fail(ld, "config.json: mamba_d_conv %d is not supported (2 to 64)", c->conv);
    c->norm_group = c->inner; /* GraniteMoeHybridRMSNormGated: one norm over the row */
    return 0;
}

/* A multiplier: finite, 1 when absent. */
static int mult(const lmh_host_api *h, lmh_load_ctx *ld, const char *key, float *out) {
    if (mx_float(h, ld, key, 1.0, out)) return LMH_EINVAL;
    if (!isfinite(*out)) return h->fail(ld, "config.json: %s must be a finite number", key);
    return 0;
}

static int load_layer(const lmh_host_api *h, lmh_load_ctx *ld, lmh_model *m, int32_t l,
                      int attn_bias) {
    layer *L = &m->layers[l];
    const int64_t H = m->hidden, qd = (int64_t)m->heads * m->head_dim,
                  kd = (int64_t)m->kv_heads * m->head_dim, E = m->n_experts, I = m->inter,
                  S = m->shared;
    if (layer_kind(h, ld, l, m->n_layers, &L->attn)) return LMH_EINVAL;
    L->ln1 = w(h, ld, l, "model.layers.%d.input_layernorm.weight", H, 0);
    L->ln2 = w(h, ld, l, "model.layers.%d.post_attention_layernorm.weight", H, 0);
    if (!L->ln1 || !L->ln2) return LMH_EINVAL;
    if (L->attn) {
        lmh_layer_state st = {.kind = LMH_STATE_KV,
                              .n_kv_heads = m->kv_heads,
                              .head_dim_k = m->head_dim,
                              .head_dim_v = m->head_dim};
        if (h->declare_layer(ld, l, &st)) return LMH_EINVAL;
        L->wq = w(h, ld, l, "model.layers.%d.self_attn.q_proj.weight", qd, H);
        L->wk = w(h, ld, l, "model.layers.%d.self_attn.k_proj.weight", kd, H);
        L->wv = w(h, ld, l, "model.layers.%d.self_attn.v_proj.weight", kd, H);
        L->wo = w(h, ld, l, "model.layers.%d.self_attn.o_proj.weight", H, qd);
        if (!L->wq || !L->wk || !L->wv || !L->wo) return LMH_EINVAL;
        if (attn_bias && (!(L->bq = w(h, ld, l, "model.layers.%d.self_attn.q_proj.bias", qd, 0)) ||
                          !(L->bk = w(h, ld, l, "model.layers.%d.self_attn.k_proj.bias", kd, 0)) ||
                          !(L->bv = w(h, ld, l, "model.layers.%d.self_attn.v_proj.bias", kd, 0)) ||
                          !(L->bo = w(h, ld, l, "model.layers.%d.self_attn.o_proj.bias", H, 0))))
            return LMH_EINVAL;
    } else {
        char pre[96];
        snprintf(pre, sizeof pre, "model.layers.%d.mamba.", l);
        if (m2_load(h, ld, l, pre, &m->c2, &L->m2)) return LMH_EINVAL; /* declares its state */
    }
    if (E) {
        L->router = w(h, ld, l, "model.layers.%d.block_sparse_moe.router.layer.weight", E, H);
        if (has(h, ld, l, "model.layers.%d.block_sparse_moe.switch_mlp.gate_proj.weight")) {
            L->eg = w3(h, ld, l, "model.layers.%d.block_sparse_moe.switch_mlp.gate_proj.weight", E,
                       I, H);
            L->eu =
                w3(h, ld, l, "model.layers.%d.block_sparse_moe.switch_mlp.up_proj.weight", E, I, H);
            L->ed = w3(h, ld, l, "model.layers.%d.block_sparse_moe.switch_mlp.down_proj.weight", E,
                       H, I);
            if (!L->eg || !L->eu) return LMH_EINVAL;
        } else {
            L->egu =
                w3(h, ld, l, "model.layers.%d.block_sparse_moe.input_linear.weight", E, 2 * I, H);
            L->ed = w3(h, ld, l, "model.layers.%d.block_sparse_moe.output_linear.weight", E, H, I);
            if (!L->egu) return LMH_EINVAL;
        }
        if (!L->router || !L->ed) return LMH_EINVAL;
    }
    /* the shared MLP; mlx-lm renames a dense model's to mlp.{gate,up,down}_proj */
    if (E == 0 && !has(h, ld, l, "model.layers.%d.shared_mlp.input_linear.weight") &&
        has(h, ld, l, "model.layers.%d.mlp.gate_proj.weight")) {
        L->sg = w(h, ld, l, "model.layers.%d.mlp.gate_proj.weight", S, H);
        L->su = w(h, ld, l, "model.layers.%d.mlp.up_proj.weight", S, H);
        L->sd = w(h, ld, l, "model.layers.%d.mlp.down_proj.weight", H, S);
        return L->sg && L->su && L->sd ? 0 : LMH_EINVAL;
    }
    L->sgu = w(h, ld, l, "model.layers.%d.shared_mlp.input_linear.weight", 2 * S, H);
    L->sd = w(h, ld, l, "model.layers.%d.shared_mlp.output_linear.weight", H, S);
    return L->sgu && L->sd ? 0 : LMH_EINVAL;
}

static int load(const lmh_host_api *h, lmh_load_ctx *ld, lmh_model **out) {
    if (h->abi_minor < 7 || h->size < offsetof(lmh_host_api, fwd_recurrent) + sizeof(void *))
        return h->fail(ld, "this host keeps no recurrent state (plugin ABI 1.7)");
    lmh_model *m = calloc(1, sizeof *m);
    if (!m) return h->fail(ld, "out of memory");
    *out = m;
    /* absent keys take GraniteMoeHybridConfig's defaults */
    if (mx_int(h, ld, "hidden_size", 4096, &m->hidden) ||
        mx_int(h, ld, "num_hidden_layers", 32, &m->n_layers) ||
        mx_int(h, ld, "num_attention_heads", 32, &m->heads) ||
        mx_int(h, ld, "num_key_value_heads", m->heads, &m->kv_heads) ||
        mx_int(h, ld, "head_dim", m->hidden / m->heads > 0 ? m->hidden / m->heads : 1,
               &m->head_dim) ||
        mx_int(h, ld, "intermediate_size", 11008, &m->inter) ||
        mx_int(h, ld, "shared_intermediate_size", 1024, &m->shared) ||
        mx_int(h, ld, "vocab_size", 32000, &m->vocab))
        return LMH_EINVAL;
    if (m->heads % m->kv_heads)
        return h->fail(ld,
                       "config.json: num_attention_heads %d is not a multiple of "
                       "num_key_value_heads %d",
                       m->heads, m->kv_heads);
    if (m->head_dim > 2048 || m->head_dim % 2)
        return h->fail(ld, "config.json: head_dim %d is not supported", m->head_dim);
    double eps = 1e-6;
    if (h->cfg_float(ld, "rms_norm_eps", &eps) == LMH_ETYPE || !(eps > 0))
        return h->fail(ld, "config.json: rms_norm_eps must be a positive number");
    m->eps = (float)eps;
    const char *act = "silu";
    if (h->cfg_str(ld, "hidden_act", &act) == LMH_ETYPE || strcmp(act, "silu") != 0)
        return h->fail(ld, "config.json: hidden_act '%s' is not supported (Granite uses silu)",
                       act);
    float logits_scaling;
    if (mult(h, ld, "embedding_multiplier", &m->emb_mult) ||
        mult(h, ld, "residual_multiplier", &m->res_mult) ||
        mult(h, ld, "attention_multiplier", &m->attn_scale) ||
        mult(h, ld, "logits_scaling", &logits_scaling))
        return LMH_EINVAL;
    if (logits_scaling == 0) return h->fail(ld, "config.json: logits_scaling must not be 0");
    m->logit_div = logits_scaling;
    /* experts: 8 when absent; 0 is a dense model (the shared MLP alone) */
    int64_t E = 8, k = 2;
    if (h->cfg_int(ld, "num_local_experts", &E) == LMH_ETYPE || E < 0 || E > (1 << 16))
        return h->fail(ld, "config.json: num_local_experts must be an integer from 0 to 65536");
    m->n_experts = (int32_t)E;
    if (E > 0) {
        if (h->cfg_int(ld, "num_experts_per_tok", &k) == LMH_ETYPE || k < 1 || k > E)
            return h->fail(ld, "config.json: num_experts_per_tok must be 1 to %lld", (long long)E);
        m->top_k = (int32_t)k;
    }
    const char *pe = NULL;
    int rc = h->cfg_str(ld, "position_embedding_type", &pe);
    if (rc == LMH_ETYPE)
        return h->fail(ld, "config.json: position_embedding_type must be a string or null");
    m->rope = rc == LMH_OK && strcmp(pe, "rope") == 0;
    if (rc == LMH_OK && !m->rope && strcmp(pe, "nope") != 0)
        return h->fail(ld,
                       "config.json: position_embedding_type '%s' is not supported (rope "
                       "or nope)",
                       pe);
    if (load_mixer_cfg(h, ld, m)) return LMH_EINVAL;
    const int attn_bias = mx_flag(h, ld, "attention_bias", 0),
              tie = mx_flag(h, ld, "tie_word_embeddings", 0);

    if (h->declare_model(ld, m->n_layers, m->vocab)) return LMH_EINVAL;
    /* (ABI 1.11) experts the host may stream from disk; the router takes lmh_batch.moe_top_k */
    if (m->n_experts > 1 && h->abi_minor >= 11 && h->declare_moe(ld, m->n_experts, m->top_k))
        return LMH_EINVAL;
    m->layers = calloc((size_t)m->n_layers, sizeof *m->layers);
    if (!m->layers) return h->fail(ld, "out of memory");
    for (int32_t l = 0; l < m->n_layers; l++)
        if (load_layer(h, ld, m, l, attn_bias)) return LMH_EINVAL;
    const int64_t H = m->hidden;
    int64_t ene[2] = {m->vocab, H};
    m->embed = h->weight(ld, LMH_LAYER_INPUT, "model.embed_tokens.weight", 2, ene);
    m->norm = h->weight(ld, LMH_LAYER_OUTPUT, "model.norm.weight", 1, &H);
    if (!m->embed || !m->norm) return LMH_EINVAL;
    lmh_weight_info wi;
    if (tie) {
        m->lm_head = m->embed;
    } else if (h->weight_info(ld, "lm_head.weight", &wi) != LMH_OK) {
        return h->fail(ld, "missing tensor lm_head.weight (tie_word_embeddings is false)");
    } else if (!(m->lm_head = h->weight(ld, LMH_LAYER_OUTPUT, "lm_head.weight", 2, ene))) {
        return LMH_EINVAL;
    }
    if (!m->rope) return LMH_OK;
    float inv[1024];
    lmh_rope_info ri = {.attn_factor = 1.0f, .n_pairs = m->head_dim / 2};
    if (h->rope_freqs(ld, NULL, m->head_dim, inv, &ri)) return LMH_EINVAL;
    int64_t nf = m->head_dim / 2;
    m->inv_freq = h->constant(ld, LMH_LAYER_INPUT, LMH_F32, 1, &nf, inv);
    m->rope_factor = ri.attn_factor;
    return m->inv_freq ? LMH_OK : LMH_EINVAL;
}

/* t *= s unless s is 1. */
static void scale_by(lmh_build *b, lmh_tensor *t, float s) {
    if (t && s != 1.0f) lmh_b_scale(b, t, t, s);
}

static int forward(lmh_model *m, const lmh_host_api *h, lmh_fwd *f, const lmh_batch *bt) {
    const int64_t n = bt->n_rows, H = m->hidden, hd = m->head_dim, S = m->shared;
    const int64_t qd = (int64_t)m->heads * hd, kd = (int64_t)m->kv_heads * hd;
    lmh_build b = {.h = h, .f = f, .layer = LMH_LAYER_INPUT};
    lmh_tensor *x = lmh_b_get_rows(&b, NULL, m->embed, bt->tokens);
    scale_by(&b, x, m->emb_mult);
    /* scratch shared by every layer: ops run in order */
    lmh_tensor *hn = lmh_b_new2(&b, n, H), *o = lmh_b_new2(&b, n, H), *o2 = lmh_b_new2(&b, n, H),
               *sgu = lmh_b_new2(&b, n, 2 * S), *sa = lmh_b_new2(&b, n, S);
    lmh_tensor *q = lmh_b_new2(&b, n, qd), *k = lmh_b_new2(&b, n, kd), *v = lmh_b_new2(&b, n, kd),
               *att = lmh_b_new2(&b, n, qd);
    lmh_tensor *q3 = lmh_b_heads(&b, q, m->heads, hd), *k3 = lmh_b_heads(&b, k, m->kv_heads, hd),
               *v3 = lmh_b_heads(&b, v, m->kv_heads, hd),
               *att3 = lmh_b_heads(&b, att, m->heads, hd);
    m2_scratch s2 = m2_scratch_new(&b, n, &m->c2);
    /* routing [n, k] and expert activations [n, k, 2I | I | H] */
    lmh_tensor *rl = NULL, *rw = NULL, *ri = NULL, *egu = NULL, *ea = NULL, *ey = NULL;
    if (m->n_experts) {
        int64_t kk = m->top_k, ine[2] = {n, kk}, gne[3] = {n, kk, 2 * (int64_t)m->inter},
                ane[3] = {n, kk, m->inter}, yne[3] = {n, kk, H};
        rl = lmh_b_new2(&b, n, m->n_experts);
        rw = lmh_b_new(&b, 2, ine);
        ri = h->fwd_tensor(f, b.layer, LMH_I32, 2, ine);
        egu = lmh_b_new(&b, 3, gne);
        ea = lmh_b_new(&b, 3, ane);
        ey = lmh_b_new(&b, 3, yne);
    }
    for (int32_t l = 0; l < m->n_layers; l++) {
        const layer *L = &m->layers[l];
        b.layer = l;
        lmh_b_rms_norm(&b, hn, x, L->ln1, m->eps, 0);
        if (L->attn) {
            lmh_b_matmul(&b, q, hn, L->wq, L->bq);
            lmh_b_matmul(&b, k, hn, L->wk, L->bk);
            lmh_b_matmul(&b, v, hn, L->wv, L->bv);
            if (m->rope) {
                lmh_b_rope(&b, q3, bt->positions, m->inv_freq, (int32_t)hd, LMH_ROPE_HALF,
                           m->rope_factor);
                lmh_b_rope(&b, k3, bt->positions, m->inv_freq, (int32_t)hd, LMH_ROPE_HALF,
                           m->rope_factor);
            }
            lmh_attn_params ap = {.scale = m->attn_scale, .softcap = 0, .window = 0};
            if (!q3 || h->fwd_attention(f, l, q3, k3, v3, att3, &ap) != LMH_OK) return LMH_EINVAL;
            lmh_b_matmul(&b, o, att, L->wo, L->bo);
        } else if (!m2_forward(&b, &m->c2, &L->m2, &s2, hn, NULL, o)) {
            return LMH_EINVAL;
        }
        scale_by(&b, o, m->res_mult);
        lmh_b_op(&b, LMH_OP_ADD, x, x, o, NULL);
        lmh_b_rms_norm(&b, hn, x, L->ln2, m->eps, 0);
        /* the shared MLP: o, or o2 beside the experts */
        lmh_tensor *so = L->router ? o2 : o;
        if (L->sgu) {
            lmh_b_matmul(&b, sgu, hn, L->sgu, NULL);
            lmh_b_op(&b, LMH_OP_SWIGLU, sa, sgu, NULL, NULL); /* silu(gate half) * up half */
        } else {
            if (!sgu) return LMH_EINVAL;
            lmh_tensor *sg = b.h->fwd_view(b.f, sgu, 0, 2, (int64_t[]){n, S});
            lmh_b_matmul(&b, sg, hn, L->sg, NULL);
            lmh_b_matmul(&b, sa, hn, L->su, NULL);
            lmh_b_op(&b, LMH_OP_SWIGLU, sa, sg, sa, NULL);
        }
        lmh_b_matmul(&b, so, sa, L->sd, NULL);
        if (L->router) {
            lmh_b_matmul_exact(&b, rl, hn, L->router, NULL);
            /* softmax over the top-k logits = softmax over all, renormalised over the k */
            lmh_op route = {.code = LMH_OP_MOE_ROUTE, .dst = rw, .src = {rl, ri}};
            route.p.i[0] = m->top_k;
            route.p.i[1] = 1;
            if (h->abi_minor >= 11) route.src[2] = bt->moe_top_k; /* fewer experts a row */
            if (!rl || !rw || !ri || h->fwd_op(f, l, &route) != LMH_OK) return LMH_EINVAL;
            if (L->egu) {
                lmh_b_op(&b, LMH_OP_MOE_MATMUL, egu, hn, L->egu, ri);
                lmh_b_op(&b, LMH_OP_SWIGLU, ea, egu, NULL, NULL);
            } else { /* gate in egu's first half, up in ea */
                if (!egu || !ea) return LMH_EINVAL;
                lmh_tensor *eg = b.h->fwd_view(b.f, egu, 0, 3, ea->ne);
                lmh_b_op(&b, LMH_OP_MOE_MATMUL, eg, hn, L->eg, ri);
                lmh_b_op(&b, LMH_OP_MOE_MATMUL, ea, hn, L->eu, ri);
                lmh_b_op(&b, LMH_OP_SWIGLU, ea, eg, ea, NULL);
            }
            lmh_b_op(&b, LMH_OP_MOE_MATMUL, ey, ea, L->ed, ri);
            lmh_b_op(&b, LMH_OP_MOE_COMBINE, o, ey, rw, NULL);
            lmh_b_op(&b, LMH_OP_ADD, o, o, o2, NULL);
        }
        scale_by(&b, o, m->res_mult);
        if (!lmh_b_op(&b, LMH_OP_ADD, x, x, o, NULL)) return LMH_EINVAL;
    }
    b.layer = LMH_LAYER_OUTPUT;
    lmh_tensor *xo = lmh_b_get_rows(&b, NULL, x, bt->out_rows);
    lmh_tensor *hf = lmh_b_rms_norm(&b, NULL, xo, m->norm, m->eps, 0);
    /* the head has no bias: dividing its input is dividing the logits */
    scale_by(&b, hf, 1.0f / m->logit_div);
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
    .name = "granitemoehybrid",
    .version = "0.1.0",
    .summary = "IBM Granite 4.0-H: Mamba-2 or attention layers, routed experts beside a shared "
               "MLP, Granite multipliers",
    .init = NULL,
    .api = &api,
};

LMH_EXPORT const lmh_plugin_info *lmhost_plugin_entry(void) {
    return &info;
}
