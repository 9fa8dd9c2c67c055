/* lmhost plugin development kit: small inline helpers that enqueue one op each through
 * the host, for architecture plugins. They allocate results with fwd_tensor (freed when
 * the pass ends) and pass NULL along: once an op fails the host has recorded why, every
 * later helper returns NULL, and forward() reports the failure at its end. */
#ifndef LMHOST_BUILD_H
#define LMHOST_BUILD_H

#include "abi.h"
#include "ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lmh_build {
    const lmh_host_api *h;
    lmh_fwd *f;
    int32_t layer; /* where tensors and ops are placed: a layer index or LMH_LAYER_* */
} lmh_build;

static inline lmh_tensor *lmh_b_new(lmh_build *b, int32_t ndim, const int64_t *ne) {
    return b->h->fwd_tensor(b->f, b->layer, LMH_F32, ndim, ne);
}

static inline lmh_tensor *lmh_b_new2(lmh_build *b, int64_t rows, int64_t cols) {
    int64_t ne[2] = {rows, cols};
    return lmh_b_new(b, 2, ne);
}

/* t seen as [rows, a, c] (a * c must equal t's row size). */
static inline lmh_tensor *lmh_b_heads(lmh_build *b, lmh_tensor *t, int64_t a, int64_t c) {
    if (!t) return NULL;
    int64_t ne[3] = {t->ne[0], a, c};
    return b->h->fwd_view(b->f, t, 0, 3, ne);
}

/* t seen as [rows, cols]. */
static inline lmh_tensor *lmh_b_flat(lmh_build *b, lmh_tensor *t) {
    if (!t) return NULL;
    int64_t ne[2] = {t->ne[0], lmh_nelem(t) / (t->ne[0] ? t->ne[0] : 1)};
    return b->h->fwd_view(b->f, t, 0, 2, ne);
}

static inline lmh_tensor *lmh_b_op(lmh_build *b, lmh_op_code code, lmh_tensor *dst,
                                   lmh_tensor *s0, lmh_tensor *s1, lmh_tensor *s2) {
    if (!dst || !s0) return NULL;
    lmh_op op = {.code = code, .dst = dst, .src = {s0, s1, s2, NULL}};
    return b->h->fwd_op(b->f, b->layer, &op) == LMH_OK ? dst : NULL;
}

/* dst = x W^T (+ bias); dst NULL: a new [rows, out] tensor. */
static inline lmh_tensor *lmh_b_matmul(lmh_build *b, lmh_tensor *dst, lmh_tensor *x,
                                       lmh_tensor *w, lmh_tensor *bias) {
    if (!x || !w) return NULL;
    if (!dst) dst = lmh_b_new2(b, lmh_nelem(x) / x->ne[x->ndim - 1], w->ne[0]);
    return lmh_b_op(b, LMH_OP_MATMUL, dst, x, w, bias);
}

/* RMSNorm over the innermost dimension; offset 1 for the (1 + w) form. dst may be x. */
static inline lmh_tensor *lmh_b_rms_norm(lmh_build *b, lmh_tensor *dst, lmh_tensor *x,
                                         lmh_tensor *w, float eps, float offset) {
    if (!x) return NULL;
    if (!dst) dst = lmh_b_new(b, x->ndim, x->ne);
    if (!dst) return NULL;
    lmh_op op = {.code = LMH_OP_RMS_NORM, .dst = dst, .src = {x, w, NULL, NULL}};
    op.p.f[0] = eps;
    op.p.f[1] = offset;
    return b->h->fwd_op(b->f, b->layer, &op) == LMH_OK ? dst : NULL;
}

/* Rotary embedding in place on x [rows, heads, head_dim]. */
static inline lmh_tensor *lmh_b_rope(lmh_build *b, lmh_tensor *x, lmh_tensor *pos,
                                     lmh_tensor *inv_freq, int32_t rot_dims, int32_t style,
                                     float factor) {
    if (!x || !pos || !inv_freq) return NULL;
    lmh_op op = {.code = LMH_OP_ROPE, .dst = x, .src = {x, pos, inv_freq, NULL}};
    op.p.i[0] = rot_dims;
    op.p.i[1] = style;
    op.p.f[0] = factor;
    return b->h->fwd_op(b->f, b->layer, &op) == LMH_OK ? x : NULL;
}

static inline lmh_tensor *lmh_b_get_rows(lmh_build *b, lmh_tensor *dst, lmh_tensor *table,
                                         lmh_tensor *ids) {
    if (!table || !ids) return NULL;
    if (!dst) dst = lmh_b_new2(b, lmh_nelem(ids), table->ne[table->ndim - 1]);
    return lmh_b_op(b, LMH_OP_GET_ROWS, dst, table, ids, NULL);
}

static inline lmh_tensor *lmh_b_scale(lmh_build *b, lmh_tensor *dst, lmh_tensor *x, float s) {
    if (!x || !dst) return NULL;
    lmh_op op = {.code = LMH_OP_SCALE, .dst = dst, .src = {x, NULL, NULL, NULL}};
    op.p.f[0] = s;
    return b->h->fwd_op(b->f, b->layer, &op) == LMH_OK ? dst : NULL;
}

#ifdef __cplusplus
}
#endif
#endif
