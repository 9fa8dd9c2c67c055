/* The recurrent token mixers of the state space and linear attention families, for the
 * architecture plugins that use them (header only: each plugin keeps its own copy of the
 * code, as the cache plugins do with cache-common/). Each mixer reads its settings from
 * the family (an m*_cfg the plugin fills), loads its weights under a name prefix,
 * declares its layer's recurrent state, and runs over a pass's rows from a normed input
 * to the block's output, with scratch made once a pass and shared by every layer:
 *
 *   Mamba-1 (mamba, jamba):      in_proj -> x, z; x = silu(conv(x)); x_proj -> dt, B, C
 *                                (jamba: RMSNorm on each); dt_proj; selective scan;
 *                                y * silu(z); out_proj.
 *   Mamba-2 (mamba2, falcon_h1,  in_proj -> z, xBC, dt; xBC = silu(conv(xBC)) -> x, B, C;
 *   granitemoehybrid, nemotron_h) SSD scan; gate and norm (y * silu(z) then RMSNorm over
 *                                groups, or no norm); out_proj.
 *   Gated DeltaNet (qwen3_next,  in_proj -> q, k, v (one conv), z, b, a; delta rule over
 *   qwen3_5)                     L2-normed q, k; RMSNorm per head then * silu(z); out_proj.
 *
 * State: buffer 0 is the convolution's window [K - 1, C], buffer 1 the scan's state. */
#ifndef LMHOST_MODELS_MIXERS_H
#define LMHOST_MODELS_MIXERS_H

#include "lmhost/lmhost.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- small loading helpers --------------------------------------------------------- */

