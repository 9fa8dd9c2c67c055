/* Falcon-H1 (TII): parallel hybrid decoders, model_type falcon_h1.
 *
 * Every layer runs grouped-query attention AND a Mamba-2 mixer side by side on the same
 * normed input and adds both to the residual stream, then a SwiGLU MLP:
 *   h = RMSNorm(x)
 *   x += ssm_out * mamba2(ssm_in * h, in_proj's output * mup)
 *      + attn_out * o(attn(rope(q), rope(key_mult * k), v) of attn_in * h)
 *   x += down_mult * down(silu(gate_mult * gate(h2)) * up(h2)),  h2 = RMSNorm(x)
 *   logits = lm_head_mult * lm_head(RMSNorm(x)),  x0 = embedding_mult * embed(tokens)
 * The muP multipliers are what set it apart from a plain hybrid; mup is ssm_multipliers
 * spread over in_proj's z, x, B, C and dt columns. The mixer is common/mixers.h's Mamba-2
 * with mamba_d_ssm channels (may differ from expand * hidden), its gated RMSNorm optional
 * (mamba_rms_norm), over n_groups groups, before or after the gate
 * (mamba_norm_before_gate); in_proj's bias follows mamba_proj_bias, out_proj's
 * projectors_bias. Each layer keeps keys and values AND recurrent state.
 * Checkpoints: the Hugging Face layout (model.layers.N.{self_attn,mamba,feed_forward}.*),
 * and mlx-lm's ([C, K, 1] convolution weights), whose converter folds the multipliers into
 * the weights except key_multiplier and attention_in_multiplier's share of v_proj. */
#include "lmhost/lmhost.h"
#include "mixers.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct layer {
    lmh_tensor *ln1, *ln2;
    lmh_tensor *wq, *wk, *wv, *wo, *bq, *bk, *bv, *bo;
    lmh_tensor *wg, *wu, *wd, *bg, *bu, *bd;
    lmh_tensor *mup; /* in_proj's column multipliers (x ssm_in where exact), or NULL */
    m2_layer m2;
} layer;

struct lmh_model {
    int32_t n_layers, hidden, heads, kv_heads, head_dim, inter, vocab;
    float eps;
    /* multipliers applied at run time (1 where folded into weights) */
    float emb_mult, lm_mult, attn_in, attn_out, attn_scale, ssm_in, ssm_out, gate_mult, down_mult;
    m2_cfg c2;
    lmh_tensor *embed, *norm, *lm_head, *inv_freq;
    float rope_factor;
    layer *layers;
};

static const char *const model_types[] = {"falcon_h1", NULL};

static void unload(lmh_model *m) {
    if (!m) return;
    free(m->layers); /* tensors belong to the host */
    free(m);
}

/* A list of n numbers (ssm_multipliers, mlp_multipliers); all 1 when absent or null. */
static int mult_list(const lmh_host_api *h, lmh_load_ctx *ld, const char *key, int n, float *out) {
    for (int i = 0; i < n; i++) out[i] = 1.0f;
    int64_t len = 0;
    int rc = h->cfg_len(ld, key, &len);
    if (rc == LMH_ENOTFOUND) return 0;
    if (rc != LMH_OK || len != n)
        return h->fail(ld, "config.json: %s must be a list of %d numbers", key, n);
    for (int i = 0; i < n; i++) {
        char k[96];
        double v;
        snprintf(k, sizeof k, "%s.%d", key, i);
        if (h->cfg_float(ld, k, &v) != LMH_OK || !isfinite(v))
            return h->fail(ld, "config.json: %s must be a list of %d numbers", key, n);
        out[i] = (float)v;
    }
    return 0;
}

/* A finite multiplier, 1 when absent. */
static int mult(const lmh_host_api *h, lmh_load_ctx *ld, const char *key, float *out) {
    if (mx_float(h, ld, key, 1.0, out)) return LMH_EINVAL;
    if (!isfinite(*out)) return h->fail(ld, "config.json: %s must be a finite number", key);
    return 0;
}

