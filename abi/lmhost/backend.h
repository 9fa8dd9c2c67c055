/* lmhost plugin ABI: backend plugins (backends/<name>/).
 *
 * A backend owns memory on its device and runs ops. Ops are enqueued, not necessarily
 * run at once: a GPU backend records them and submits at sync(); results are only
 * defined after sync() or a download. The host never dereferences tensor data. */
#ifndef LMHOST_BACKEND_H
#define LMHOST_BACKEND_H

#include "abi.h"
#include "debug.h"
#include "ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lmh_backend lmh_backend;

/* (ABI 1.9) How a backend's arithmetic may round. EXACT: f32 operands and sums, one
 * reduction order whatever the batch (the conformance suite's 1e-3 tolerance). FAST: the
 * device's fast operands where it has them (f16/bf16 matrix cores, int8 activations
 * against quantized weights), f32 sums, still one reduction order per mode, so a row
 * gets the same bits in any batch. DEFAULT: the backend chooses (exact on CPUs, fast on
 * GPUs); lmh_backend_api.precision tells which it took. */
typedef enum lmh_precision {
    LMH_PRECISION_DEFAULT = 0,
    LMH_PRECISION_EXACT = 1,
    LMH_PRECISION_FAST = 2,
} lmh_precision;

typedef struct lmh_backend_opts {
    uint32_t size;     /* sizeof(lmh_backend_opts) as the host knows it */
    int32_t threads;   /* CPU worker threads; 0: all cores */
    int32_t device;    /* device index for backends with several; 0 by default */
    int32_t precision; /* (ABI 1.9) lmh_precision; read only where size covers it */
    /* (ABI 1.12) The backend's own options as the user gave them after its name
     * (`--backend vulkan:max-memory=4G,spin=0`: "max-memory=4G,spin=0"), a list that
     * lmh_kv_next (debug.h) reads; NULL or "" for none. A backend refuses a key it does not
     * know, or a value it cannot use, from create, with a message naming the keys it knows.
     * The host never passes options to a backend built for an older minor. */
    const char *params;
} lmh_backend_opts;

/* opts->precision where the host's struct has it, else DEFAULT (for backends). */
static inline int32_t lmh_opts_precision(const lmh_backend_opts *o) {
    return o && o->size >= sizeof(uint32_t) + 3 * sizeof(int32_t) ? o->precision
                                                                  : LMH_PRECISION_DEFAULT;
}

/* opts->params where the host's struct has it, else NULL (for backends). */
static inline const char *lmh_opts_params(const lmh_backend_opts *o) {
    return o && o->size >= offsetof(lmh_backend_opts, params) + sizeof(const char *) ? o->params
                                                                                     : NULL;
}

typedef struct lmh_backend_mem {
    uint64_t weights;           /* bytes of tensors made with LMH_TENSOR_WEIGHT */
    uint64_t other;             /* everything else the backend holds (cache, scratch) */
    uint64_t mapped;            /* weight bytes used in place from host memory (not copied) */
    uint64_t weight_bytes_read; /* bytes of weight tensors read by ops since creation */
} lmh_backend_mem;

/* Flags for tensor_new(). */
enum {
    LMH_TENSOR_WEIGHT = 1, /* read-only after upload; counted as weights */
};

/* (ABI 1.6) Kernels that another plugin brings for data only it understands (a cache
 * format's quantize and dequantize steps): one description holds an implementation for
 * each kind of backend, and a backend runs the one it can, in order with its ops. */
typedef struct lmh_kernel lmh_kernel; /* a kernel made ready on one backend */

#define LMH_KERNEL_MAX_TENSORS 6
#define LMH_KERNEL_MAX_PARAMS  16

/* One run of a kernel: `groups` workgroups over its tensors and parameters. */
typedef struct lmh_kernel_call {
    uint32_t n_tensors;
    lmh_tensor *t[LMH_KERNEL_MAX_TENSORS];
    uint32_t writes; /* bit i: t[i] is written (the others are only read) */
    uint32_t params[LMH_KERNEL_MAX_PARAMS];
    uint32_t groups;
} lmh_kernel_call;

/* What a CPU backend hands a kernel's C function: the tensors' first bytes. */
typedef struct lmh_kernel_cpu_args {
    const lmh_kernel_call *call;
    void *data[LMH_KERNEL_MAX_TENSORS];
} lmh_kernel_cpu_args;

