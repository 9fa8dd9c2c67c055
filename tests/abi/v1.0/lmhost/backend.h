/* lmhost plugin ABI: backend plugins (backends/<name>/).
 *
 * A backend owns memory on its device and runs ops. Ops are enqueued, not necessarily
 * run at once: a GPU backend records them and submits at sync(); results are only
 * defined after sync() or a download. The host never dereferences tensor data. */
#ifndef LMHOST_BACKEND_H
#define LMHOST_BACKEND_H

#include "abi.h"
#include "ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lmh_backend lmh_backend;

typedef struct lmh_backend_opts {
    uint32_t size;     /* sizeof(lmh_backend_opts) as the host knows it */
    int32_t threads;   /* CPU worker threads; 0: all cores */
    int32_t device;    /* device index for backends with several; 0 by default */
} lmh_backend_opts;

typedef struct lmh_backend_mem {
    uint64_t weights; /* bytes of tensors made with LMH_TENSOR_WEIGHT */
    uint64_t other;   /* everything else the backend holds (cache, scratch) */
    uint64_t mapped;  /* weight bytes used in place from host memory (not copied) */
    uint64_t weight_bytes_read; /* bytes of weight tensors read by ops since creation */
} lmh_backend_mem;

/* Flags for tensor_new(). */
enum {
    LMH_TENSOR_WEIGHT = 1, /* read-only after upload; counted as weights */
};

typedef struct lmh_backend_api {
    uint32_t size; /* sizeof(lmh_backend_api) as the plugin knows it */

    /* For listings: the dtypes its matmul takes as weights and the ops it runs (names
     * as lmh_op_name gives them), NULL-terminated. supports() has the final word. */
    const char *const *weight_dtypes;
    const char *const *ops;

    int (*create)(const lmh_host_api *host, const lmh_backend_opts *opts, lmh_backend **out,
                  char *err, size_t err_len);
    void (*destroy)(lmh_backend *b);
    /* A human-readable description of the device and code path ("cpu avx2, 8 threads"). */
    const char *(*describe)(lmh_backend *b);

    /* Whether this backend runs `op` with these dtypes and shapes (nothing enqueued). */
    int (*supports)(lmh_backend *b, const lmh_op *op);

    /* Allocates an uninitialised tensor on the device. NULL when out of memory. */
    lmh_tensor *(*tensor_new)(lmh_backend *b, lmh_dtype dtype, int32_t ndim, const int64_t *ne,
                              uint32_t flags);
    /* A tensor whose data is `host_data` for as long as the tensor lives, when the
     * backend can use host memory in place (the CPU backend with mmap'd weights).
     * NULL when it cannot; the host then uses tensor_new + upload. May be NULL. */
    lmh_tensor *(*tensor_wrap)(lmh_backend *b, lmh_dtype dtype, int32_t ndim, const int64_t *ne,
                               const void *host_data);
    /* Another shape over `base`'s contiguous data, `offset` bytes in. The view must be
     * freed before its base. */
    lmh_tensor *(*tensor_view)(lmh_backend *b, lmh_tensor *base, size_t offset, lmh_dtype dtype,
                               int32_t ndim, const int64_t *ne);
    /* Frees once the ops already enqueued that use it have run. */
    void (*tensor_free)(lmh_backend *b, lmh_tensor *t);

    /* Host -> device copy of n bytes at byte `offset` of t. Ordered with enqueued ops. */
    int (*upload)(lmh_backend *b, lmh_tensor *t, size_t offset, const void *src, size_t n);
    /* Device -> host copy: a sync point (waits for everything enqueued before it). */
    int (*download)(lmh_backend *b, const lmh_tensor *t, size_t offset, void *dst, size_t n);

    /* Enqueues one op. Returns LMH_EUNSUPPORTED (nothing enqueued) when it cannot. */
    int (*enqueue)(lmh_backend *b, const lmh_op *op);
    /* Waits until every enqueued op has run. Returns the first error among them. */
    int (*sync)(lmh_backend *b);

    void (*memory)(lmh_backend *b, lmh_backend_mem *out);

    /* A quantized weight (abi.h, LMH_Q2..LMH_Q8) from its checkpoint parts, counted as a
     * weight. ne is the logical shape, [out, in] or [E, out, in]; in is a multiple of
     * `group` (32, 64 or 128) and in * bits a multiple of 32. packed holds rows of
     * in * bits / 32 uint32 words; scales and biases, of dtype sb_dtype (f32, f16, bf16),
     * hold in / group values per row. Like tensor_wrap, a backend may use the three
     * buffers in place: they stay valid and unchanged for as long as the tensor lives
     * (the host lends the mapped file). NULL when out of memory or the arguments are bad.
     * The member may be NULL (or absent by size): the backend runs no quantized weights. */
    lmh_tensor *(*tensor_quant)(lmh_backend *b, lmh_dtype qtype, int32_t group, int32_t ndim,
                                const int64_t *ne, const uint32_t *packed, lmh_dtype sb_dtype,
                                const void *scales, const void *biases);
} lmh_backend_api;

#ifdef __cplusplus
}
#endif
#endif