/* num_key_value_heads: FalconH1Config takes 8 when absent but num_attention_heads when
 * null, which config.json lookups do not tell apart: k_proj's rows decide, else 8. */
static int kv_heads(const lmh_host_api *h, lmh_load_ctx *ld, int32_t head_dim, int32_t *out) {
    int64_t v = 0;
    if (h->cfg_int(ld, "num_key_value_heads", &v) != LMH_ENOTFOUND)
        return mx_int(h, ld, "num_key_value_heads", 0, out);
    lmh_weight_info wi;
    if (h->weight_info(ld, "model.layers.0.self_attn.k_proj.weight", &wi) == LMH_OK &&
        wi.ndim == 2 && wi.ne[0] > 0 && wi.ne[0] % head_dim == 0 &&
        wi.ne[0] / head_dim <= (1 << 20)) {
        *out = (int32_t)(wi.ne[0] / head_dim);
        return 0;
    }
    *out = 8;
    return 0;
}

static lmh_tensor *w(const lmh_host_api *h, lmh_load_ctx *ld, int32_t l, const char *fmt,
                     int64_t d0, int64_t d1) {
    char name[256];
    snprintf(name, sizeof name, fmt, l);
    int64_t ne[2] = {d0, d1};
    return h->weight(ld, l, name, d1 ? 2 : 1, ne);
}

/* The mixer's channels: mamba_d_ssm, else (absent or null, which config.json lookups do
 * not tell apart) out_proj's input width, else mamba_expand * hidden_size. */
static int ssm_inner(const lmh_host_api *h, lmh_load_ctx *ld, int32_t hidden, int32_t *out) {
    int64_t v = 0;
    if (h->cfg_int(ld, "mamba_d_ssm", &v) != LMH_ENOTFOUND)
        return mx_int(h, ld, "mamba_d_ssm", 0, out);
    lmh_weight_info wi;
    if (h->weight_info(ld, "model.layers.0.mamba.out_proj.weight", &wi) == LMH_OK && wi.ndim == 2 &&
        wi.ne[1] > 0 && wi.ne[1] <= (1 << 30)) {
        *out = (int32_t)wi.ne[1];
        return 0;
    }
    int32_t expand = 2;
    if (mx_int(h, ld, "mamba_expand", 2, &expand)) return LMH_EINVAL;
    if ((int64_t)expand * hidden > (1 << 30))
        return h->fail(ld, "config.json: mamba_expand %d is too large", expand);
    *out = expand * hidden;
    return 0;
}

static int load_mixer_cfg(const lmh_host_api *h, lmh_load_ctx *ld, lmh_model *m) {
    m2_cfg *c = &m->c2;
    *c = (m2_cfg){.hidden = m->hidden, .eps = m->eps};
    c->conv_bias = mx_flag(h, ld, "mamba_conv_bias", 1);
    if (ssm_inner(h, ld, m->hidden, &c->inner) || mx_int(h, ld, "mamba_n_heads", 128, &c->heads) ||
        mx_int(h, ld, "mamba_n_groups", 1, &c->groups) ||
        mx_int(h, ld, "mamba_d_state", 256, &c->state) ||
        mx_int(h, ld, "mamba_d_conv", 4, &c->conv) || m2_dt_limit(h, ld, "time_step_limit", c))
        return LMH_EINVAL;
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
    if (c->inner % c->groups)
        return h->fail(ld, "config.json: mamba_n_groups %d does not divide the %d channels",
                       c->groups, c->inner);
    /* FalconH1RMSNormGated: the row normed in mamba_n_groups parts, its weight whole */
    c->norm_group = c->inner / c->groups;
    c->norm = !mx_flag(h, ld, "mamba_rms_norm", 0)          ? M2_NORM_NONE
              : mx_flag(h, ld, "mamba_norm_before_gate", 1) ? M2_NORM_BEFORE_GATE
                                                            : M2_NORM_GATED;
    return 0;
}