typedef struct lmh_kernel_desc {
    uint32_t size;    /* sizeof(lmh_kernel_desc) as the plugin knows it */
    const char *name; /* for messages and profiles */
    /* CPU backends: runs workgroups [first, first + count) of the call. It may be called
     * from several threads at once with disjoint ranges. NULL: none for the CPU. */
    void (*cpu)(const lmh_kernel_cpu_args *a, uint32_t first, uint32_t count);
    /* Vulkan backends: a SPIR-V compute shader (entry point "main", its own local size),
     * spirv_bytes long; NULL: none. Tensor i is the storage buffer at set 0, binding i,
     * bound from an aligned offset at or before its first byte. Push constants, 32-bit
     * words: word i (i < 6) is where tensor i starts in its binding, in elements of its
     * dtype (4 bytes for quantized and i32 tensors); words 8..23 are the call's params.
     * Past 65535 workgroups the grid has rows: a workgroup's index is gl_WorkGroupID.x +
     * gl_NumWorkGroups.x * gl_WorkGroupID.y, and indices from the call's count on (the
     * last row's rest) must do nothing, so a kernel takes its count as a param. */
    const uint32_t *spirv;
    size_t spirv_bytes;
} lmh_kernel_desc;

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
     * The member may be NULL (or absent by size): the backend runs no quantized weights.
     * (ABI 1.10) qtype LMH_MXFP4 (group 32, hosts check the backend's abi_minor >= 10):
     * packed holds rows of in / 2 bytes (the blocks, 16 bytes each, not necessarily
     * 4-byte aligned), sb_dtype is LMH_U8, scales holds the in / 32 e8m0 bytes of each row
     * and biases is NULL.
     * (ABI 1.11) packed, scales and biases all NULL: the tensor's memory is the backend's own,
     * uninitialised, its rows written by tensor_quant_write (sb_dtype still says their type). */
    lmh_tensor *(*tensor_quant)(lmh_backend *b, lmh_dtype qtype, int32_t group, int32_t ndim,
                                const int64_t *ne, const uint32_t *packed, lmh_dtype sb_dtype,
                                const void *scales, const void *biases);

    /* (ABI 1.1) The read bandwidth of the device memory its tensors live in, in bytes/s,
     * measured now over a buffer larger than the device's caches: `lmhost bench` compares
     * decode with it. It frees what it allocated before returning. May be NULL (or absent
     * by size): the host then measures its own memory where the backend is the CPU's. */
    int (*read_bandwidth)(lmh_backend *b, double *bytes_per_s);

    /* (ABI 1.3) A download that does not wait: download_start records a device -> host copy
     * of n bytes at `offset` of t, ordered after the ops enqueued so far, hands the device
     * what is recorded and returns at once with a ticket; download_wait waits for that copy
     * alone, not for ops enqueued after it, writes the n bytes to dst and ends the ticket.
     * Every ticket is waited for once, in any order. With it the host enqueues the next
     * decode step, whose tokens are this step's picks on the device, before it reads them.
     * download_start returns LMH_EUNSUPPORTED (no ticket) when it holds as many copies as it
     * can (at least 2); both may be NULL (or absent by size): the host then downloads. */
    int (*download_start)(lmh_backend *b, const lmh_tensor *t, size_t offset, size_t n,
                          uint64_t *ticket);
    int (*download_wait)(lmh_backend *b, uint64_t ticket, void *dst, size_t n);

    /* (ABI 1.4) The rate of multiply-adds its matrix products can reach on the device, in
     * FLOP/s (a multiply-add is 2), measured now with the instructions and the threads or
     * cores those products use: `lmhost bench` compares prefill with it. `what` (what_len
     * bytes, NUL-terminated) says what was measured ("f32 FMA, avx2, 8 threads"). It frees
     * what it allocated before returning. May be NULL (or absent by size). */
    int (*compute_peak)(lmh_backend *b, double *flop_per_s, char *what, size_t what_len);

    /* (ABI 1.6) Makes a plugin's kernel ready to run here (a pipeline built, say). The
     * same desc (by address) gives the same kernel, which lives as long as the backend.
     * LMH_EUNSUPPORTED when desc has no implementation for this backend, or one this
     * device cannot run (a Vulkan kernel's shared memory or workgroup size past the
     * device's limits, read from its SPIR-V); err says why, and the plugin should take
     * another way where it has one. Both may be NULL (or absent by size): the backend runs no
     * plugin kernels. */
    int (*kernel_add)(lmh_backend *b, const lmh_kernel_desc *desc, lmh_kernel **out, char *err,
                      size_t err_len);
    /* Enqueues a run of k, ordered with the ops enqueued before and after it. */
    int (*kernel_run)(lmh_backend *b, lmh_kernel *k, const lmh_kernel_call *call);

    /* (ABI 1.9) The precision mode this backend runs in (LMH_PRECISION_EXACT or _FAST),
     * its default resolved. NULL (or absent by size): EXACT. */
    int32_t (*precision)(lmh_backend *b);

    /* (ABI 1.11) Writes rows [row0, row0 + n) of a weight tensor_quant made without parts
     * (its logical [.., out, in] seen as rows: expert e of a stack [E, out, in] is rows
     * e * out .. e * out + out - 1) from checkpoint parts laid out as tensor_quant's, for those
     * n rows alone, in the dtypes the tensor was made with (biases NULL for LMH_MXFP4).
     * Ordered with enqueued ops like upload: ops enqueued before it read the old rows. The
     * host streams experts from disk into a resident stack this way. LMH_EINVAL for a
     * tensor with lent parts or rows out of range. May be NULL (or absent by size): the host
     * then streams only float experts to this backend. */
    int (*tensor_quant_write)(lmh_backend *b, lmh_tensor *t, int64_t row0, int64_t n,
                              const uint32_t *packed, const void *scales, const void *biases);

    /* (ABI 1.13) The memory its tensors can take on the device: *total_bytes in all (the
     * device-local heap, or max-memory where lower) and *free_bytes of it not in use now by
     * anyone, as far as the device tells (Vulkan's memory budget; the host's available
     * memory for the CPU). The host splits a model's layers over several devices in
     * proportion to it. May be NULL (or absent by size): the host then splits evenly. */
    int (*device_memory)(lmh_backend *b, uint64_t *free_bytes, uint64_t *total_bytes);
} lmh_backend_api;

#ifdef __cplusplus
}
#endif
#endif
