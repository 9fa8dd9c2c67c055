/* What the backends share of the ops' contract (ops.h): the operand checks of the recurrent
 * ops of ABI 1.7, so that every backend accepts and refuses the same ops (header only,
 * static inline, like plugins/cache-common/). */
#ifndef LMHOST_BACKENDS_RECURRENT_CHECK_H
#define LMHOST_BACKENDS_RECURRENT_CHECK_H

#include "lmhost/lmhost.h"

static inline int rc_is_f32(const lmh_tensor *t) {
    return t && t->dtype == LMH_F32;
}

/* An optional weight vector of n values in a float dtype. */
static inline int rc_opt_vec(const lmh_tensor *t, int64_t n) {
    return !t || (lmh_dtype_is_float(t->dtype) && lmh_nelem(t) == n);
}

/* Everything ops.h promises of the ops of ABI 1.7 but the range of COLS's gather indices
 * (in the backend's memory: each backend checks them its own way). */
static inline int lmh_check_recurrent(const lmh_op *op) {
    const lmh_tensor *d = op->dst, *a = op->src[0], *b = op->src[1], *c = op->src[2],
                     *s3 = op->src[3];
    const lmh_tensor *s4 = op->src_more[0], *s5 = op->src_more[1], *s6 = op->src_more[2],
                     *st = op->src_more[3];
    if (!rc_is_f32(d) || !rc_is_f32(a)) return LMH_EUNSUPPORTED;
    switch (op->code) {
    case LMH_OP_COLS: {
        const int64_t W = lmh_inner(a), w = lmh_inner(d);
        if (w < 1 || W < 1 || lmh_nelem(a) / W != lmh_nelem(d) / w) return LMH_ESHAPE;
        if (b) return b->dtype != LMH_I32 || lmh_nelem(b) != w ? LMH_ESHAPE : LMH_OK;
        return op->p.i[0] >= 0 && op->p.i[0] + w <= W ? LMH_OK : LMH_EINVAL;
    }
    case LMH_OP_UNARY:
        if (lmh_nelem(a) != lmh_nelem(d)) return LMH_ESHAPE;
        return op->p.i[0] >= 0 && op->p.i[0] < LMH_UNARY_COUNT ? LMH_OK : LMH_EINVAL;
    case LMH_OP_CONV1D: {
        if (!b || !rc_is_f32(s3) || !lmh_dtype_is_float(b->dtype) || a == d) return LMH_EINVAL;
        const int64_t C = lmh_inner(a), K = lmh_inner(b);
        if (C < 1) return LMH_ESHAPE;
        const int64_t n = lmh_nelem(a) / C;
        if (a->ndim != 2 || d->ndim != 2 || d->ne[0] != n || d->ne[1] != C || K < 2 || K > 64 ||
            lmh_nelem(b) != C * K || !rc_opt_vec(c, C) || lmh_nelem(s3) != (K - 1) * C)
            return LMH_ESHAPE;
        return op->p.i[0] >= 0 && op->p.i[0] < LMH_UNARY_COUNT ? LMH_OK : LMH_EINVAL;
    }
    case LMH_OP_SSM_SCAN: {
        if (!rc_is_f32(b) || !c || !lmh_dtype_is_float(c->dtype) || !rc_is_f32(s3) ||
            !rc_is_f32(s4) || !rc_is_f32(st) || d == a)
            return LMH_EINVAL;
        const int64_t n = d->ne[0], D = lmh_inner(d), N = lmh_inner(s3);
        if (d->ndim != 2 || lmh_nelem(a) != n * D || lmh_nelem(b) != n * D ||
            lmh_nelem(s3) != n * N || lmh_nelem(s4) != n * N || lmh_nelem(c) != D * N ||
            !rc_opt_vec(s5, D) || !rc_opt_vec(s6, D) || lmh_nelem(st) != D * N)
            return LMH_ESHAPE;
        return LMH_OK;
    }
    case LMH_OP_SSD_SCAN: {
        if (!rc_is_f32(b) || !c || !lmh_dtype_is_float(c->dtype) || !rc_is_f32(s3) ||
            !rc_is_f32(s4) || !rc_is_f32(st) || d == a)
            return LMH_EINVAL;
        const int64_t H = op->p.i[0], G = op->p.i[1];
        if (H < 1 || G < 1 || H % G || !(op->p.f[0] >= 0)) return LMH_EINVAL;
        const int64_t n = d->ne[0], HP = lmh_inner(d), GN = lmh_inner(s3);
        if (d->ndim != 2 || HP % H || GN % G || lmh_nelem(a) != n * HP || lmh_nelem(b) != n * H ||
            s3->ne[0] != n || lmh_nelem(s3) != n * GN || lmh_nelem(s4) != n * GN ||
            lmh_nelem(c) != H || !rc_opt_vec(s5, H) || !rc_opt_vec(s6, H) ||
            lmh_nelem(st) != HP * (GN / G))
            return LMH_ESHAPE;
        return LMH_OK;
    }
    case LMH_OP_DELTA_RULE: {
        if (!rc_is_f32(b) || !rc_is_f32(c) || !rc_is_f32(s3) || !rc_is_f32(s4) || !s5 ||
            !lmh_dtype_is_float(s5->dtype) || !rc_is_f32(st) || d == a || d == c)
            return LMH_EINVAL;
        if (a->ndim != 3 || b->ndim != 3 || c->ndim != 3) return LMH_ESHAPE;
        const int64_t n = a->ne[0], Hk = a->ne[1], dk = a->ne[2], Hv = c->ne[1], dv = c->ne[2];
        if (Hk < 1 || Hv < 1 || dk < 1 || dv < 1) return LMH_ESHAPE;
        if (b->ne[0] != n || b->ne[1] != Hk || b->ne[2] != dk || c->ne[0] != n || Hv % Hk ||
            dk > 1024 || lmh_nelem(s3) != n * Hv || lmh_nelem(s4) != n * Hv ||
            lmh_nelem(s5) != Hv || !rc_opt_vec(s6, Hv) || lmh_nelem(st) != Hv * dk * dv ||
            lmh_nelem(d) != n * Hv * dv || d->ne[0] != n)
            return LMH_ESHAPE;
        return LMH_OK;
    }
    default:
        return LMH_EUNSUPPORTED;
    }
}

#endif