/* mup over in_proj's columns [z | x | B | C | dt], times `scale`. */
static lmh_tensor *mup_vector(const lmh_host_api *h, lmh_load_ctx *ld, int32_t l, const m2_cfg *c,
                              const float *sm, float scale) {
    const int64_t I = c->inner, GN = (int64_t)c->groups * c->state, P = m2_proj_dim(c);
    const int64_t ends[5] = {I, 2 * I, 2 * I + GN, 2 * I + 2 * GN, P};
    float *v = malloc((size_t)P * sizeof *v);
    if (!v) {
        h->fail(ld, "out of memory");
        return NULL;
    }
    for (int64_t i = 0, part = 0; i < P; i++) {
        while (i >= ends[part]) part++;
        v[i] = sm[part] * scale;
    }
    lmh_tensor *t = h->constant(ld, l, LMH_F32, 1, &P, v);
    free(v);
    return t;
}

static int load(const lmh_host_api *h, lmh_load_ctx *ld, lmh_model **out) {
    if (h->abi_minor < 7 || h->size < offsetof(lmh_host_api, fwd_recurrent) + sizeof(void *))
        return h->fail(ld, "this host keeps no recurrent state (plugin ABI 1.7)");
    lmh_model *m = calloc(1, sizeof *m);
    if (!m) return h->fail(ld, "out of memory");
    *out = m;
    /* absent keys take FalconH1Config's defaults */
    if (mx_int(h, ld, "hidden_size", 4096, &m->hidden) ||
        mx_int(h, ld, "num_hidden_layers", 32, &m->n_layers) ||
        mx_int(h, ld, "num_attention_heads", 32, &m->heads) ||
        mx_int(h, ld, "head_dim", m->hidden / m->heads > 0 ? m->hidden / m->heads : 1,
               &m->head_dim) ||
        kv_heads(h, ld, m->head_dim, &m->kv_heads) ||
        mx_int(h, ld, "intermediate_size", 14336, &m->inter) ||
        mx_int(h, ld, "vocab_size", 128000, &m->vocab))
        return LMH_EINVAL;
    if (m->heads % m->kv_heads)
        return h->fail(ld,
                       "config.json: num_attention_heads %d is not a multiple of "
                       "num_key_value_heads %d",
                       m->heads, m->kv_heads);
    if (m->head_dim > 2048 || m->head_dim % 2)
        return h->fail(ld, "config.json: head_dim %d is not supported", m->head_dim);
    double eps = 1e-5;
    if (h->cfg_float(ld, "rms_norm_eps", &eps) == LMH_ETYPE || !(eps > 0))
        return h->fail(ld, "config.json: rms_norm_eps must be a positive number");
    m->eps = (float)eps;
    const char *act = "silu";
    if (h->cfg_str(ld, "hidden_act", &act) == LMH_ETYPE || strcmp(act, "silu") != 0)
        return h->fail(ld, "config.json: hidden_act '%s' is not supported (Falcon-H1 uses silu)",
                       act);
    float key_mult = 1, sm[5], mm[2];
    if (mult(h, ld, "embedding_multiplier", &m->emb_mult) ||
        mult(h, ld, "lm_head_multiplier", &m->lm_mult) ||
        mult(h, ld, "attention_in_multiplier", &m->attn_in) ||
        mult(h, ld, "attention_out_multiplier", &m->attn_out) ||
        mult(h, ld, "key_multiplier", &key_mult) || mult(h, ld, "ssm_in_multiplier", &m->ssm_in) ||
        mult(h, ld, "ssm_out_multiplier", &m->ssm_out) ||
        mult_list(h, ld, "ssm_multipliers", 5, sm) || mult_list(h, ld, "mlp_multipliers", 2, mm))
        return LMH_EINVAL;
    m->gate_mult = mm[0];
    m->down_mult = mm[1];
    if (load_mixer_cfg(h, ld, m)) return LMH_EINVAL;
    const int attn_bias = mx_flag(h, ld, "attention_bias", 0),
              mlp_bias = mx_flag(h, ld, "mlp_bias", 0),
              in_bias = mx_flag(h, ld, "mamba_proj_bias", 0),
              out_bias = mx_flag(h, ld, "projectors_bias", 0),
              tie = mx_flag(h, ld, "tie_word_embeddings", 0);

    /* mlx-lm's layout ([C, K, 1] convolution) has the multipliers in its weights: q_proj
     * and k_proj carry attention_in, o_proj attention_out (v_proj not attention_in, so
     * that goes on the output), in_proj ssm_in and mup, out_proj ssm_out, gate_proj and
     * down_proj the MLP's, embed_tokens embedding and lm_head its own (a tied head the
     * ratio). key_multiplier stays a run-time factor either way. Biases are not folded. */
    lmh_weight_info wi;
    const int64_t CD = m2_conv_dim(&m->c2);
    int folded = h->weight_info(ld, "model.layers.0.mamba.conv1d.weight", &wi) == LMH_OK &&
                 wi.ndim == 3 && wi.ne[0] == CD && wi.ne[1] == m->c2.conv && wi.ne[2] == 1;
    if (folded) {
        if (attn_bias || mlp_bias || in_bias || out_bias)
            return h->fail(ld, "an mlx-lm Falcon-H1 checkpoint with projection biases is not "
                               "supported: its multipliers are folded into weights, not biases");
        m->lm_mult = tie ? m->lm_mult / m->emb_mult : 1.0f;
        m->emb_mult = 1.0f;
        m->attn_out = m->attn_in;
        m->attn_in = 1.0f;
        m->ssm_in = m->ssm_out = m->gate_mult = m->down_mult = 1.0f;
        for (int i = 0; i < 5; i++) sm[i] = 1.0f;
    }
    if (!isfinite(m->lm_mult)) return h->fail(ld, "config.json: embedding_multiplier is 0");
    /* k is multiplied whole (after its bias): the factor goes into the logit scale */
    m->attn_scale = key_mult / sqrtf((float)m->head_dim);
    /* without an in_proj bias, ssm_in goes into mup; any non-1 factor needs the vector */
    int need_mup = !in_bias && m->ssm_in != 1.0f;
    for (int i = 0; i < 5; i++) need_mup |= sm[i] != 1.0f;
    const float mup_scale = in_bias ? 1.0f : m->ssm_in;
    if (!in_bias) m->ssm_in = 1.0f;

    if (h->declare_model(ld, m->n_layers, m->vocab)) return LMH_EINVAL;
    m->layers = calloc((size_t)m->n_layers, sizeof *m->layers);
    if (!m->layers) return h->fail(ld, "out of memory");
    const int64_t H = m->hidden, qd = (int64_t)m->heads * m->head_dim,
                  kd = (int64_t)m->kv_heads * m->head_dim, F = m->inter;
    for (int32_t l = 0; l < m->n_layers; l++) {
        layer *L = &m->layers[l];
        lmh_layer_state st = {.kind = LMH_STATE_KV,
                              .n_kv_heads = m->kv_heads,
                              .head_dim_k = m->head_dim,
                              .head_dim_v = m->head_dim};
        if (h->declare_layer(ld, l, &st)) return LMH_EINVAL;
        char pre[96];
        snprintf(pre, sizeof pre, "model.layers.%d.mamba.", l);
        if (m2_load(h, ld, l, pre, &m->c2, &L->m2)) return LMH_EINVAL; /* declares its state */
        if (in_bias &&
            !(L->m2.in_bias = mx_w(h, ld, l, pre, "in_proj.bias", m2_proj_dim(&m->c2), 0)))
            return LMH_EINVAL;
        if (out_bias && !(L->m2.out_bias = mx_w(h, ld, l, pre, "out_proj.bias", H, 0)))
            return LMH_EINVAL;
        if (need_mup && !(L->mup = mup_vector(h, ld, l, &m->c2, sm, mup_scale))) return LMH_EINVAL;
        L->ln1 = w(h, ld, l, "model.layers.%d.input_layernorm.weight", H, 0);
        L->ln2 = w(h, ld, l, "model.layers.%d.pre_ff_layernorm.weight", H, 0);
        L->wq = w(h, ld, l, "model.layers.%d.self_attn.q_proj.weight", qd, H);
        L->wk = w(h, ld, l, "model.layers.%d.self_attn.k_proj.weight", kd, H);
        L->wv = w(h, ld, l, "model.layers.%d.self_attn.v_proj.weight", kd, H);
        L->wo = w(h, ld, l, "model.layers.%d.self_attn.o_proj.weight", H, qd);
        L->wg = w(h, ld, l, "model.layers.%d.feed_forward.gate_proj.weight", F, H);
        L->wu = w(h, ld, l, "model.layers.%d.feed_forward.up_proj.weight", F, H);
        L->wd = w(h, ld, l, "model.layers.%d.feed_forward.down_proj.weight", H, F);
        if (!L->ln1 || !L->ln2 || !L->wq || !L->wk || !L->wv || !L->wo || !L->wg || !L->wu ||
            !L->wd)
            return LMH_EINVAL; /* the host has the message */
        if (attn_bias && (!(L->bq = w(h, ld, l, "model.layers.%d.self_attn.q_proj.bias", qd, 0)) ||
                          !(L->bk = w(h, ld, l, "model.layers.%d.self_attn.k_proj.bias", kd, 0)) ||
                          !(L->bv = w(h, ld, l, "model.layers.%d.self_attn.v_proj.bias", kd, 0)) ||
                          !(L->bo = w(h, ld, l, "model.layers.%d.self_attn.o_proj.bias", H, 0))))
            return LMH_EINVAL;
        if (mlp_bias &&
            (!(L->bg = w(h, ld, l, "model.layers.%d.feed_forward.gate_proj.bias", F, 0)) ||
             !(L->bu = w(h, ld, l, "model.layers.%d.feed_forward.up_proj.bias", F, 0)) ||
             !(L->bd = w(h, ld, l, "model.layers.%d.feed_forward.down_proj.bias", H, 0))))
            return LMH_EINVAL;
    }
    int64_t ene[2] = {m->vocab, H};
    m->embed = h->weight(ld, LMH_LAYER_INPUT, "model.embed_tokens.weight", 2, ene);
    m->norm = h->weight(ld, LMH_LAYER_OUTPUT, "model.final_layernorm.weight", 1, &H);
    if (!m->embed || !m->norm) return LMH_EINVAL;
    if (tie) {
        m->lm_head = m->embed;
    } else if (h->weight_info(ld, "lm_head.weight", &wi) != LMH_OK) {
        return h->fail(ld, "missing tensor lm_head.weight (tie_word_embeddings is false)");
    } else if (!(m->lm_head = h->weight(ld, LMH_LAYER_OUTPUT, "lm_head.weight", 2, ene))) {
        return LMH_EINVAL;
    }

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
    if (s != 1.0f) lmh_b_scale(b, t, t, s);
}

