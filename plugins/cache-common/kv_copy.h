/* Row copies and f32 scratch that the cache plugins share (header only, like kv_seqs.h). */
#ifndef LMHOST_CACHE_KV_COPY_H
#define LMHOST_CACHE_KV_COPY_H

#include "lmhost/lmhost.h"

/* Enqueues a copy of rows [from, from + n) of src into rows [at, at + n) of dst, both
 * [rows, kv_heads, hd] of f32 or f16 (converted where the dtypes differ), through the
 * backend's copy op. */
static inline int kv_copy_rows(const lmh_backend_api *be, lmh_backend *b, lmh_tensor *dst,
                               int32_t at, lmh_tensor *src, int32_t from, int32_t n) {
    if (n == 0) return LMH_OK;
    int64_t row = dst->ne[1] * dst->ne[2];
    int64_t ne[3] = {n, dst->ne[1], dst->ne[2]};
    lmh_tensor *dv = be->tensor_view(b, dst, (size_t)at * (size_t)row * lmh_dtype_size(dst->dtype),
                                     dst->dtype, 3, ne);
    lmh_tensor *sv = be->tensor_view(
        b, src, (size_t)from * (size_t)row * lmh_dtype_size(src->dtype), src->dtype, 3, ne);
    int rc = LMH_ENOMEM;
    if (dv && sv) {
        lmh_op op = {.code = LMH_OP_COPY, .dst = dv, .src = {sv}};
        rc = be->enqueue(b, &op);
    }
    if (dv) be->tensor_free(b, dv);
    if (sv) be->tensor_free(b, sv);
    return rc;
}

/* A view [rows, heads, hd] of the f32 scratch *buf (have: its floats), which grows by
 * doubling to hold it; NULL when out of memory. The caller frees the view. */
static inline lmh_tensor *kv_f32_room(const lmh_backend_api *be, lmh_backend *b, lmh_tensor **buf,
                                      size_t *have, int64_t rows, int64_t heads, int64_t hd) {
    size_t need = (size_t)rows * (size_t)heads * (size_t)hd;
    if (need > *have) {
        size_t n = *have ? *have : 4096;
        while (n < need) n *= 2;
        int64_t ne[1] = {(int64_t)n};
        lmh_tensor *t = be->tensor_new(b, LMH_F32, 1, ne, 0);
        if (!t) return NULL;
        if (*buf) be->tensor_free(b, *buf);
        *buf = t;
        *have = n;
    }
    int64_t ne[3] = {rows, heads, hd};
    return be->tensor_view(b, *buf, 0, LMH_F32, 3, ne);
}

#endif