/* A positive integer setting; `def` > 0 is used when absent (0: required). */
static inline int mx_int(const lmh_host_api *h, lmh_load_ctx *ld, const char *key, int64_t def,
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

static inline int mx_flag(const lmh_host_api *h, lmh_load_ctx *ld, const char *key, int def) {
    int v = def;
    h->cfg_bool(ld, key, &v);
    return v;
}

/* A float setting, `def` when absent. */
static inline int mx_float(const lmh_host_api *h, lmh_load_ctx *ld, const char *key, double def,
                           float *out) {
    double v = def;
    if (h->cfg_float(ld, key, &v) == LMH_ETYPE)
        return h->fail(ld, "config.json: %s must be a number", key);
    *out = (float)v;
    return 0;
}

/* Weight `prefix` + `name` of the given shape (d1 = 0: a vector). */
static inline lmh_tensor *mx_w(const lmh_host_api *h, lmh_load_ctx *ld, int32_t l,
                               const char *prefix, const char *name, int64_t d0, int64_t d1) {
    char full[320];
    snprintf(full, sizeof full, "%s%s", prefix, name);
    int64_t ne[2] = {d0, d1};
    return h->weight(ld, l, full, d1 ? 2 : 1, ne);
}

/* The same where the checkpoint may lack it (biases): NULL without failing. */
static inline lmh_tensor *mx_w_opt(const lmh_host_api *h, lmh_load_ctx *ld, int32_t l,
                                   const char *prefix, const char *name, int64_t d0, int64_t d1) {
    char full[320];
    lmh_weight_info wi;
    snprintf(full, sizeof full, "%s%s", prefix, name);
    if (h->weight_info(ld, full, &wi) != LMH_OK) return NULL;
    return mx_w(h, ld, l, prefix, name, d0, d1);
}

/* A depthwise convolution's weight: Hugging Face's [C, 1, K] or MLX's [C, K, 1] (the same
 * values in the same order), kept with its shape; mx_conv_view sees it as [C, K]. */
static inline lmh_tensor *mx_conv_w(const lmh_host_api *h, lmh_load_ctx *ld, int32_t l,
                                    const char *prefix, int64_t C, int64_t K) {
    char full[320];
    snprintf(full, sizeof full, "%sconv1d.weight", prefix);
    lmh_weight_info wi;
    if (h->weight_info(ld, full, &wi) != LMH_OK) {
        h->fail(ld, "missing tensor %s", full);
        return NULL;
    }
    int64_t hf[3] = {C, 1, K}, mlx[3] = {C, K, 1};
    int is_mlx = wi.ndim == 3 && wi.ne[0] == C && wi.ne[1] == K && wi.ne[2] == 1 && K != 1;
    if (!lmh_dtype_is_float(wi.dtype)) {
        h->fail(ld, "tensor %s must be f32, f16 or bf16 (is %s)", full, lmh_dtype_name(wi.dtype));
        return NULL;
    }
    return h->weight(ld, l, full, 3, is_mlx ? mlx : hf);
}

/* ---- Mamba-1 ----------------------------------------------------------------------- */

typedef struct m1_cfg {
    int32_t hidden, inner, state, dt_rank, conv; /* H, D, N, R, K */
    int conv_bias, proj_bias;
    int bcdt_norm; /* jamba: RMSNorm on dt, B and C after x_proj */
    float eps;     /* of those norms */
} m1_cfg;

typedef struct m1_layer {
    lmh_tensor *in_proj, *in_bias, *conv_w, *conv_b, *x_proj, *dt_w, *dt_b, *A_log, *D;
    lmh_tensor *out_proj, *out_bias, *dt_norm, *b_norm, *c_norm;
} m1_layer;

/* Loads layer l's mixer (weights named prefix + "in_proj.weight" and so on) and declares
 * its state. Returns 0, or non-zero after fail(). */
static inline int m1_load(const lmh_host_api *h, lmh_load_ctx *ld, int32_t l, const char *pre,
                          const m1_cfg *c, m1_layer *w) {
    const int64_t H = c->hidden, D = c->inner, N = c->state, R = c->dt_rank, K = c->conv;
    w->in_proj = mx_w(h, ld, l, pre, "in_proj.weight", 2 * D, H);
    w->conv_w = mx_conv_w(h, ld, l, pre, D, K);
    w->x_proj = mx_w(h, ld, l, pre, "x_proj.weight", R + 2 * N, D);
    w->dt_w = mx_w(h, ld, l, pre, "dt_proj.weight", D, R);
    w->dt_b = mx_w(h, ld, l, pre, "dt_proj.bias", D, 0);
    w->A_log = mx_w(h, ld, l, pre, "A_log", D, N);
    w->D = mx_w(h, ld, l, pre, "D", D, 0);
    w->out_proj = mx_w(h, ld, l, pre, "out_proj.weight", H, D);
    if (c->conv_bias) w->conv_b = mx_w(h, ld, l, pre, "conv1d.bias", D, 0);
    if (c->proj_bias) {
        w->in_bias = mx_w(h, ld, l, pre, "in_proj.bias", 2 * D, 0);
        w->out_bias = mx_w(h, ld, l, pre, "out_proj.bias", H, 0);
    }
    if (c->bcdt_norm) {
        w->dt_norm = mx_w(h, ld, l, pre, "dt_layernorm.weight", R, 0);
        w->b_norm = mx_w(h, ld, l, pre, "b_layernorm.weight", N, 0);
        w->c_norm = mx_w(h, ld, l, pre, "c_layernorm.weight", N, 0);
    }
    if (!w->in_proj || !w->conv_w || !w->x_proj || !w->dt_w || !w->dt_b || !w->A_log || !w->D ||
        !w->out_proj || (c->conv_bias && !w->conv_b) ||
        (c->proj_bias && (!w->in_bias || !w->out_bias)) ||
        (c->bcdt_norm && (!w->dt_norm || !w->b_norm || !w->c_norm)))
        return LMH_EINVAL;
    lmh_recurrent_state st = {
        .size = sizeof st, .n_bufs = 2, .buf = {{LMH_F32, 2, {K - 1, D}}, {LMH_F32, 2, {D, N}}}};
    return h->declare_recurrent(ld, l, &st);
}

typedef struct m1_scratch {
    lmh_tensor *xz, *x, *z, *xc, *dbc, *dtl, *B, *C, *dt, *y;
} m1_scratch;

/* Scratch for n rows on the backend b places (NULL members after a failure: the ops that
 * use them fail the pass). */
static inline m1_scratch m1_scratch_new(lmh_build *b, int64_t n, const m1_cfg *c) {
    const int64_t D = c->inner, N = c->state, R = c->dt_rank;
    m1_scratch s = {.xz = lmh_b_new2(b, n, 2 * D),
                    .x = lmh_b_new2(b, n, D),
                    .z = lmh_b_new2(b, n, D),
                    .xc = lmh_b_new2(b, n, D),
                    .dbc = lmh_b_new2(b, n, R + 2 * N),
                    .dtl = lmh_b_new2(b, n, R),
                    .B = lmh_b_new2(b, n, N),
                    .C = lmh_b_new2(b, n, N),
                    .dt = lmh_b_new2(b, n, D),
                    .y = lmh_b_new2(b, n, D)};
    return s;
}

/* dst[:, :] = src's w columns from `from` on. */
static inline lmh_tensor *mx_cols(lmh_build *b, lmh_tensor *dst, lmh_tensor *src, int64_t from) {
    if (!dst || !src) return NULL;
    lmh_op op = {.code = LMH_OP_COLS, .dst = dst, .src = {src}};
    op.p.i[0] = (int32_t)from;
    return b->h->fwd_op(b->f, b->layer, &op) == LMH_OK ? dst : NULL;
}

/* The convolution's weight as [C, K]. */
static inline lmh_tensor *mx_conv_view(lmh_build *b, lmh_tensor *w) {
    if (!w) return NULL;
    int64_t ne[2] = {w->ne[0], w->ne[1] == 1 ? w->ne[2] : w->ne[1]};
    return b->h->fwd_view(b->f, w, 0, 2, ne);
}

/* y = act(conv(x)) with the layer's window (state buffer 0). */
static inline lmh_tensor *mx_conv(lmh_build *b, lmh_tensor *y, lmh_tensor *x, lmh_tensor *w,
                                  lmh_tensor *bias) {
    lmh_tensor *wv = mx_conv_view(b, w);
    if (!y || !x || !wv) return NULL;
    lmh_op op = {.code = LMH_OP_CONV1D, .dst = y, .src = {x, wv, bias, NULL}};
    op.p.i[0] = LMH_UNARY_SILU;
    return b->h->fwd_recurrent(b->f, b->layer, 0, &op) == LMH_OK ? y : NULL;
}

/* out [n, H] = the mixer over hn [n, H]. */
static inline lmh_tensor *m1_forward(lmh_build *b, const m1_cfg *c, const m1_layer *w,
                                     const m1_scratch *s, lmh_tensor *hn, lmh_tensor *out) {
    const int64_t D = c->inner, N = c->state, R = c->dt_rank;
    lmh_b_matmul(b, s->xz, hn, w->in_proj, w->in_bias);
    mx_cols(b, s->x, s->xz, 0);
    mx_cols(b, s->z, s->xz, D);
    mx_conv(b, s->xc, s->x, w->conv_w, w->conv_b);
    lmh_b_matmul(b, s->dbc, s->xc, w->x_proj, NULL);
    mx_cols(b, s->dtl, s->dbc, 0);
    mx_cols(b, s->B, s->dbc, R);
    mx_cols(b, s->C, s->dbc, R + N);
    if (c->bcdt_norm) {
        lmh_b_rms_norm(b, s->dtl, s->dtl, w->dt_norm, c->eps, 0);
        lmh_b_rms_norm(b, s->B, s->B, w->b_norm, c->eps, 0);
        lmh_b_rms_norm(b, s->C, s->C, w->c_norm, c->eps, 0);
    }
    lmh_b_matmul(b, s->dt, s->dtl, w->dt_w, NULL); /* its bias goes in before the softplus */
    if (!s->y || !s->xc || !s->dt || !s->B || !s->C) return NULL;
    lmh_op op = {.code = LMH_OP_SSM_SCAN, .dst = s->y, .src = {s->xc, s->dt, w->A_log, s->B}};
    op.src_more[0] = s->C;
    op.src_more[1] = w->D;
    op.src_more[2] = w->dt_b;
    if (b->h->fwd_recurrent(b->f, b->layer, 1, &op) != LMH_OK) return NULL;
    lmh_b_op(b, LMH_OP_SWIGLU, s->y, s->z, s->y, NULL); /* y * silu(z) */
    return lmh_b_matmul(b, out, s->y, w->out_proj, w->out_bias);
}

/* ---- Mamba-2 ----------------------------------------------------------------------- */

enum {
    M2_NORM_GATED = 0,       /* y * silu(z), then RMSNorm over groups of norm_group (Mamba-2) */
    M2_NORM_NONE = 1,        /* y * silu(z) only (Falcon-H1 without mamba_rms_norm) */
    M2_NORM_BEFORE_GATE = 2, /* RMSNorm over groups first, then * silu(z) (Falcon-H1's
                              * mamba_norm_before_gate) */
};

typedef struct m2_cfg {
    int32_t hidden, inner, heads, head_dim, groups, state, conv; /* H, I, nh, P, G, N, K */
    int32_t norm_group; /* RMSNorm width (inner: one norm over all; inner / groups: grouped) */
    int norm;           /* M2_NORM_* */
    int conv_bias, proj_bias;
    float eps, dt_min, dt_max; /* dt_max <= 0: no upper bound */
    int32_t proj_extra;        /* in_proj columns past z, xBC and dt that the mixer ignores */
} m2_cfg;

typedef struct m2_layer {
    lmh_tensor *in_proj, *in_bias, *conv_w, *conv_b, *dt_bias, *A_log, *D, *norm, *out_proj,
        *out_bias;
} m2_layer;

static inline int64_t m2_conv_dim(const m2_cfg *c) {
    return (int64_t)c->inner + 2 * (int64_t)c->groups * c->state;
}

static inline int64_t m2_proj_dim(const m2_cfg *c) {
    return (int64_t)c->inner + m2_conv_dim(c) + c->heads + c->proj_extra;
}

/* Reads the time_step_limit pair ([lo, hi], hi possibly "Infinity") into dt_min/dt_max. */
static inline int m2_dt_limit(const lmh_host_api *h, lmh_load_ctx *ld, const char *key, m2_cfg *c) {
    c->dt_min = 0;
    c->dt_max = 0;
    int64_t len = 0;
    if (h->cfg_len(ld, key, &len) != LMH_OK) return 0; /* absent: (0, inf) */
    char k0[96], k1[96];
    snprintf(k0, sizeof k0, "%s.0", key);
    snprintf(k1, sizeof k1, "%s.1", key);
    double lo = 0, hi = 0;
    if (len != 2 || h->cfg_float(ld, k0, &lo) != LMH_OK || lo < 0)
        return h->fail(ld, "config.json: %s must be [min, max] with min >= 0", key);
    if (h->cfg_float(ld, k1, &hi) == LMH_OK && hi < INFINITY) {
        if (!(hi > lo)) return h->fail(ld, "config.json: %s must have max > min", key);
        c->dt_max = (float)hi;
    }
    c->dt_min = (float)lo;
    return 0;
}

static inline int m2_load(const lmh_host_api *h, lmh_load_ctx *ld, int32_t l, const char *pre,
                          const m2_cfg *c, m2_layer *w) {
    const int64_t H = c->hidden, I = c->inner, nh = c->heads, K = c->conv, P = c->head_dim;
    const int64_t CD = m2_conv_dim(c), N = c->state;
    if ((int64_t)nh * P != I)
        return h->fail(ld, "config.json: %d heads of %d do not make the mixer's %lld channels",
                       c->heads, c->head_dim, (long long)I);
    if (nh % c->groups || I % c->norm_group)
        return h->fail(ld, "config.json: %d heads do not divide into %d groups", c->heads,
                       c->groups);
    w->in_proj = mx_w(h, ld, l, pre, "in_proj.weight", m2_proj_dim(c), H);
    w->conv_w = mx_conv_w(h, ld, l, pre, CD, K);
    w->dt_bias = mx_w(h, ld, l, pre, "dt_bias", nh, 0);
    w->A_log = mx_w(h, ld, l, pre, "A_log", nh, 0);
    w->D = mx_w(h, ld, l, pre, "D", nh, 0);
    w->out_proj = mx_w(h, ld, l, pre, "out_proj.weight", H, I);
    if (c->conv_bias) w->conv_b = mx_w(h, ld, l, pre, "conv1d.bias", CD, 0);
    if (c->proj_bias) {
        w->in_bias = mx_w(h, ld, l, pre, "in_proj.bias", m2_proj_dim(c), 0);
        w->out_bias = mx_w(h, ld, l, pre, "out_proj.bias", H, 0);
    }
    if (c->norm != M2_NORM_NONE) w->norm = mx_w(h, ld, l, pre, "norm.weight", I, 0);
    if (!w->in_proj || !w->conv_w || !w->dt_bias || !w->A_log || !w->D || !w->out_proj ||
        (c->conv_bias && !w->conv_b) || (c->proj_bias && (!w->in_bias || !w->out_bias)) ||
        (c->norm != M2_NORM_NONE && !w->norm))
        return LMH_EINVAL;
    lmh_recurrent_state st = {.size = sizeof st,
                              .n_bufs = 2,
                              .buf = {{LMH_F32, 2, {K - 1, CD}}, {LMH_F32, 3, {nh, P, N}}}};
    return h->declare_recurrent(ld, l, &st);
}

typedef struct m2_scratch {
    lmh_tensor *zxbcdt, *z, *xbc, *dt, *xc, *x, *B, *C, *y;
} m2_scratch;

static inline m2_scratch m2_scratch_new(lmh_build *b, int64_t n, const m2_cfg *c) {
    const int64_t GN = (int64_t)c->groups * c->state;
    m2_scratch s = {.zxbcdt = lmh_b_new2(b, n, m2_proj_dim(c)),
                    .z = lmh_b_new2(b, n, c->inner),
                    .xbc = lmh_b_new2(b, n, m2_conv_dim(c)),
                    .dt = lmh_b_new2(b, n, c->heads),
                    .xc = lmh_b_new2(b, n, m2_conv_dim(c)),
                    .x = lmh_b_new2(b, n, c->inner),
                    .B = lmh_b_new2(b, n, GN),
                    .C = lmh_b_new2(b, n, GN),
                    .y = lmh_b_new2(b, n, c->inner)};
    return s;
}

/* out [n, H] = the mixer over hn [n, H]. mup: a vector multiplying in_proj's output
 * (Falcon-H1's ssm_multipliers), or NULL. */
static inline lmh_tensor *m2_forward(lmh_build *b, const m2_cfg *c, const m2_layer *w,
                                     const m2_scratch *s, lmh_tensor *hn, lmh_tensor *mup,
                                     lmh_tensor *out) {
    const int64_t I = c->inner, CD = m2_conv_dim(c), GN = (int64_t)c->groups * c->state;
    lmh_b_matmul(b, s->zxbcdt, hn, w->in_proj, w->in_bias);
    if (mup) lmh_b_op(b, LMH_OP_MUL, s->zxbcdt, s->zxbcdt, mup, NULL);
    mx_cols(b, s->z, s->zxbcdt, 0);
    mx_cols(b, s->xbc, s->zxbcdt, I);
    mx_cols(b, s->dt, s->zxbcdt, I + CD);
    mx_conv(b, s->xc, s->xbc, w->conv_w, w->conv_b);
    mx_cols(b, s->x, s->xc, 0);
    mx_cols(b, s->B, s->xc, I);
    mx_cols(b, s->C, s->xc, I + GN);
    if (!s->y || !s->x || !s->dt || !s->B || !s->C) return NULL;
    lmh_op op = {.code = LMH_OP_SSD_SCAN, .dst = s->y, .src = {s->x, s->dt, w->A_log, s->B}};
    op.src_more[0] = s->C;
    op.src_more[1] = w->D;
    op.src_more[2] = w->dt_bias;
    op.p.i[0] = c->heads;
    op.p.i[1] = c->groups;
    op.p.f[0] = c->dt_min;
    op.p.f[1] = c->dt_max;
    if (b->h->fwd_recurrent(b->f, b->layer, 1, &op) != LMH_OK) return NULL;
    if (c->norm != M2_NORM_BEFORE_GATE)
        lmh_b_op(b, LMH_OP_SWIGLU, s->y, s->z, s->y, NULL); /* y * silu(z) */
    if (c->norm != M2_NORM_NONE) {
        if (c->norm_group == c->inner) {
            lmh_b_rms_norm(b, s->y, s->y, w->norm, c->eps, 0);
        } else { /* each group normed alone, then the whole row's weight */
            lmh_tensor *g = lmh_b_heads(b, s->y, c->inner / c->norm_group, c->norm_group);
            lmh_b_rms_norm(b, g, g, NULL, c->eps, 0);
            lmh_b_op(b, LMH_OP_MUL, s->y, s->y, w->norm, NULL);
        }
    }
    if (c->norm == M2_NORM_BEFORE_GATE) lmh_b_op(b, LMH_OP_SWIGLU, s->y, s->z, s->y, NULL);
    return lmh_b_matmul(b, out, s->y, w->out_proj, w->out_bias);
}

/* ---- Gated DeltaNet ---------------------------------------------------------------- */

enum {
    GDN_FUSED = 0,    /* qwen3_next: in_proj_qkvz and in_proj_ba, interleaved by key head */
    GDN_SEPARATE = 1, /* qwen3_5: in_proj_qkv, in_proj_z, in_proj_b, in_proj_a */
};

typedef struct gdn_cfg {
    int32_t hidden, k_heads, v_heads, k_dim, v_dim, conv; /* H, Hk, Hv, dk, dv, K */
    int layout;                                           /* GDN_* */
    float eps;                                            /* the output norm's */
} gdn_cfg;

typedef struct gdn_layer {
    lmh_tensor *qkvz, *ba;          /* GDN_FUSED */
    lmh_tensor *qkv, *wz, *wb, *wa; /* GDN_SEPARATE */
    lmh_tensor *conv_w, *dt_bias, *A_log, *norm, *out_proj;
    lmh_tensor *qkv_idx; /* GDN_FUSED: i32 columns of q, k and v in qkvz's output */
} gdn_layer;

static inline int64_t gdn_conv_dim(const gdn_cfg *c) {
    return 2 * (int64_t)c->k_heads * c->k_dim + (int64_t)c->v_heads * c->v_dim;
}

static inline int gdn_load(const lmh_host_api *h, lmh_load_ctx *ld, int32_t l, const char *pre,
                           const gdn_cfg *c, gdn_layer *w) {
    const int64_t H = c->hidden, Hk = c->k_heads, Hv = c->v_heads, dk = c->k_dim, dv = c->v_dim;
    const int64_t CD = gdn_conv_dim(c), VD = Hv * dv, K = c->conv;
    if (Hv % Hk)
        return h->fail(ld, "config.json: %d value heads are not a multiple of %d key heads",
                       c->v_heads, c->k_heads);
    if (dk > 1024) return h->fail(ld, "config.json: key heads of %d are not supported", c->k_dim);
    if (c->layout == GDN_FUSED) {
        const int64_t r = Hv / Hk, W = 2 * dk + 2 * r * dv;
        w->qkvz = mx_w(h, ld, l, pre, "in_proj_qkvz.weight", Hk * W, H);
        w->ba = mx_w(h, ld, l, pre, "in_proj_ba.weight", 2 * Hv, H);
        /* q, k, v of every key head, gathered from each head's [q k v z] block */
        int32_t *idx = malloc((size_t)CD * sizeof *idx);
        if (!idx) return h->fail(ld, "out of memory");
        int64_t o = 0;
        for (int64_t g = 0; g < Hk; g++)
            for (int64_t i = 0; i < dk; i++) idx[o++] = (int32_t)(g * W + i);
        for (int64_t g = 0; g < Hk; g++)
            for (int64_t i = 0; i < dk; i++) idx[o++] = (int32_t)(g * W + dk + i);
        for (int64_t g = 0; g < Hk; g++)
            for (int64_t i = 0; i < r * dv; i++) idx[o++] = (int32_t)(g * W + 2 * dk + i);
        w->qkv_idx = h->constant(ld, l, LMH_I32, 1, &CD, idx);
        free(idx);
        if (!w->qkvz || !w->ba || !w->qkv_idx) return LMH_EINVAL;
    } else {
        w->qkv = mx_w(h, ld, l, pre, "in_proj_qkv.weight", CD, H);
        w->wz = mx_w(h, ld, l, pre, "in_proj_z.weight", VD, H);
        w->wb = mx_w(h, ld, l, pre, "in_proj_b.weight", Hv, H);
        w->wa = mx_w(h, ld, l, pre, "in_proj_a.weight", Hv, H);
        if (!w->qkv || !w->wz || !w->wb || !w->wa) return LMH_EINVAL;
    }
    w->conv_w = mx_conv_w(h, ld, l, pre, CD, K);
    w->dt_bias = mx_w(h, ld, l, pre, "dt_bias", Hv, 0);
    w->A_log = mx_w(h, ld, l, pre, "A_log", Hv, 0);
    w->norm = mx_w(h, ld, l, pre, "norm.weight", dv, 0);
    w->out_proj = mx_w(h, ld, l, pre, "out_proj.weight", H, VD);
    if (!w->conv_w || !w->dt_bias || !w->A_log || !w->norm || !w->out_proj) return LMH_EINVAL;
    lmh_recurrent_state st = {.size = sizeof st,
                              .n_bufs = 2,
                              .buf = {{LMH_F32, 2, {K - 1, CD}}, {LMH_F32, 3, {Hv, dk, dv}}}};
    return h->declare_recurrent(ld, l, &st);
}

typedef struct gdn_scratch {
    lmh_tensor *qkvz, *ba, *mixed, *conv, *q, *k, *v, *z, *a, *bb, *o;
} gdn_scratch;

static inline gdn_scratch gdn_scratch_new(lmh_build *b, int64_t n, const gdn_cfg *c) {
    const int64_t Hk = c->k_heads, Hv = c->v_heads, dk = c->k_dim, dv = c->v_dim;
    int64_t qne[3] = {n, Hk, dk}, vne[3] = {n, Hv, dv};
    gdn_scratch s = {.mixed = lmh_b_new2(b, n, gdn_conv_dim(c)),
                     .conv = lmh_b_new2(b, n, gdn_conv_dim(c)),
                     .q = lmh_b_new(b, 3, qne),
                     .k = lmh_b_new(b, 3, qne),
                     .v = lmh_b_new(b, 3, vne),
                     .z = lmh_b_new2(b, n, Hv * dv),
                     .a = lmh_b_new2(b, n, Hv),
                     .bb = lmh_b_new2(b, n, Hv),
                     .o = lmh_b_new(b, 3, vne)};
    if (c->layout == GDN_FUSED) {
        s.qkvz = lmh_b_new2(b, n, gdn_conv_dim(c) + Hv * dv);
        s.ba = lmh_b_new2(b, n, 2 * Hv);
    }
    return s;
}

/* dst's rows seen as [rows * parts, w]: the columns from `from` of each part of src seen
 * as [rows * parts, W]. */
static inline lmh_tensor *gdn_part_cols(lmh_build *b, lmh_tensor *dst, lmh_tensor *src,
                                        int64_t parts, int64_t from, int64_t w) {
    if (!dst || !src) return NULL;
    int64_t rows = src->ne[0], sne[2] = {rows * parts, lmh_inner(src) / parts},
            dne[2] = {rows * parts, w};
    lmh_tensor *sv = b->h->fwd_view(b->f, src, 0, 2, sne);
    lmh_tensor *dv = b->h->fwd_view(b->f, dst, 0, 2, dne);
    return mx_cols(b, dv, sv, from) ? dst : NULL;
}

static inline lmh_tensor *gdn_forward(lmh_build *b, const gdn_cfg *c, const gdn_layer *w,
                                      const gdn_scratch *s, lmh_tensor *hn, lmh_tensor *out) {
    const int64_t Hk = c->k_heads, Hv = c->v_heads, dk = c->k_dim, dv = c->v_dim;
    const int64_t r = Hv / Hk, KD = Hk * dk;
    if (c->layout == GDN_FUSED) {
        lmh_b_matmul(b, s->qkvz, hn, w->qkvz, NULL);
        if (!s->mixed || !s->qkvz) return NULL;
        lmh_op g = {.code = LMH_OP_COLS, .dst = s->mixed, .src = {s->qkvz, w->qkv_idx}};
        if (b->h->fwd_op(b->f, b->layer, &g) != LMH_OK) return NULL;
        gdn_part_cols(b, s->z, s->qkvz, Hk, 2 * dk + r * dv, r * dv);
        lmh_b_matmul(b, s->ba, hn, w->ba, NULL);
        gdn_part_cols(b, s->bb, s->ba, Hk, 0, r);
        gdn_part_cols(b, s->a, s->ba, Hk, r, r);
    } else {
        lmh_b_matmul(b, s->mixed, hn, w->qkv, NULL);
        lmh_b_matmul(b, s->z, hn, w->wz, NULL);
        lmh_b_matmul(b, s->bb, hn, w->wb, NULL);
        lmh_b_matmul(b, s->a, hn, w->wa, NULL);
    }
    mx_conv(b, s->conv, s->mixed, w->conv_w, NULL);
    mx_cols(b, lmh_b_flat(b, s->q), s->conv, 0);
    mx_cols(b, lmh_b_flat(b, s->k), s->conv, KD);
    mx_cols(b, lmh_b_flat(b, s->v), s->conv, 2 * KD);
    if (!s->o || !s->q || !s->k || !s->v || !s->a || !s->bb) return NULL;
    lmh_op op = {.code = LMH_OP_DELTA_RULE, .dst = s->o, .src = {s->q, s->k, s->v, s->a}};
    op.src_more[0] = s->bb;
    op.src_more[1] = w->A_log;
    op.src_more[2] = w->dt_bias;
    op.p.i[0] = 1;                             /* L2-normalised q and k */
    op.p.f[0] = 1.0f / sqrtf((float)c->k_dim); /* q's scale */
    op.p.f[1] = 1e-6f;                         /* the L2 norm's epsilon (as FLA) */
    if (b->h->fwd_recurrent(b->f, b->layer, 1, &op) != LMH_OK) return NULL;
    /* RMSNorm of each head's output, then * silu(z) */
    lmh_tensor *o2 = lmh_b_flat(b, s->o);
    int64_t hne[2] = {s->o->ne[0] * Hv, dv};
    lmh_tensor *oh = b->h->fwd_view(b->f, s->o, 0, 2, hne);
    lmh_b_rms_norm(b, oh, oh, w->norm, c->eps, 0);
    lmh_b_op(b, LMH_OP_SWIGLU, o2, s->z, o2, NULL);
    return lmh_b_matmul(b, out, o2, w->out_proj, NULL);
}

#endif