static int forward(lmh_model *m, const lmh_host_api *h, lmh_fwd *f, const lmh_batch *bt) {
    const int64_t n = bt->n_rows, H = m->hidden, hd = m->head_dim;
    const int64_t qd = (int64_t)m->heads * hd, kd = (int64_t)m->kv_heads * hd;
    lmh_build b = {.h = h, .f = f, .layer = LMH_LAYER_INPUT};
    lmh_tensor *x = lmh_b_get_rows(&b, NULL, m->embed, bt->tokens);
    scale_by(&b, x, m->emb_mult);
    /* scratch shared by every layer: ops run in order */
    lmh_tensor *hn = lmh_b_new2(&b, n, H), *q = lmh_b_new2(&b, n, qd), *k = lmh_b_new2(&b, n, kd),
               *v = lmh_b_new2(&b, n, kd), *att = lmh_b_new2(&b, n, qd), *o = lmh_b_new2(&b, n, H),
               *g = lmh_b_new2(&b, n, m->inter), *u = lmh_b_new2(&b, n, m->inter);
    lmh_tensor *ha = m->attn_in != 1.0f ? lmh_b_new2(&b, n, H) : hn,
               *hs = m->ssm_in != 1.0f ? lmh_b_new2(&b, n, H) : hn;
    m2_scratch s2 = m2_scratch_new(&b, n, &m->c2);
    lmh_tensor *q3 = lmh_b_heads(&b, q, m->heads, hd), *k3 = lmh_b_heads(&b, k, m->kv_heads, hd),
               *v3 = lmh_b_heads(&b, v, m->kv_heads, hd),
               *att3 = lmh_b_heads(&b, att, m->heads, hd);
    for (int32_t l = 0; l < m->n_layers; l++) {
        const layer *L = &m->layers[l];
        b.layer = l;
        lmh_b_rms_norm(&b, hn, x, L->ln1, m->eps, 0);
        /* the Mamba-2 branch */
        if (hs != hn) lmh_b_scale(&b, hs, hn, m->ssm_in);
        if (!m2_forward(&b, &m->c2, &L->m2, &s2, hs, L->mup, o)) return LMH_EINVAL;
        scale_by(&b, o, m->ssm_out);
        lmh_b_op(&b, LMH_OP_ADD, x, x, o, NULL);
        /* the attention branch, on the same normed input */
        if (ha != hn) lmh_b_scale(&b, ha, hn, m->attn_in);
        lmh_b_matmul(&b, q, ha, L->wq, L->bq);
        lmh_b_matmul(&b, k, ha, L->wk, L->bk);
        lmh_b_matmul(&b, v, ha, L->wv, L->bv);
        lmh_b_rope(&b, q3, bt->positions, m->inv_freq, (int32_t)hd, LMH_ROPE_HALF, m->rope_factor);
        lmh_b_rope(&b, k3, bt->positions, m->inv_freq, (int32_t)hd, LMH_ROPE_HALF, m->rope_factor);
        lmh_attn_params ap = {.scale = m->attn_scale, .softcap = 0, .window = 0};
        if (!q3 || h->fwd_attention(f, l, q3, k3, v3, att3, &ap) != LMH_OK) return LMH_EINVAL;
        lmh_b_matmul(&b, o, att, L->wo, L->bo);
        scale_by(&b, o, m->attn_out);
        lmh_b_op(&b, LMH_OP_ADD, x, x, o, NULL);
        /* the MLP */
        lmh_b_rms_norm(&b, hn, x, L->ln2, m->eps, 0);
        lmh_b_matmul(&b, g, hn, L->wg, L->bg);
        scale_by(&b, g, m->gate_mult);
        lmh_b_matmul(&b, u, hn, L->wu, L->bu);
        lmh_b_op(&b, LMH_OP_SWIGLU, g, g, u, NULL);
        lmh_b_matmul(&b, o, g, L->wd, L->bd);
        scale_by(&b, o, m->down_mult);
        if (!lmh_b_op(&b, LMH_OP_ADD, x, x, o, NULL)) return LMH_EINVAL;
    }
    b.layer = LMH_LAYER_OUTPUT;
    lmh_tensor *xo = lmh_b_get_rows(&b, NULL, x, bt->out_rows);
    lmh_tensor *hf = lmh_b_rms_norm(&b, NULL, xo, m->norm, m->eps, 0);
    if (hf) scale_by(&b, hf, m->lm_mult); /* the head has no bias: scaling its input is exact */
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
    .name = "falcon_h1",
    .version = "0.1.0",
    .summary = "Falcon-H1: attention and a Mamba-2 mixer in parallel in every layer, muP "
               "multipliers",
    .init = NULL,
    .api = &api,
};

LMH_EXPORT const lmh_plugin_info *lmhost_plugin_entry(void) {
    return &info;
}
