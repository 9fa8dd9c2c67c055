/* The CPU backend plugin: tensors in host memory, ops run at enqueue time on a thread
 * pool (so sync() has nothing left to wait for), inner loops from the SIMD table chosen
 * at start (kernels.h; LMHOST_DEBUG simd=portable|avx2|avx512|neon forces one, for tests of
 * each path). It takes no options (lmh_backend_opts.params): --threads and --precision. */
#include "lmhost/lmhost.h"
#include "kernels.h"
#include "qkernels.h"
#include "recurrent.h"
#include "recurrent_check.h"
#include "threadpool.h"

#include <math.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

typedef struct cpu_tensor {
    lmh_tensor t; /* first: a cpu_tensor* is an lmh_tensor* */
    uint8_t *data;
    size_t bytes;
    int owned;   /* data was allocated here (not a view, not wrapped host memory) */
    int weight;  /* counted as weights; reads are counted in weight_bytes_read */
    int wrapped; /* data is host memory lent by the caller (mmap'd weights) */
    int qwrite;  /* (ABI 1.11) quantized, made without parts: rows come by tensor_quant_write */
    /* Quantized weights (tensor_quant): the packed codes, scales and biases, used in place
     * where the lent memory is aligned (zero copy: the mmap'd file stays the only copy),
     * else in `data`, which then holds all three. qm describes the whole [rows, in] stack. */
    cpu_qmat qm;
} cpu_tensor;

struct lmh_backend {
    const cpu_kernels *k;
    const cpu_qkernels *qk;
    cpu_pool *pool;
    int32_t precision; /* LMH_PRECISION_EXACT or _FAST (the default on a CPU: exact) */
    char desc[96];
    atomic_uint_fast64_t weight_bytes, other_bytes, mapped_bytes, weight_read;
    /* Per-worker blocks of dequantized weight rows for cpu_q_matmul, kept between ops (a
     * fresh allocation per op would be mapped and faulted in each time). Ops on one backend
     * run one at a time (its pool runs one job), so one buffer serves them all. */
    float *qbuf;
    int64_t qbuf_per; /* floats per worker */
    /* Fast mode: the int8 kernel, and the op's activations quantized once (cpu_q8act),
     * kept between ops like qbuf. */
    const cpu_q8kernel *q8;
    void *q8mem;
    size_t q8mem_bytes;
    /* Attention's scratch (per-row bounds, per-worker scores, the chunks' partial results),
     * kept between ops for the same reason as qbuf. */
    void *abuf;
    size_t abuf_bytes;
    struct lmh_kernel *kernels; /* plugin kernels made ready here (kernel_add) */
    /* The recurrent ops' small weight vectors (conv weights, biases, -exp(A_log), D, dt_bias)
     * in f32, made at their first use and kept while the weight lives: a Mamba-1 layer's
     * -exp(A_log) alone is D x N exponentials, which every step would redo. */
    struct f32vec *vecs;
};

typedef struct f32vec {
    const uint8_t *data; /* the weight's first byte (its views share it) */
    size_t bytes;        /* of the weight it was made from, from data on */
    lmh_dtype dtype;
    int64_t n;
    int neg_exp;
    float *v;
    struct f32vec *next;
} f32vec;

/* A plugin's kernel (ABI 1.6): its C function, run over workgroup ranges on the pool. */
struct lmh_kernel {
    const lmh_kernel_desc *desc;
    struct lmh_kernel *next;
};

/* b->qbuf with room for `in`-wide rows, or NULL (cpu_q_matmul then goes row by row). */
static float *qbuf_for(lmh_backend *b, int64_t in) {
    int64_t per = CPU_Q_ROWS * in;
    if (b->qbuf && b->qbuf_per >= per) return b->qbuf;
    free(b->qbuf);
    size_t bytes = (size_t)cpu_pool_threads(b->pool) * (size_t)per * sizeof(float);
    b->qbuf = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    b->qbuf_per = b->qbuf ? per : 0;
    return b->qbuf;
}

/* In fast mode, the int8 activations of x [n, in] for the quantized weight W: quantized
 * once per op into b->q8mem; NULL (the exact path) in exact mode, for groups the fast
 * kernels do not take, or when memory runs out. */
static const cpu_q8act *q8_for(lmh_backend *b, const cpu_qmat *W, const float *x, int64_t n,
                               cpu_q8act *a) {
    if (b->precision != LMH_PRECISION_FAST || !b->q8) return NULL;
    if (W->group != 32 && W->group != 64 && W->group != 128) return NULL;
    /* microscaled weights: int8 activations only with a SIMD row function (the portable one
     * is slower than the exact kernels) */
    if (W->sb == CPU_Q_MX && !b->q8->rows_mx) return NULL;
    size_t need = cpu_q8_bytes(n, W->in, W->group);
    need = (need + 63) & ~(size_t)63;
    if (b->q8mem_bytes < need) {
        free(b->q8mem);
        b->q8mem = aligned_alloc(64, need);
        b->q8mem_bytes = b->q8mem ? need : 0;
        if (!b->q8mem) return NULL;
    }
    cpu_q8_quantize(x, n, W->in, W->group, b->q8mem, a);
    return a;
}

#define CT(x)   ((cpu_tensor *)(x))
#define DATA(x) (CT(x)->data)

static const lmh_host_api *g_host;

static size_t nbytes(lmh_dtype dt, int32_t ndim, const int64_t *ne) {
    size_t n = lmh_dtype_size(dt);
    for (int i = 0; i < ndim; i++) n *= (size_t)ne[i];
    return n;
}

static int valid_shape(lmh_dtype dt, int32_t ndim, const int64_t *ne) {
    /* quantized tensors come only from tensor_quant */
    if ((unsigned)dt >= LMH_DTYPE_COUNT || lmh_dtype_is_packed(dt) || ndim < 1 ||
        ndim > LMH_MAX_DIMS)
        return 0;
    for (int i = 0; i < ndim; i++)
        if (ne[i] < 0 || ne[i] > ((int64_t)1 << 40)) return 0;
    return 1;
}

static cpu_tensor *tensor_alloc(lmh_dtype dt, int32_t ndim, const int64_t *ne) {
    cpu_tensor *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->t.dtype = dt;
    t->t.ndim = ndim;
    for (int i = 0; i < ndim; i++) t->t.ne[i] = ne[i];
    t->t.backend_priv = t;
    t->bytes = nbytes(dt, ndim, ne);
    return t;
}

static lmh_tensor *cpu_tensor_new(lmh_backend *b, lmh_dtype dt, int32_t ndim, const int64_t *ne,
                                  uint32_t flags) {
    if (!valid_shape(dt, ndim, ne)) return NULL;
    cpu_tensor *t = tensor_alloc(dt, ndim, ne);
    if (!t) return NULL;
    /* 64-byte alignment for full-width vector loads; at least one byte so empty tensors
     * still have an address. */
    size_t sz = (t->bytes + 63) & ~(size_t)63;
#ifdef MADV_HUGEPAGE
    /* Large tensors (a cache's keys and values, activations of long prompts) on 2 MiB
     * pages where the system gives them on request (transparent huge pages in madvise
     * mode): attention streams a long cache with far fewer TLB misses. */
    if (sz >= ((size_t)4 << 20)) {
        const size_t huge = (size_t)2 << 20;
        sz = (sz + huge - 1) & ~(huge - 1);
        t->data = aligned_alloc(huge, sz);
        if (t->data) madvise(t->data, sz, MADV_HUGEPAGE);
    } else
#endif
        t->data = aligned_alloc(64, sz ? sz : 64);
    if (!t->data) {
        free(t);
        return NULL;
    }
    t->owned = 1;
    t->weight = (flags & LMH_TENSOR_WEIGHT) != 0;
    atomic_fetch_add(t->weight ? &b->weight_bytes : &b->other_bytes, t->bytes);
    return &t->t;
}

static lmh_tensor *cpu_tensor_wrap(lmh_backend *b, lmh_dtype dt, int32_t ndim, const int64_t *ne,
                                   const void *host) {
    if (!valid_shape(dt, ndim, ne)) return NULL;
    cpu_tensor *t = tensor_alloc(dt, ndim, ne);
    if (!t) return NULL;
    t->data = (uint8_t *)(uintptr_t)host; /* read-only by contract: weights */
    t->weight = 1;
    t->wrapped = 1;
    atomic_fetch_add(&b->mapped_bytes, t->bytes);
    return &t->t;
}

static lmh_tensor *cpu_tensor_view(lmh_backend *b, lmh_tensor *base, size_t offset, lmh_dtype dt,
                                   int32_t ndim, const int64_t *ne) {
    (void)b;
    if (!base || !valid_shape(dt, ndim, ne)) return NULL;
    size_t n = nbytes(dt, ndim, ne);
    if (offset > CT(base)->bytes || n > CT(base)->bytes - offset) return NULL;
    cpu_tensor *t = tensor_alloc(dt, ndim, ne);
    if (!t) return NULL;
    t->data = CT(base)->data + offset;
    t->weight = CT(base)->weight;
    return &t->t;
}

/* (ABI 1.10) A microscaled 4-bit weight: the blocks and scales used in place where the
 * blocks are 4-byte aligned (the kernels read them as bytes; cpu_qmat keeps words), else
 * copied. */
static lmh_tensor *cpu_tensor_mx(lmh_backend *b, int32_t group, int32_t ndim, const int64_t *ne,
                                 const uint32_t *packed, lmh_dtype sbt, const void *scales,
                                 const void *biases) {
    /* (ABI 1.11) no parts at all: memory of our own, rows written later */
    const int own = !packed && !scales;
    if (group != 32 || (ndim != 2 && ndim != 3) || (!own && (!packed || !scales)) || biases ||
        sbt != LMH_U8)
        return NULL;
    for (int i = 0; i < ndim; i++)
        if (ne[i] <= 0 || ne[i] > ((int64_t)1 << 31)) return NULL;
    int64_t in = ne[ndim - 1], rows = ne[0] * (ndim == 3 ? ne[1] : 1);
    if (in % 32) return NULL;
    cpu_tensor *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->t.dtype = LMH_MXFP4;
    t->t.ndim = ndim;
    for (int i = 0; i < ndim; i++) t->t.ne[i] = ne[i];
    t->t.group = 32;
    t->t.backend_priv = t;
    cpu_qmat *m = &t->qm;
    *m = (cpu_qmat){.sb = CPU_Q_MX,
                    .bits = 4,
                    .group = 32,
                    .rows = rows,
                    .in = in,
                    .wpr = in / 8,
                    .gpr = in / 32};
    size_t qb = (size_t)(rows * in / 2), sb = (size_t)(rows * m->gpr);
    t->bytes = qb + sb;
    t->weight = 1;
    if (!own && (uintptr_t)packed % 4 == 0) {
        m->q = packed;
        m->scales = scales;
        t->wrapped = 1;
        atomic_fetch_add(&b->mapped_bytes, t->bytes);
        return &t->t;
    }
    t->data = aligned_alloc(64, (t->bytes + 63) & ~(size_t)63);
    if (!t->data) {
        free(t);
        return NULL;
    }
    if (!own) {
        memcpy(t->data, packed, qb);
        memcpy(t->data + qb, scales, sb);
    }
    m->q = (const uint32_t *)t->data;
    m->scales = t->data + qb;
    t->owned = 1;
    t->qwrite = own;
    atomic_fetch_add(&b->weight_bytes, t->bytes);
    return &t->t;
}

static lmh_tensor *cpu_tensor_quant(lmh_backend *b, lmh_dtype qt, int32_t group, int32_t ndim,
                                    const int64_t *ne, const uint32_t *packed, lmh_dtype sbt,
                                    const void *scales, const void *biases) {
    if (lmh_dtype_is_mxfp4(qt))
        return cpu_tensor_mx(b, group, ndim, ne, packed, sbt, scales, biases);
    int bits = lmh_quant_bits(qt);
    /* (ABI 1.11) no parts at all: memory of our own, rows written later */
    const int own = !packed && !scales && !biases;
    if (!bits || (group != 32 && group != 64 && group != 128) || (ndim != 2 && ndim != 3) ||
        (!own && (!packed || !scales || !biases)) ||
        (sbt != LMH_F32 && sbt != LMH_F16 && sbt != LMH_BF16))
        return NULL;
    for (int i = 0; i < ndim; i++)
        if (ne[i] <= 0 || ne[i] > ((int64_t)1 << 31)) return NULL;
    int64_t in = ne[ndim - 1], rows = ne[0] * (ndim == 3 ? ne[1] : 1);
    if (in % group || (in * bits) % 32) return NULL;
    cpu_tensor *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->t.dtype = qt;
    t->t.ndim = ndim;
    for (int i = 0; i < ndim; i++) t->t.ne[i] = ne[i];
    t->t.group = group;
    t->t.backend_priv = t;
    cpu_qmat *m = &t->qm;
    *m = (cpu_qmat){.sb = sbt == LMH_F32   ? 0
                          : sbt == LMH_F16 ? 1
                                           : 2,
                    .bits = bits,
                    .group = group,
                    .rows = rows,
                    .in = in,
                    .wpr = in * bits / 32,
                    .gpr = in / group};
    size_t qb = (size_t)(rows * m->wpr) * 4, sb = (size_t)(rows * m->gpr) * lmh_dtype_size(sbt);
    t->bytes = qb + 2 * sb;
    t->weight = 1;
    size_t al = lmh_dtype_size(sbt);
    if (!own && (uintptr_t)packed % 4 == 0 && (uintptr_t)scales % al == 0 &&
        (uintptr_t)biases % al == 0) {
        m->q = packed;
        m->scales = scales;
        m->biases = biases;
        t->wrapped = 1;
        atomic_fetch_add(&b->mapped_bytes, t->bytes);
        return &t->t;
    }
    /* misaligned in the file (a header length not a multiple of 8): copy the three parts */
    t->data = aligned_alloc(64, (t->bytes + 63) & ~(size_t)63);
    if (!t->data) {
        free(t);
        return NULL;
    }
    if (!own) {
        memcpy(t->data, packed, qb);
        memcpy(t->data + qb, scales, sb);
        memcpy(t->data + qb + sb, biases, sb);
    }
    m->q = (const uint32_t *)t->data;
    m->scales = t->data + qb;
    m->biases = t->data + qb + sb;
    t->owned = 1;
    t->qwrite = own;
    atomic_fetch_add(&b->weight_bytes, t->bytes);
    return &t->t;
}

/* (ABI 1.11) Rows [row0, row0 + n) of a quantized tensor made without parts, from parts
 * for those rows alone. Ops run at enqueue here, so a plain copy is in order with them. */
static int cpu_tensor_quant_write(lmh_backend *b, lmh_tensor *x, int64_t row0, int64_t n,
                                  const uint32_t *packed, const void *scales, const void *biases) {
    (void)b;
    if (!x || !lmh_dtype_is_packed(x->dtype) || !CT(x)->qwrite) return LMH_EINVAL;
    const cpu_qmat *m = &CT(x)->qm;
    const int mx = m->sb == CPU_Q_MX;
    if (row0 < 0 || n < 0 || row0 > m->rows || n > m->rows - row0) return LMH_EINVAL;
    if (!n) return LMH_OK;
    if (!packed || !scales || (mx ? biases != NULL : !biases)) return LMH_EINVAL;
    const size_t ss = mx ? 1 : m->sb == 0 ? 4 : 2;
    const size_t qr = (size_t)m->wpr * 4, sr = (size_t)m->gpr * ss;
    /* the parts live in our own `data` (cpu_tensor_quant, cpu_tensor_mx) */
    memcpy((uint8_t *)(uintptr_t)m->q + (size_t)row0 * qr, packed, (size_t)n * qr);
    memcpy((uint8_t *)(uintptr_t)m->scales + (size_t)row0 * sr, scales, (size_t)n * sr);
    if (!mx) memcpy((uint8_t *)(uintptr_t)m->biases + (size_t)row0 * sr, biases, (size_t)n * sr);
    return LMH_OK;
}

/* Drops the kept vectors made from bytes overlapping [p, p + n) (all of them with p NULL):
 * their weight is going, or being written (a weight may be uploaded to again and again). */
static void drop_vecs(lmh_backend *b, const uint8_t *p, size_t n) {
    for (f32vec **e = &b->vecs; *e;) {
        if (!p || ((*e)->data < p + n && p < (*e)->data + (*e)->bytes)) {
            f32vec *d = *e;
            *e = d->next;
            free(d->v);
            free(d);
        } else {
            e = &(*e)->next;
        }
    }
}

static void cpu_tensor_free(lmh_backend *b, lmh_tensor *x) {
    if (!x) return;
    cpu_tensor *t = CT(x);
    if (t->weight && (t->owned || t->wrapped)) drop_vecs(b, t->data, t->bytes);
    if (t->owned) {
        atomic_fetch_sub(t->weight ? &b->weight_bytes : &b->other_bytes, t->bytes);
        free(t->data);
    } else if (t->wrapped) {
        atomic_fetch_sub(&b->mapped_bytes, t->bytes);
    }
    free(t);
}

static int cpu_upload(lmh_backend *b, lmh_tensor *x, size_t off, const void *src, size_t n) {
    if (!x || lmh_dtype_is_packed(x->dtype) || off > CT(x)->bytes || n > CT(x)->bytes - off)
        return LMH_EINVAL;
    if (b->vecs && n) drop_vecs(b, DATA(x) + off, n);
    memcpy(DATA(x) + off, src, n);
    return LMH_OK;
}

static int cpu_download(lmh_backend *b, const lmh_tensor *x, size_t off, void *dst, size_t n) {
    (void)b;
    if (!x || lmh_dtype_is_packed(x->dtype) || off > CT(x)->bytes || n > CT(x)->bytes - off)
        return LMH_EINVAL;
    memcpy(dst, DATA(x) + off, n);
    return LMH_OK;
}

/* ---- helpers ---------------------------------------------------------------------- */

/* A weight operand: a float dtype, or quantized (made by tensor_quant). */
static int is_weight(lmh_dtype d) {
    return lmh_dtype_is_float(d) || lmh_dtype_is_packed(d);
}

/* Bytes of a quantized tensor's rows [r0, r0 + n) that a kernel reads: codes, scales and
 * biases. */
static size_t qbytes(const lmh_tensor *w, int64_t n) {
    const cpu_qmat *m = &CT(w)->qm;
    if (m->sb == CPU_Q_MX) return (size_t)n * ((size_t)m->wpr * 4 + (size_t)m->gpr);
    return (size_t)n * ((size_t)m->wpr * 4 + 2 * (size_t)m->gpr * (m->sb == 0 ? 4 : 2));
}

/* Element i of a float tensor of any float dtype, as f32 (for small per-row vectors). */
static inline float getf(const lmh_tensor *t, int64_t i) {
    switch (t->dtype) {
    case LMH_F32:
        return ((const float *)DATA(t))[i];
    case LMH_F16:
        return cpu_f16_to_f32(((const uint16_t *)DATA(t))[i]);
    case LMH_BF16:
        return cpu_bf16_to_f32(((const uint16_t *)DATA(t))[i]);
    default:
        return 0;
    }
}

static void count_read(lmh_backend *b, const lmh_tensor *w, size_t bytes) {
    if (CT(w)->weight) atomic_fetch_add_explicit(&b->weight_read, bytes, memory_order_relaxed);
}

/* ---- ops -------------------------------------------------------------------------- */

typedef struct job {
    lmh_backend *b;
    const lmh_op *op;
    const cpu_q8act *q8a; /* fast mode's int8 activations of a quantized matmul, or NULL */
} job;

static void row_to_f32(const cpu_kernels *k, const lmh_tensor *t, int64_t row, int64_t d,
                       float *y) {
    const uint8_t *p = DATA(t) + (size_t)row * (size_t)d * lmh_dtype_size(t->dtype);
    switch (t->dtype) {
    case LMH_F32:
        memcpy(y, p, (size_t)d * sizeof(float));
        break;
    case LMH_F16:
        k->f16_to_f32((const uint16_t *)p, y, d);
        break;
    case LMH_BF16:
        k->bf16_to_f32((const uint16_t *)p, y, d);
        break;
    default:
        memset(y, 0, (size_t)d * sizeof(float));
    }
}

static void do_get_rows(void *arg, int64_t i0, int64_t i1, int w) {
    (void)w;
    const job *j = arg;
    const lmh_op *op = j->op;
    const int32_t *ids = (const int32_t *)DATA(op->src[1]);
    int64_t d = lmh_inner(op->src[0]), V = lmh_nelem(op->src[0]) / d;
    float *y = (float *)DATA(op->dst);
    for (int64_t i = i0; i < i1; i++) {
        if (ids[i] < 0 || ids[i] >= V)
            memset(y + i * d, 0, (size_t)d * sizeof(float));
        else if (lmh_dtype_is_packed(op->src[0]->dtype))
            cpu_q_dequant(j->b->qk, &CT(op->src[0])->qm, ids[i], 0, d, y + i * d);
        else
            row_to_f32(j->b->k, op->src[0], ids[i], d, y + i * d);
    }
}

static void do_matmul(void *arg, int64_t o0, int64_t o1, int w) {
    const job *j = arg;
    const lmh_op *op = j->op;
    const cpu_kernels *k = j->b->k;
    const lmh_tensor *x = op->src[0], *W = op->src[1];
    int64_t in = lmh_inner(x), n = lmh_nelem(x) / in, out = W->ne[0];
    float *y = (float *)DATA(op->dst);
    switch (W->dtype) {
    case LMH_F32:
        k->matmul_f32((const float *)DATA(x), n, in, (const float *)DATA(W), o0, o1, y, out);
        break;
    case LMH_F16:
        k->matmul_f16((const float *)DATA(x), n, in, (const uint16_t *)DATA(W), o0, o1, y, out);
        break;
    case LMH_BF16:
        k->matmul_bf16((const float *)DATA(x), n, in, (const uint16_t *)DATA(W), o0, o1, y, out);
        break;
    default: /* quantized */
        if (j->q8a)
            cpu_q8_matmul(j->b->q8, j->q8a, &CT(W)->qm, o0, o1, y, out,
                          j->b->qbuf ? (uint8_t *)(j->b->qbuf + (int64_t)w * j->b->qbuf_per)
                                     : NULL);
        else
            cpu_q_matmul(k, j->b->qk, (const float *)DATA(x), n, &CT(W)->qm, o0, o1, y, out,
                         j->b->qbuf ? j->b->qbuf + (int64_t)w * j->b->qbuf_per : NULL);
        break;
    }
    if (op->src[2])
        for (int64_t r = 0; r < n; r++)
            for (int64_t o = o0; o < o1; o++) y[r * out + o] += getf(op->src[2], o);
}

static void do_rms_norm(void *arg, int64_t r0, int64_t r1, int w) {
    (void)w;
    const job *j = arg;
    const lmh_op *op = j->op;
    int64_t d = lmh_inner(op->src[0]);
    const float *x = (const float *)DATA(op->src[0]);
    float *y = (float *)DATA(op->dst);
    const float eps = op->p.f[0], off = op->p.f[1];
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = x + r * d;
        float *yr = y + r * d;
        double ss = 0;
        for (int64_t i = 0; i < d; i++) ss += (double)xr[i] * xr[i];
        float s = 1.0f / sqrtf((float)(ss / (double)d) + eps);
        if (op->src[1])
            for (int64_t i = 0; i < d; i++) yr[i] = xr[i] * s * (getf(op->src[1], i) + off);
        else
            for (int64_t i = 0; i < d; i++) yr[i] = xr[i] * s;
    }
}

static inline float silu(float v) {
    return v / (1.0f + expf(-v));
}
static inline float gelu_tanh(float v) {
    const float c = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * v * (1.0f + tanhf(c * (v + 0.044715f * v * v * v)));
}

static void do_elementwise(void *arg, int64_t i0, int64_t i1, int w) {
    (void)w;
    const job *j = arg;
    const lmh_op *op = j->op;
    const float *a = (const float *)DATA(op->src[0]);
    float *y = (float *)DATA(op->dst);
    const lmh_tensor *bt = op->src[1];
    int64_t bn = bt ? lmh_nelem(bt) : 0;
    switch (op->code) {
    case LMH_OP_ADD:
    case LMH_OP_MUL: {
        if (bt->dtype == LMH_F32) {
            const float *bb = (const float *)DATA(bt);
            if (op->code == LMH_OP_ADD)
                for (int64_t i = i0; i < i1; i++) y[i] = a[i] + bb[i % bn];
            else
                for (int64_t i = i0; i < i1; i++) y[i] = a[i] * bb[i % bn];
        } else {
            if (op->code == LMH_OP_ADD)
                for (int64_t i = i0; i < i1; i++) y[i] = a[i] + getf(bt, i % bn);
            else
                for (int64_t i = i0; i < i1; i++) y[i] = a[i] * getf(bt, i % bn);
        }
        break;
    }
    case LMH_OP_SCALE:
        for (int64_t i = i0; i < i1; i++) y[i] = a[i] * op->p.f[0];
        break;
    case LMH_OP_SWIGLU:
    case LMH_OP_GEGLU: {
        const int gelu = op->code == LMH_OP_GEGLU;
        if (bt) {
            const float *bb = (const float *)DATA(bt);
            if (gelu)
                for (int64_t i = i0; i < i1; i++) y[i] = gelu_tanh(a[i]) * bb[i];
            else
                for (int64_t i = i0; i < i1; i++) y[i] = silu(a[i]) * bb[i];
        } else {
            /* fused: each source row is [gate | up] */
            const int64_t d = lmh_inner(op->dst);
            for (int64_t i = i0; i < i1; i++) {
                const float *row = a + (i / d) * 2 * d;
                float g = row[i % d];
                y[i] = (gelu ? gelu_tanh(g) : silu(g)) * row[d + i % d];
            }
        }
        break;
    }
    case LMH_OP_SOFTCAP: {
        const float c = op->p.f[0];
        for (int64_t i = i0; i < i1; i++) y[i] = c * tanhf(a[i] / c);
        break;
    }
    case LMH_OP_SWIGLU_OAI: { /* rows of interleaved (gate, up) pairs */
        const float alpha = op->p.f[0], lim = op->p.f[1];
        for (int64_t i = i0; i < i1; i++) {
            float g = a[2 * i], u = a[2 * i + 1];
            g = g < lim ? g : lim;
            u = u < -lim ? -lim : u > lim ? lim : u;
            y[i] = (u + 1.0f) * (g / (1.0f + expf(-alpha * g)));
        }
        break;
    }
    default:
        break;
    }
}

static void do_transpose(void *arg, int64_t r0, int64_t r1, int w) {
    (void)w;
    const job *j = arg;
    const lmh_op *op = j->op;
    const lmh_tensor *x = op->src[0];
    const int64_t A = x->ne[0], B = x->ne[1], c = x->ne[2];
    const float *src = (const float *)DATA(x);
    float *dst = (float *)DATA(op->dst);
    for (int64_t r = r0; r < r1; r++) { /* dst row r = (j, i) */
        int64_t jj = r / A, ii = r % A;
        memcpy(dst + r * c, src + (ii * B + jj) * c, (size_t)c * sizeof(float));
    }
}

static void do_copy(void *arg, int64_t i0, int64_t i1, int w) {
    (void)w;
    const job *j = arg;
    const lmh_op *op = j->op;
    const cpu_kernels *k = j->b->k;
    lmh_dtype sd = op->src[0]->dtype, dd = op->dst->dtype;
    const uint8_t *s = DATA(op->src[0]) + (size_t)i0 * lmh_dtype_size(sd);
    uint8_t *d = DATA(op->dst) + (size_t)i0 * lmh_dtype_size(dd);
    int64_t n = i1 - i0;
    if (sd == dd) {
        memcpy(d, s, (size_t)n * lmh_dtype_size(sd));
    } else if (sd == LMH_F32 && dd == LMH_F16) {
        k->f32_to_f16((const float *)s, (uint16_t *)d, n);
    } else if (sd == LMH_F32 && dd == LMH_BF16) {
        k->f32_to_bf16((const float *)s, (uint16_t *)d, n);
    } else if (sd == LMH_F16 && dd == LMH_F32) {
        k->f16_to_f32((const uint16_t *)s, (float *)d, n);
    } else if (sd == LMH_BF16 && dd == LMH_F32) {
        k->bf16_to_f32((const uint16_t *)s, (float *)d, n);
    }
}

static void do_rope(void *arg, int64_t r0, int64_t r1, int w) {
    (void)w;
    const job *j = arg;
    const lmh_op *op = j->op;
    const lmh_tensor *x = op->src[0];
    int64_t heads = x->ne[1], hd = x->ne[2];
    int32_t rot = op->p.i[0], style = op->p.i[1];
    const int32_t *pos = (const int32_t *)DATA(op->src[1]);
    const float *src = (const float *)DATA(x);
    float *dst = (float *)DATA(op->dst);
    /* LMH_OP_ROPE_SWITCH: each row's table and factor by its src4 value (ABI 1.10) */
    const int sw = op->code == LMH_OP_ROPE_SWITCH;
    const int32_t *ends = sw ? (const int32_t *)DATA(op->src_more[0]) : NULL;
    int32_t half = rot / 2;
    float cs[512], sn[512]; /* rot <= 1024 is checked at enqueue */
    for (int64_t r = r0; r < r1; r++) {
        const int use_long = sw && ends[r] > op->p.i[2];
        const float *inv = (const float *)DATA(op->src[use_long ? 3 : 2]);
        const float af = op->p.f[use_long ? 1 : 0];
        /* float32 angle, like the reference implementations */
        for (int32_t i = 0; i < half; i++) {
            float a = (float)pos[r] * inv[i];
            cs[i] = cosf(a) * af;
            sn[i] = sinf(a) * af;
        }
        for (int64_t h = 0; h < heads; h++) {
            const float *xs = src + (r * heads + h) * hd;
            float *ys = dst + (r * heads + h) * hd;
            for (int32_t i = 0; i < half; i++) {
                int32_t a = style == LMH_ROPE_HALF ? i : 2 * i;
                int32_t b = style == LMH_ROPE_HALF ? i + half : 2 * i + 1;
                float x0 = xs[a], x1 = xs[b];
                ys[a] = x0 * cs[i] - x1 * sn[i];
                ys[b] = x1 * cs[i] + x0 * sn[i];
            }
            if (ys != xs)
                for (int64_t i = rot; i < hd; i++) ys[i] = xs[i];
        }
    }
}

/* ---- attention --------------------------------------------------------------------
 *
 * Keys are split into chunks of ATT_CHUNK positions, fixed by position (chunk c holds the
 * positions [c * ATT_CHUNK, (c + 1) * ATT_CHUNK)), whatever the batch, the thread count or
 * the ring's size. A chunk is worked for one query row at a time, kv head by kv head: the
 * scores of all the group's query heads against each K row (each K and V row read once for
 * the group), the chunk's own softmax (its max m, the sum l of exp(s - m)) and its unnormalised
 * output o = sum exp(s - m) v. The chunks of a (row, head) are then merged in position order:
 * M = max m_c, out = sum_c exp(m_c - M) o_c / sum_c exp(m_c - M) l_c.
 *
 * A row's result thus depends on its query, its position and the keys it sees, never on
 * which other rows share the op or how the tasks are spread: the same row decoded alone, in
 * a batch of sequences, or as one row of a prefill chunk gives the same bits. A ring is
 * walked oldest first (by position, not row order), so the sums are the same whatever the
 * ring's size: a sliding-window layer gives the same bits for a prompt fed in one chunk or
 * token by token.
 *
 * Two ways to spread the work, with the same arithmetic: few (row, kv head) pairs (decode)
 * make one task per (row, chunk) for all the kv heads (so the task reads whole cache rows in
 * order; split further over the kv heads where there are few chunks), writing partials to a
 * shared buffer, then one task per (row, head) merges; many (prefill) make one task per
 * (block of rows, kv head) that works its chunks one after the other into a buffer of its
 * own and merges them. */
#define ATT_CHUNK 256

typedef struct attn_job {
    const lmh_op *op;
    const cpu_kernels *k;
    int64_t heads, d, kvh, dv, group, ps; /* ps: floats of one chunk's partial */
    int64_t max_nc;                       /* the most chunks a row has */
    int64_t kvs;                          /* split mode: kv heads a task works */
    const int64_t *lo, *hi;               /* row r's visible positions, inclusive (lo > hi: none) */
    const int64_t *first;                 /* row r's first chunk (lo / ATT_CHUNK) */
    const int64_t *off; /* row r's partials start at off[r] * kvh (split mode), off[n] in all */
    float *part;        /* split mode: every partial */
    const float *sinks; /* [heads] sink logits (LMH_ATTN_SINKS) or NULL */
    float *wbuf; /* per worker: kvs (1 per row) x group x ATT_CHUNK scores, then (per-row mode)
                  * ATT_ROWS x max_nc partials */
    int64_t wper;
} attn_job;

static int64_t floor_div(int64_t a, int64_t b) {
    return a >= 0 ? a / b : -((-a + b - 1) / b);
}

/* Keys a step of attn_chunk: kv heads are taken in turn over this many keys, so the keys'
 * whole cache rows (every kv head's slice) are read in order, a stream the prefetchers follow
 * (one kv head's slices alone are a short piece of every row). The kernels make every value
 * the same whatever the blocks, so this is not part of the arithmetic. */
#define ATT_KEYS 16
/* Whole cache rows are asked for this many keys ahead of the block being worked. */
#define ATT_PREFETCH 64

/* Asks for the cache row of position pos, kv heads [g0, g1), w elements a head. */
static inline void attn_prefetch(const attn_job *a, const lmh_tensor *t, int64_t pos, int64_t g0,
                                 int64_t g1, int64_t w) {
    const int32_t ring = a->op->p.i[3];
    const int64_t row = ring ? pos % ring : pos - a->op->p.i[1];
    const size_t es = lmh_dtype_size(t->dtype);
    const uint8_t *base = DATA(t) + (size_t)((row * a->kvh + g0) * w) * es;
    const size_t bytes = (size_t)((g1 - g0) * w) * es;
    for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(base + off, 0, 3);
}

/* Chunk c of row r for kv heads [g0, g1): head g's partial at part + (g - g0) * pstride,
 * o [group][dv], then m [group], l [group]. sc holds (g1 - g0) * group * ATT_CHUNK scores. */
static void attn_chunk(const attn_job *a, int64_t r, int64_t g0, int64_t g1, int64_t c, float *sc,
                       float *part, int64_t pstride) {
    const lmh_op *op = a->op;
    const cpu_kernels *k = a->k;
    const lmh_tensor *K = op->src[1], *V = op->src[2];
    const int32_t kv0 = op->p.i[1], ring = op->p.i[3];
    const int64_t G = a->group, d = a->d, dv = a->dv, kvh = a->kvh;
    const float scale = op->p.f[0], cap = op->p.f[1];
    int64_t p0 = c * ATT_CHUNK, p1 = p0 + ATT_CHUNK - 1;
    if (p0 < a->lo[r]) p0 = a->lo[r];
    if (p1 > a->hi[r]) p1 = a->hi[r];
    const int64_t n = p1 - p0 + 1;
    const float *q = (const float *)DATA(op->src[0]) + r * a->heads * d;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1)
            for (int64_t g = g0; g < g1; g++) {
                float *o = part + (g - g0) * pstride, *m = o + G * dv, *l = m + G;
                const float *sg = sc + (g - g0) * G * ATT_CHUNK;
                for (int64_t h = 0; h < G; h++)
                    l[h] = k->attn_softmax((float *)sg + h * ATT_CHUNK, n, cap, &m[h]);
                memset(o, 0, (size_t)(G * dv) * sizeof(float));
            }
        /* runs of consecutive cache rows (two where a ring wraps), in blocks of ATT_KEYS */
        for (int64_t p = p0; p <= p1;) {
            const int64_t row = ring ? p % ring : p - kv0;
            int64_t run = ring && ring - row < p1 - p + 1 ? ring - row : p1 - p + 1;
            if (run > ATT_KEYS) run = ATT_KEYS;
            /* K rows ATT_PREFETCH keys ahead, then (near the end of the K pass) the first V
             * rows; the first K rows before the first block */
            const int64_t pf0 = pass == 0 && p == p0 ? p0 : p + ATT_PREFETCH;
            const int64_t pf1 = p + ATT_PREFETCH + run;
            for (int64_t pp = pf0; pp < pf1; pp++) {
                const int vpass = pass || pp > p1;
                const int64_t at = vpass && !pass ? pp - n : pp;
                if (at > p1) break;
                attn_prefetch(a, vpass ? V : K, at, g0, g1, vpass ? dv : d);
            }
            for (int64_t g = g0; g < g1; g++) {
                const int64_t at = (row * kvh + g) * (pass ? dv : d);
                float *s = sc + (g - g0) * G * ATT_CHUNK + (p - p0);
                const float *qv = q + g * G * d;
                float *o = part + (g - g0) * pstride;
                if (pass == 0) {
                    switch (K->dtype) {
                    case LMH_F32:
                        k->attn_scores_f32(qv, (int)G, d, (const float *)DATA(K) + at, kvh * d, run,
                                           scale, s, ATT_CHUNK);
                        break;
                    case LMH_F16:
                        k->attn_scores_f16(qv, (int)G, d, (const uint16_t *)DATA(K) + at, kvh * d,
                                           run, scale, s, ATT_CHUNK);
                        break;
                    default:
                        k->attn_scores_bf16(qv, (int)G, d, (const uint16_t *)DATA(K) + at, kvh * d,
                                            run, scale, s, ATT_CHUNK);
                        break;
                    }
                } else {
                    switch (V->dtype) {
                    case LMH_F32:
                        k->attn_values_f32(s, (int)G, ATT_CHUNK, (const float *)DATA(V) + at,
                                           kvh * dv, run, dv, o);
                        break;
                    case LMH_F16:
                        k->attn_values_f16(s, (int)G, ATT_CHUNK, (const uint16_t *)DATA(V) + at,
                                           kvh * dv, run, dv, o);
                        break;
                    default:
                        k->attn_values_bf16(s, (int)G, ATT_CHUNK, (const uint16_t *)DATA(V) + at,
                                            kvh * dv, run, dv, o);
                        break;
                    }
                }
            }
            p += run;
        }
    }
}

/* Head h (of its kv group) of row r from the row's nc partials (`stride` floats apart), in
 * chunk order. */
static void attn_merge(const attn_job *a, int64_t r, int64_t h, const float *parts, int64_t nc,
                       int64_t stride) {
    const int64_t G = a->group, dv = a->dv, hg = h % G;
    float *out = (float *)DATA(a->op->dst) + (r * a->heads + h) * dv;
    memset(out, 0, (size_t)dv * sizeof(float));
    if (nc <= 0) return;
    float M = -INFINITY;
    for (int64_t c = 0; c < nc; c++) {
        const float *m = parts + c * stride + G * dv;
        if (m[hg] > M) M = m[hg];
    }
    /* a sink joins the denominator only, after the chunks (the same order in any batch) */
    const float sink = a->sinks ? a->sinks[h] : -INFINITY;
    if (sink > M) M = sink;
    float L = 0;
    for (int64_t c = 0; c < nc; c++) {
        const float *pc = parts + c * stride, *m = pc + G * dv, *l = m + G;
        const float w = expf(m[hg] - M);
        L += l[hg] * w;
        a->k->axpy_f32(out, w, pc + hg * dv, dv);
    }
    if (a->sinks) L += expf(sink - M);
    const float inv = 1.0f / L;
    for (int64_t i = 0; i < dv; i++) out[i] *= inv;
}

static int64_t attn_chunks(const attn_job *a, int64_t r) {
    return a->lo[r] > a->hi[r] ? 0 : floor_div(a->hi[r], ATT_CHUNK) - a->first[r] + 1;
}

/* Split mode, first pass: task = (row, chunk, part of the kv heads), rows in order; the
 * partial of (row, chunk c, kv head g) at ((off[r] + c) * kvh + g) * ps. */
static void do_attn_chunks(void *arg, int64_t t0, int64_t t1, int w) {
    const attn_job *a = arg;
    float *sc = a->wbuf + (int64_t)w * a->wper;
    const int64_t np = (a->kvh + a->kvs - 1) / a->kvs;
    int64_t n = a->op->src[0]->ne[0], r = 0, lo = 0, hi = n;
    while (lo < hi) { /* the row whose tasks hold t0: the last r with off[r] * np <= t0 */
        int64_t mid = (lo + hi) / 2;
        if (a->off[mid + 1] * np <= t0)
            lo = mid + 1;
        else
            hi = mid;
    }
    r = lo;
    for (int64_t t = t0; t < t1; t++) {
        while (a->off[r + 1] * np <= t) r++;
        const int64_t u = t - a->off[r] * np, c = u / np, g0 = u % np * a->kvs;
        const int64_t g1 = g0 + a->kvs < a->kvh ? g0 + a->kvs : a->kvh;
        attn_chunk(a, r, g0, g1, a->first[r] + c, sc,
                   a->part + ((a->off[r] + c) * a->kvh + g0) * a->ps, a->ps);
    }
}

/* Split mode, second pass: task = (row, head). */
static void do_attn_merge(void *arg, int64_t t0, int64_t t1, int w) {
    (void)w;
    const attn_job *a = arg;
    for (int64_t t = t0; t < t1; t++) {
        const int64_t r = t / a->heads, h = t % a->heads, nc = a->off[r + 1] - a->off[r];
        attn_merge(a, r, h, a->part + (a->off[r] * a->kvh + h / a->group) * a->ps, nc,
                   a->kvh * a->ps);
    }
}

/* Per-row mode: task = (block of ATT_ROWS rows, kv head). The chunks go in position order,
 * each worked for every row of the block that sees it while its K and V rows are in cache
 * (a prefill chunk's rows share most of their keys), then each row's heads are merged. */
#define ATT_ROWS 8
static void do_attn_rows(void *arg, int64_t t0, int64_t t1, int w) {
    const attn_job *a = arg;
    const int64_t n = a->op->src[0]->ne[0];
    float *sc = a->wbuf + (int64_t)w * a->wper, *parts = sc + a->group * ATT_CHUNK;
    const int64_t per_row = a->max_nc * a->ps;
    for (int64_t t = t0; t < t1; t++) {
        const int64_t r0 = t / a->kvh * ATT_ROWS, g = t % a->kvh;
        const int64_t r1 = r0 + ATT_ROWS < n ? r0 + ATT_ROWS : n;
        int64_t c0 = INT64_MAX, c1 = INT64_MIN;
        for (int64_t r = r0; r < r1; r++) {
            const int64_t nc = attn_chunks(a, r);
            if (!nc) continue;
            if (a->first[r] < c0) c0 = a->first[r];
            if (a->first[r] + nc > c1) c1 = a->first[r] + nc;
        }
        for (int64_t c = c0; c < c1; c++)
            for (int64_t r = r0; r < r1; r++) {
                const int64_t nc = attn_chunks(a, r);
                if (c >= a->first[r] && c < a->first[r] + nc)
                    attn_chunk(a, r, g, g + 1, c, sc,
                               parts + (r - r0) * per_row + (c - a->first[r]) * a->ps, a->ps);
            }
        for (int64_t r = r0; r < r1; r++)
            for (int64_t h = g * a->group; h < (g + 1) * a->group; h++)
                attn_merge(a, r, h, parts + (r - r0) * per_row, attn_chunks(a, r), a->ps);
    }
}

/* b->abuf with at least `bytes`, or NULL. */
static void *abuf_for(lmh_backend *b, size_t bytes) {
    bytes = (bytes + 63) & ~(size_t)63;
    if (b->abuf && b->abuf_bytes >= bytes) return b->abuf;
    free(b->abuf);
    b->abuf = aligned_alloc(64, bytes);
    b->abuf_bytes = b->abuf ? bytes : 0;
    return b->abuf;
}

static int attention(lmh_backend *b, const lmh_op *op) {
    const lmh_tensor *q = op->src[0];
    attn_job a = {.op = op,
                  .k = b->k,
                  .heads = q->ne[1],
                  .d = q->ne[2],
                  .kvh = op->src[1]->ne[1],
                  .dv = op->src[2]->ne[2]};
    a.group = a.heads / a.kvh;
    a.ps = a.group * (a.dv + 2);
    const lmh_tensor *sinks = lmh_op_attn_sinks(op);
    a.sinks = sinks ? (const float *)DATA(sinks) : NULL;
    const int64_t n = q->ne[0];
    const int th = cpu_pool_threads(b->pool);
    const int32_t *qpos = (const int32_t *)DATA(op->src[3]);
    const int32_t n_kv = op->p.i[0], kv0 = op->p.i[1], window = op->p.i[2];
    const int32_t ring = op->p.i[3], total = op->p.i[4];
    /* Visible keys: positions (pq - window, pq] among those stored. A ring holds positions
     * [total - n_kv, total) with position p in row p % ring; a flat cache position kv0 + j
     * in row j. */
    int64_t max_nc = 0, chunks = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int64_t r = 0; r < n; r++) {
            const int64_t pq = qpos[r];
            int64_t lo, hi;
            if (ring) {
                hi = pq < total - 1 ? pq : total - 1;
                lo = total - n_kv;
            } else {
                hi = pq < kv0 + n_kv - 1 ? pq : kv0 + n_kv - 1;
                lo = kv0;
            }
            if (window > 0 && pq - window + 1 > lo) lo = pq - window + 1;
            const int64_t nc =
                lo > hi ? 0 : floor_div(hi, ATT_CHUNK) - floor_div(lo, ATT_CHUNK) + 1;
            if (pass == 0) {
                if (nc > max_nc) max_nc = nc;
                chunks += nc;
                continue;
            }
            ((int64_t *)a.lo)[r] = lo;
            ((int64_t *)a.hi)[r] = hi;
            ((int64_t *)a.first)[r] = lo > hi ? 0 : floor_div(lo, ATT_CHUNK);
            ((int64_t *)a.off)[r + 1] = a.off[r] + nc;
        }
        if (pass == 1) break;
        /* Split for a few rows (whole cache rows streamed, the fastest read of a long cache
         * when no other row shares it), and where there are too few (row, kv head) pairs to
         * keep every thread busy. */
        const int split = n < 4 || n * a.kvh < 8 * (int64_t)th;
        a.max_nc = max_nc;
        /* a split task takes all the kv heads of its chunk (whole cache rows), fewer where
         * that leaves too few tasks */
        a.kvs = a.kvh;
        while (a.kvs > 1 && chunks * ((a.kvh + a.kvs - 1) / a.kvs) < 4 * (int64_t)th)
            a.kvs = (a.kvs + 1) / 2;
        a.wper = (split ? a.kvs : 1) * a.group * ATT_CHUNK + (split ? 0 : ATT_ROWS * max_nc * a.ps);
        a.wper = (a.wper + 15) & ~(int64_t)15;
        size_t meta = (size_t)(4 * n + 1) * sizeof(int64_t);
        meta = (meta + 63) & ~(size_t)63;
        size_t bytes = meta + (size_t)th * (size_t)a.wper * sizeof(float) +
                       (split ? (size_t)(chunks * a.kvh * a.ps) * sizeof(float) : 0);
        uint8_t *buf = abuf_for(b, bytes);
        if (!buf) return LMH_ENOMEM;
        int64_t *ib = (int64_t *)buf;
        a.lo = ib;
        a.hi = ib + n;
        a.first = ib + 2 * n;
        a.off = ib + 3 * n;
        ib[3 * n] = 0;
        a.wbuf = (float *)(buf + meta);
        a.part = split ? a.wbuf + (size_t)th * (size_t)a.wper : NULL;
    }
    if (a.part) {
        cpu_pool_run(b->pool, chunks * ((a.kvh + a.kvs - 1) / a.kvs), 1, do_attn_chunks, &a);
        cpu_pool_run(b->pool, n * a.heads, 1, do_attn_merge, &a);
    } else {
        cpu_pool_run(b->pool, (n + ATT_ROWS - 1) / ATT_ROWS * a.kvh, 1, do_attn_rows, &a);
    }
    return LMH_OK;
}

/* ---- mixture of experts ------------------------------------------------------------ */

static void do_moe_route(void *arg, int64_t r0, int64_t r1, int w) {
    (void)w;
    const job *j = arg;
    const lmh_op *op = j->op;
    int64_t E = op->src[0]->ne[1], k = op->p.i[0];
    const float *lg = (const float *)DATA(op->src[0]);
    float *wt = (float *)DATA(op->dst);
    int32_t *ids = (int32_t *)DATA(op->src[1]);
    /* (ABI 1.11) the experts each row uses, its best m of the k */
    const int32_t *used = op->src[2] ? (const int32_t *)DATA(op->src[2]) : NULL;
    for (int64_t r = r0; r < r1; r++) {
        const int64_t m = used ? (used[r] < 1 ? 1 : used[r] > k ? k : used[r]) : k;
        const float *x = lg + r * E;
        float mx = -INFINITY;
        for (int64_t e = 0; e < E; e++) mx = x[e] > mx ? x[e] : mx;
        double sum = 0;
        for (int64_t e = 0; e < E; e++) sum += exp((double)(x[e] - mx));
        /* top k by repeated selection: k is small; ties go to the lower id like torch.topk */
        float chosen_sum = 0;
        for (int64_t s = 0; s < m; s++) {
            int64_t best = -1;
            for (int64_t e = 0; e < E; e++) {
                int taken = 0;
                for (int64_t t = 0; t < s && !taken; t++) taken = ids[r * k + t] == e;
                if (!taken && (best < 0 || x[e] > x[best])) best = e;
            }
            ids[r * k + s] = (int32_t)best;
            wt[r * k + s] = (float)(exp((double)(x[best] - mx)) / sum);
            chosen_sum += wt[r * k + s];
        }
        if (op->p.i[1] && chosen_sum > 0)
            for (int64_t s = 0; s < m; s++) wt[r * k + s] /= chosen_sum;
        /* the columns past m: column 0's expert at weight 0 (grouped by expert, they read no
         * other expert's weights) */
        for (int64_t s = m; s < k; s++) {
            ids[r * k + s] = ids[r * k];
            wt[r * k + s] = 0;
        }
    }
}

typedef struct moe_job {
    const lmh_backend *b;
    const cpu_kernels *k;
    const lmh_tensor *W;
    const float *xg;
    float *yg;
    const int64_t *start, *count;
    const int64_t (*tasks)[3]; /* expert, o0, o1 */
    int64_t in, out;
    const cpu_q8act *q8a; /* fast mode: xg as int8 */
} moe_job;

static void do_moe_tasks(void *arg, int64_t t0, int64_t t1, int w) {
    const moe_job *m = arg;
    size_t es = lmh_dtype_size(m->W->dtype);
    for (int64_t t = t0; t < t1; t++) {
        int64_t e = m->tasks[t][0], o0 = m->tasks[t][1], o1 = m->tasks[t][2];
        const uint8_t *we = DATA(m->W) + (size_t)e * (size_t)m->out * (size_t)m->in * es;
        const float *x = m->xg + m->start[e] * m->in;
        float *y = m->yg + m->start[e] * m->out;
        int64_t n = m->count[e];
        if (lmh_dtype_is_packed(m->W->dtype)) { /* expert e's slice of the stack */
            cpu_qmat q = CT(m->W)->qm;
            size_t sbs = q.sb == CPU_Q_MX ? 1 : q.sb == 0 ? 4 : 2;
            q.q += e * m->out * q.wpr;
            q.scales = (const uint8_t *)q.scales + (size_t)(e * m->out * q.gpr) * sbs;
            if (q.biases) q.biases = (const uint8_t *)q.biases + (size_t)(e * m->out * q.gpr) * sbs;
            q.rows = m->out;
            if (m->q8a) { /* expert e's rows of the int8 activations */
                const int64_t gpr = m->in / q.group, s0 = m->start[e];
                cpu_q8act a = *m->q8a;
                a.n = n;
                a.q += s0 * m->in;
                a.d += s0 * gpr;
                a.xs += s0 * gpr;
                a.isum += s0 * gpr;
                cpu_q8_matmul(m->b->q8, &a, &q, o0, o1, y, m->out, NULL);
                continue;
            }
            cpu_q_matmul(m->k, m->b->qk, x, n, &q, o0, o1, y, m->out,
                         m->b->qbuf ? m->b->qbuf + (int64_t)w * m->b->qbuf_per : NULL);
            continue;
        }
        switch (m->W->dtype) {
        case LMH_F32:
            m->k->matmul_f32(x, n, m->in, (const float *)we, o0, o1, y, m->out);
            break;
        case LMH_F16:
            m->k->matmul_f16(x, n, m->in, (const uint16_t *)we, o0, o1, y, m->out);
            break;
        case LMH_BF16:
            m->k->matmul_bf16(x, n, m->in, (const uint16_t *)we, o0, o1, y, m->out);
            break;
        default:
            break;
        }
    }
}

/* Groups the (row, slot) pairs by expert, runs one matmul per active expert over all its
 * rows, and scatters the results back. */
static int moe_matmul(lmh_backend *b, const lmh_op *op) {
    const lmh_tensor *x = op->src[0], *W = op->src[1], *idt = op->src[2];
    const int32_t *ids = (const int32_t *)DATA(idt);
    int64_t n = idt->ne[0], k = idt->ne[1], E = W->ne[0], out = W->ne[1], in = W->ne[2];
    int64_t pairs = n * k, per_slot = x->ndim == 3;
    int th = cpu_pool_threads(b->pool);
    int64_t *count = calloc((size_t)E, sizeof *count),
            *start = calloc((size_t)E + 1, sizeof *start);
    int64_t *order = malloc((size_t)pairs * sizeof *order), *fill = calloc((size_t)E, sizeof *fill);
    float *xg = malloc((size_t)pairs * (size_t)in * sizeof(float));
    float *yg = malloc((size_t)pairs * (size_t)out * sizeof(float));
    int64_t chunk = (out + 15) / 16 * 16 / (th > 1 ? th : 1);
    chunk = chunk < 16 ? 16 : (chunk + 15) & ~(int64_t)15;
    int64_t per_expert = (out + chunk - 1) / chunk;
    int64_t(*tasks)[3] = malloc((size_t)(E * per_expert) * sizeof *tasks);
    int rc = LMH_ENOMEM;
    if (!count || !start || !order || !fill || !xg || !yg || !tasks) goto out;
    for (int64_t p = 0; p < pairs; p++)
        if (ids[p] >= 0 && ids[p] < E) count[ids[p]]++;
    for (int64_t e = 0; e < E; e++) start[e + 1] = start[e] + count[e];
    for (int64_t p = 0; p < pairs; p++) {
        if (ids[p] < 0 || ids[p] >= E) {
            order[p] = -1;
            continue;
        }
        int64_t at = start[ids[p]] + fill[ids[p]]++;
        order[p] = at;
        const float *src = (const float *)DATA(x) + (per_slot ? p : p / k) * in;
        memcpy(xg + at * in, src, (size_t)in * sizeof(float));
    }
    int64_t nt = 0, active = 0;
    for (int64_t e = 0; e < E; e++) {
        if (!count[e]) continue;
        active++;
        for (int64_t o = 0; o < out; o += chunk) {
            tasks[nt][0] = e;
            tasks[nt][1] = o;
            tasks[nt][2] = o + chunk < out ? o + chunk : out;
            nt++;
        }
    }
    cpu_q8act q8a;
    const cpu_q8act *q8 = NULL;
    if (lmh_dtype_is_packed(W->dtype)) {
        q8 = q8_for(b, &CT(W)->qm, xg, start[E], &q8a);
        if (!q8) qbuf_for(b, in);
    }
    moe_job m = {.b = b,
                 .q8a = q8,
                 .k = b->k,
                 .W = W,
                 .xg = xg,
                 .yg = yg,
                 .start = start,
                 .count = count,
                 .tasks = (const int64_t(*)[3])tasks,
                 .in = in,
                 .out = out};
    cpu_pool_run(b->pool, nt, 1, do_moe_tasks, &m);
    float *dst = (float *)DATA(op->dst);
    for (int64_t p = 0; p < pairs; p++) {
        if (order[p] < 0)
            memset(dst + p * out, 0, (size_t)out * sizeof(float));
        else
            memcpy(dst + p * out, yg + order[p] * out, (size_t)out * sizeof(float));
    }
    count_read(b, W,
               lmh_dtype_is_packed(W->dtype)
                   ? qbytes(W, active * out)
                   : (size_t)active * (size_t)out * (size_t)in * lmh_dtype_size(W->dtype));
    rc = LMH_OK;
out:
    free(count);
    free(start);
    free(order);
    free(fill);
    free(xg);
    free(yg);
    free(tasks);
    return rc;
}

static void do_sigmoid_gate(void *arg, int64_t r0, int64_t r1, int w) {
    (void)w;
    const job *j = arg;
    const lmh_op *op = j->op;
    int64_t d = lmh_inner(op->src[0]);
    const float *x = (const float *)DATA(op->src[0]), *g = (const float *)DATA(op->src[1]);
    float *y = (float *)DATA(op->dst);
    if (lmh_nelem(op->src[1]) == lmh_nelem(op->src[0])) { /* elementwise */
        for (int64_t i = r0 * d; i < r1 * d; i++) y[i] = x[i] / (1.0f + expf(-g[i]));
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        float s = 1.0f / (1.0f + expf(-g[r]));
        for (int64_t i = 0; i < d; i++) y[r * d + i] = x[r * d + i] * s;
    }
}

/* ---- ABI 1.7: columns, activations, recurrent ops (recurrent.c) ---- */

static int64_t grain_for(int64_t n, int threads, int64_t min) {
    int64_t g = n / ((int64_t)threads * 4);
    return g < min ? min : g;
}

static void do_cols(void *arg, int64_t r0, int64_t r1, int w) {
    (void)w;
    const job *j = arg;
    const lmh_op *op = j->op;
    const int64_t W = lmh_inner(op->src[0]), n = lmh_inner(op->dst);
    const float *x = (const float *)DATA(op->src[0]);
    float *y = (float *)DATA(op->dst);
    if (op->src[1]) {
        const int32_t *idx = (const int32_t *)DATA(op->src[1]);
        for (int64_t r = r0; r < r1; r++)
            for (int64_t i = 0; i < n; i++) y[r * n + i] = x[r * W + idx[i]];
    } else {
        for (int64_t r = r0; r < r1; r++)
            memcpy(y + r * n, x + r * W + op->p.i[0], (size_t)n * sizeof(float));
    }
}

static void do_unary(void *arg, int64_t i0, int64_t i1, int w) {
    (void)w;
    const job *j = arg;
    const float *x = (const float *)DATA(j->op->src[0]);
    float *y = (float *)DATA(j->op->dst);
    const int fn = j->op->p.i[0];
    for (int64_t i = i0; i < i1; i++) y[i] = cpu_unary(fn, x[i]);
}

/* A recurrent op's operands: the small weight vectors in f32 (A_log already -exp'd). */
typedef struct rjob {
    const cpu_kernels *k;
    const lmh_op *op;
    float *w, *bias, *A, *D, *dtb; /* NULL where absent */
    float *tmp[5];                 /* those made for this op alone (not from weights) */
    int n_tmp;
} rjob;

#define F32(t) ((t) ? (float *)DATA(t) : NULL)

static void do_conv1d(void *arg, int64_t c0, int64_t c1, int wk) {
    (void)wk;
    const rjob *r = arg;
    const lmh_op *op = r->op;
    const int64_t n = op->dst->ne[0], C = lmh_inner(op->dst), K = lmh_inner(op->src[1]);
    cpu_conv1d(F32(op->src[0]), n, C, K, r->w, r->bias, F32(op->src[3]), F32(op->dst), op->p.i[0],
               c0, c1);
}

static void do_ssm_scan(void *arg, int64_t c0, int64_t c1, int wk) {
    (void)wk;
    const rjob *r = arg;
    const lmh_op *op = r->op;
    const int64_t n = op->dst->ne[0], D = lmh_inner(op->dst), N = lmh_inner(op->src[3]);
    cpu_ssm_scan(r->k, F32(op->src[0]), F32(op->src[1]), n, D, N, r->A, F32(op->src[3]),
                 F32(op->src_more[0]), r->D, r->dtb, F32(op->src_more[3]), F32(op->dst), c0, c1);
}

static void do_ssd_scan(void *arg, int64_t r0, int64_t r1, int wk) {
    (void)wk;
    const rjob *r = arg;
    const lmh_op *op = r->op;
    const int64_t n = op->dst->ne[0], H = op->p.i[0], G = op->p.i[1];
    const int64_t P = lmh_inner(op->dst) / H, N = lmh_inner(op->src[3]) / G;
    const float hi = op->p.f[1] > 0 ? op->p.f[1] : INFINITY;
    cpu_ssd_scan(r->k, F32(op->src[0]), F32(op->src[1]), n, H, P, G, N, r->A, F32(op->src[3]),
                 F32(op->src_more[0]), r->D, r->dtb, op->p.f[0], hi, F32(op->src_more[3]),
                 F32(op->dst), r0, r1);
}

static void do_delta_rule(void *arg, int64_t i0, int64_t i1, int wk) {
    (void)wk;
    const rjob *r = arg;
    const lmh_op *op = r->op;
    const lmh_tensor *q = op->src[0], *v = op->src[2];
    cpu_delta_rule(r->k, F32(q), F32(op->src[1]), F32(v), F32(op->src[3]), F32(op->src_more[0]),
                   q->ne[0], q->ne[1], v->ne[1], q->ne[2], v->ne[2], r->A, r->dtb, op->p.i[0],
                   op->p.f[1], op->p.f[0], F32(op->src_more[3]), F32(op->dst), i0, i1);
}

/* t's values as f32, -exp(v) with neg_exp (NULL for t NULL; *fail set when out of memory):
 * a weight's kept in b->vecs, another tensor's made for this op (r->tmp). */
static float *vec_f32(lmh_backend *b, rjob *r, const lmh_tensor *t, int neg_exp, int *fail) {
    if (!t) return NULL;
    const int64_t n = lmh_nelem(t);
    const int keep = CT(t)->weight;
    for (f32vec *e = keep ? b->vecs : NULL; e; e = e->next)
        if (e->data == DATA(t) && e->dtype == t->dtype && e->n == n && e->neg_exp == neg_exp)
            return e->v;
    float *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    f32vec *e = keep ? malloc(sizeof *e) : NULL;
    if (!v || (keep && !e)) {
        free(v);
        free(e);
        *fail = 1;
        return NULL;
    }
    for (int64_t i = 0; i < n; i++) v[i] = neg_exp ? -expf(getf(t, i)) : getf(t, i);
    if (keep) {
        *e = (f32vec){DATA(t), (size_t)n * lmh_dtype_size(t->dtype), t->dtype, n, neg_exp, v,
                      b->vecs};
        b->vecs = e;
    } else {
        r->tmp[r->n_tmp++] = v;
    }
    return v;
}

static int recurrent_op(lmh_backend *b, const lmh_op *op) {
    int fail = 0, th = cpu_pool_threads(b->pool);
    rjob r = {.k = b->k, .op = op};
    switch (op->code) {
    case LMH_OP_CONV1D:
        r.w = vec_f32(b, &r, op->src[1], 0, &fail);
        r.bias = vec_f32(b, &r, op->src[2], 0, &fail);
        if (!fail) {
            int64_t C = lmh_inner(op->dst);
            cpu_pool_run(b->pool, C, grain_for(C, th, 64), do_conv1d, &r);
        }
        break;
    case LMH_OP_SSM_SCAN:
    case LMH_OP_SSD_SCAN:
        r.A = vec_f32(b, &r, op->src[2], 1, &fail);
        r.D = vec_f32(b, &r, op->src_more[1], 0, &fail);
        r.dtb = vec_f32(b, &r, op->src_more[2], 0, &fail);
        if (!fail && op->code == LMH_OP_SSM_SCAN) {
            int64_t D = lmh_inner(op->dst);
            cpu_pool_run(b->pool, D, grain_for(D, th, 16), do_ssm_scan, &r);
        } else if (!fail) { /* rows of the state: (head, channel) */
            int64_t rows = lmh_inner(op->dst);
            cpu_pool_run(b->pool, rows, grain_for(rows, th, 16), do_ssd_scan, &r);
        }
        break;
    case LMH_OP_DELTA_RULE: {
        r.A = vec_f32(b, &r, op->src_more[1], 1, &fail);
        r.dtb = vec_f32(b, &r, op->src_more[2], 0, &fail);
        const int64_t Hv = op->src[2]->ne[1], dv = op->src[2]->ne[2];
        if (!fail)
            cpu_pool_run(b->pool, Hv * ((dv + DELTA_COLS - 1) / DELTA_COLS), 1, do_delta_rule, &r);
        break;
    }
    default:
        fail = 1;
    }
    for (int i = 0; i < r.n_tmp; i++) free(r.tmp[i]);
    return fail ? LMH_ENOMEM : LMH_OK;
}

/* check_op for the ops of ABI 1.7: the shared checks, then COLS's gather indices, which
 * are host memory here. */
static int check_recurrent(const lmh_op *op) {
    int rc = lmh_check_recurrent(op);
    if (rc != LMH_OK || op->code != LMH_OP_COLS || !op->src[1]) return rc;
    const int64_t W = lmh_inner(op->src[0]), w = lmh_inner(op->dst);
    const int32_t *idx = (const int32_t *)DATA(op->src[1]);
    for (int64_t i = 0; i < w; i++)
        if (idx[i] < 0 || idx[i] >= W) return LMH_EINVAL;
    return LMH_OK;
}

/* The lowest index of a row's largest value, NaNs skipped but a NaN first kept (the host
 * sampler's greedy rule): the maximum in eight running lanes (vector maxima), then the first
 * index holding it, sixteen values at a time. */
static int32_t row_argmax(const float *x, int64_t n) {
    if (n <= 0 || x[0] != x[0]) return 0;
    float m[8];
    for (int k = 0; k < 8; k++) m[k] = x[0];
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) m[k] = x[i + k] > m[k] ? x[i + k] : m[k];
    for (; i < n; i++) m[0] = x[i] > m[0] ? x[i] : m[0];
    for (int k = 1; k < 8; k++) m[0] = m[k] > m[0] ? m[k] : m[0];
    for (i = 0; i + 16 <= n; i += 16) {
        int hit = 0;
        for (int k = 0; k < 16; k++) hit |= x[i + k] == m[0];
        if (hit) break;
    }
    for (; i < n; i++)
        if (x[i] == m[0]) return (int32_t)i;
    return 0;
}

static void do_argmax(void *arg, int64_t r0, int64_t r1, int w) {
    (void)w;
    const job *j = arg;
    const lmh_op *op = j->op;
    int64_t n = lmh_inner(op->src[0]);
    const float *x = (const float *)DATA(op->src[0]);
    int32_t *y = (int32_t *)DATA(op->dst);
    for (int64_t r = r0; r < r1; r++) y[r] = row_argmax(x + r * n, n);
}

static void do_moe_combine(void *arg, int64_t r0, int64_t r1, int w) {
    (void)w;
    const job *j = arg;
    const lmh_op *op = j->op;
    int64_t k = op->src[0]->ne[1], d = op->src[0]->ne[2];
    const float *y = (const float *)DATA(op->src[0]), *wt = (const float *)DATA(op->src[1]);
    float *dst = (float *)DATA(op->dst);
    for (int64_t r = r0; r < r1; r++) {
        float *o = dst + r * d;
        for (int64_t i = 0; i < d; i++) o[i] = 0;
        for (int64_t s = 0; s < k; s++) j->b->k->axpy_f32(o, wt[r * k + s], y + (r * k + s) * d, d);
    }
}

/* Operand checks shared by supports() and enqueue(): everything a kernel relies on. */
static int check_op(const lmh_op *op) {
    const lmh_tensor *d = op->dst, *a = op->src[0], *b = op->src[1], *c = op->src[2];
    if (!d || !a) return LMH_EINVAL;
    switch (op->code) {
    case LMH_OP_GET_ROWS:
        if (!b || !is_weight(a->dtype) || b->dtype != LMH_I32 || d->dtype != LMH_F32) break;
        if (lmh_nelem(d) != lmh_nelem(b) * lmh_inner(a)) return LMH_ESHAPE;
        return LMH_OK;
    case LMH_OP_MATMUL: {
        if (!b || a->dtype != LMH_F32 || d->dtype != LMH_F32 || !is_weight(b->dtype)) break;
        if (b->ndim != 2 || lmh_inner(a) != b->ne[1]) return LMH_ESHAPE;
        int64_t rows = lmh_nelem(a) / lmh_inner(a);
        if (lmh_nelem(d) != rows * b->ne[0]) return LMH_ESHAPE;
        if (c && (!lmh_dtype_is_float(c->dtype) || lmh_nelem(c) != b->ne[0])) return LMH_ESHAPE;
        return LMH_OK;
    }
    case LMH_OP_RMS_NORM:
        if (a->dtype != LMH_F32 || d->dtype != LMH_F32) break;
        if (lmh_nelem(a) != lmh_nelem(d) || lmh_inner(a) != lmh_inner(d)) return LMH_ESHAPE;
        if (b && (!lmh_dtype_is_float(b->dtype) || lmh_nelem(b) != lmh_inner(a))) return LMH_ESHAPE;
        return LMH_OK;
    case LMH_OP_ADD:
    case LMH_OP_MUL:
        if (!b || a->dtype != LMH_F32 || d->dtype != LMH_F32 || !lmh_dtype_is_float(b->dtype))
            break;
        if (lmh_nelem(a) != lmh_nelem(d)) return LMH_ESHAPE;
        if (lmh_nelem(b) != lmh_nelem(a) && lmh_nelem(b) != lmh_inner(a) && lmh_nelem(b) != 1)
            return LMH_ESHAPE;
        if (lmh_nelem(b) == 0) return LMH_ESHAPE;
        return LMH_OK;
    case LMH_OP_SCALE:
    case LMH_OP_SOFTCAP:
        if (a->dtype != LMH_F32 || d->dtype != LMH_F32) break;
        if (op->code == LMH_OP_SOFTCAP && !(op->p.f[0] > 0)) return LMH_EINVAL;
        return lmh_nelem(a) == lmh_nelem(d) ? LMH_OK : LMH_ESHAPE;
    case LMH_OP_SWIGLU_OAI:
        if (a->dtype != LMH_F32 || d->dtype != LMH_F32) break;
        if (!(op->p.f[1] > 0) || !isfinite(op->p.f[0])) return LMH_EINVAL;
        return lmh_inner(a) == 2 * lmh_inner(d) && lmh_nelem(a) == 2 * lmh_nelem(d) ? LMH_OK
                                                                                    : LMH_ESHAPE;
    case LMH_OP_SWIGLU:
    case LMH_OP_GEGLU:
        if (a->dtype != LMH_F32 || d->dtype != LMH_F32 || (b && b->dtype != LMH_F32)) break;
        if (!b) /* fused [rows, 2d] -> [rows, d] */
            return lmh_inner(a) == 2 * lmh_inner(d) && lmh_nelem(a) == 2 * lmh_nelem(d)
                       ? LMH_OK
                       : LMH_ESHAPE;
        return lmh_nelem(a) == lmh_nelem(d) && lmh_nelem(b) == lmh_nelem(d) ? LMH_OK : LMH_ESHAPE;
    case LMH_OP_TRANSPOSE:
        if (a->dtype != LMH_F32 || d->dtype != LMH_F32) break;
        if (a->ndim != 3 || d->ndim != 3 || d->ne[0] != a->ne[1] || d->ne[1] != a->ne[0] ||
            d->ne[2] != a->ne[2])
            return LMH_ESHAPE;
        return LMH_OK;
    case LMH_OP_ROPE:
    case LMH_OP_ROPE_SWITCH: {
        /* the switch's long table and per-row values (ABI 1.10) */
        const int sw = op->code == LMH_OP_ROPE_SWITCH;
        const lmh_tensor *c2 = sw ? op->src[3] : c, *e = sw ? op->src_more[0] : b;
        if (!b || !c || !c2 || !e || a->dtype != LMH_F32 || d->dtype != LMH_F32 ||
            b->dtype != LMH_I32 || c->dtype != LMH_F32 || c2->dtype != LMH_F32 ||
            e->dtype != LMH_I32)
            break;
        if (a->ndim != 3 || lmh_nelem(a) != lmh_nelem(d) || lmh_nelem(b) != a->ne[0] ||
            lmh_nelem(e) != a->ne[0])
            return LMH_ESHAPE;
        if (op->p.i[0] <= 0 || op->p.i[0] % 2 || op->p.i[0] > a->ne[2] || op->p.i[0] > 1024 ||
            lmh_nelem(c) < op->p.i[0] / 2 || lmh_nelem(c2) < op->p.i[0] / 2 ||
            (op->p.i[1] != LMH_ROPE_HALF && op->p.i[1] != LMH_ROPE_INTERLEAVED) ||
            (sw && op->p.i[2] < 0))
            return LMH_EINVAL;
        return LMH_OK;
    }
    case LMH_OP_COPY:
        if (!lmh_dtype_is_float(a->dtype) || !lmh_dtype_is_float(d->dtype)) break;
        if (a->dtype != LMH_F32 && d->dtype != LMH_F32 && a->dtype != d->dtype) break;
        return lmh_nelem(a) == lmh_nelem(d) ? LMH_OK : LMH_ESHAPE;
    case LMH_OP_ATTENTION: {
        const lmh_tensor *K = b, *V = c, *pos = op->src[3];
        if (!K || !V || !pos || a->dtype != LMH_F32 || d->dtype != LMH_F32 ||
            !lmh_dtype_is_float(K->dtype) || !lmh_dtype_is_float(V->dtype) || pos->dtype != LMH_I32)
            break;
        if (a->ndim != 3 || K->ndim != 3 || V->ndim != 3 || d->ndim != 3) return LMH_ESHAPE;
        if (K->ne[1] <= 0 || a->ne[1] % K->ne[1] || V->ne[1] != K->ne[1] || K->ne[2] != a->ne[2] ||
            d->ne[0] != a->ne[0] || d->ne[1] != a->ne[1] || d->ne[2] != V->ne[2] ||
            lmh_nelem(pos) != a->ne[0] || V->ne[0] < K->ne[0])
            return LMH_ESHAPE;
        if (op->p.i[0] < 0 || op->p.i[0] > K->ne[0] || op->p.i[2] < 0 || op->p.i[3] < 0 ||
            (op->p.i[3] > 0 && (op->p.i[3] > K->ne[0] || op->p.i[4] < op->p.i[0])))
            return LMH_EINVAL;
        if (op->p.i[5] & ~LMH_ATTN_SINKS) return LMH_EINVAL;
        const lmh_tensor *sk = lmh_op_attn_sinks(op);
        if ((op->p.i[5] & LMH_ATTN_SINKS) &&
            (!sk || sk->dtype != LMH_F32 || lmh_nelem(sk) != a->ne[1]))
            return LMH_ESHAPE;
        return LMH_OK;
    }
    case LMH_OP_MOE_ROUTE:
        if (!b || a->dtype != LMH_F32 || d->dtype != LMH_F32 || b->dtype != LMH_I32) break;
        if (a->ndim != 2 || d->ndim != 2 || b->ndim != 2 || d->ne[0] != a->ne[0] ||
            d->ne[1] != op->p.i[0] || b->ne[0] != a->ne[0] || b->ne[1] != op->p.i[0])
            return LMH_ESHAPE;
        /* (ABI 1.11) src2: i32 [n], the experts each row uses */
        if (c && c->dtype != LMH_I32) break;
        if (c && lmh_nelem(c) != a->ne[0]) return LMH_ESHAPE;
        return op->p.i[0] >= 1 && op->p.i[0] <= a->ne[1] ? LMH_OK : LMH_EINVAL;
    case LMH_OP_MOE_MATMUL:
        if (!b || !c || a->dtype != LMH_F32 || d->dtype != LMH_F32 || !is_weight(b->dtype) ||
            c->dtype != LMH_I32)
            break;
        if (b->ndim != 3 || c->ndim != 2 || d->ndim != 3 || d->ne[0] != c->ne[0] ||
            d->ne[1] != c->ne[1] || d->ne[2] != b->ne[1] || lmh_inner(a) != b->ne[2] ||
            !((a->ndim == 2 && a->ne[0] == c->ne[0]) ||
              (a->ndim == 3 && a->ne[0] == c->ne[0] && a->ne[1] == c->ne[1])))
            return LMH_ESHAPE;
        return LMH_OK;
    case LMH_OP_SIGMOID_GATE:
        if (!b || a->dtype != LMH_F32 || b->dtype != LMH_F32 || d->dtype != LMH_F32) break;
        if (lmh_nelem(a) != lmh_nelem(d) ||
            (lmh_nelem(b) * lmh_inner(a) != lmh_nelem(a) && lmh_nelem(b) != lmh_nelem(a)))
            return LMH_ESHAPE;
        return LMH_OK;
    case LMH_OP_COLS:
    case LMH_OP_UNARY:
    case LMH_OP_CONV1D:
    case LMH_OP_SSM_SCAN:
    case LMH_OP_SSD_SCAN:
    case LMH_OP_DELTA_RULE:
        return check_recurrent(op);
    case LMH_OP_ARGMAX:
        if (a->dtype != LMH_F32 || d->dtype != LMH_I32) break;
        if (lmh_inner(a) < 1 || lmh_inner(a) > INT32_MAX ||
            lmh_nelem(d) * lmh_inner(a) != lmh_nelem(a))
            return LMH_ESHAPE;
        return LMH_OK;
    case LMH_OP_MOE_COMBINE:
        if (!b || a->dtype != LMH_F32 || b->dtype != LMH_F32 || d->dtype != LMH_F32) break;
        if (a->ndim != 3 || b->ndim != 2 || d->ndim != 2 || b->ne[0] != a->ne[0] ||
            b->ne[1] != a->ne[1] || d->ne[0] != a->ne[0] || d->ne[1] != a->ne[2])
            return LMH_ESHAPE;
        return LMH_OK;
    default:
        break;
    }
    return LMH_EUNSUPPORTED;
}

static int cpu_supports(lmh_backend *b, const lmh_op *op) {
    (void)b;
    return check_op(op) == LMH_OK;
}

static int cpu_enqueue(lmh_backend *b, const lmh_op *op) {
    int rc = check_op(op);
    if (rc != LMH_OK) return rc;
    /* an op writing into a weight: the vectors kept from it are stale */
    if (b->vecs && CT(op->dst)->weight) drop_vecs(b, DATA(op->dst), CT(op->dst)->bytes);
    job j = {.b = b, .op = op};
    int th = cpu_pool_threads(b->pool);
    const lmh_tensor *a = op->src[0];
    switch (op->code) {
    case LMH_OP_GET_ROWS: {
        int64_t n = lmh_nelem(op->src[1]);
        cpu_pool_run(b->pool, n, 16, do_get_rows, &j);
        count_read(b, a,
                   lmh_dtype_is_packed(a->dtype)
                       ? qbytes(a, n)
                       : (size_t)n * (size_t)lmh_inner(a) * lmh_dtype_size(a->dtype));
        break;
    }
    case LMH_OP_MATMUL: {
        const lmh_tensor *W = op->src[1];
        int64_t out = W->ne[0];
        /* Split the weight rows: each byte of W is read by one worker only. Chunks are a
         * multiple of 16 rows to keep the kernels' blocks whole. */
        int64_t g = grain_for(out, th, 16);
        g = (g + 15) & ~(int64_t)15;
        int quant = lmh_dtype_is_packed(W->dtype);
        cpu_q8act q8a;
        if (quant) {
            /* (a router's product stays exact: LMH_MATMUL_EXACT) */
            j.q8a = op->p.i[0] & LMH_MATMUL_EXACT ? NULL
                                                  : q8_for(b, &CT(W)->qm, (const float *)DATA(a),
                                                           lmh_nelem(a) / lmh_inner(a), &q8a);
            /* (the exact path's dequantized rows; the fast one's prefill unpacks codes into
             * it, cpu_q8_scratch_bytes fitting in CPU_Q_ROWS rows of floats) */
            if (!j.q8a || lmh_nelem(a) > lmh_inner(a)) qbuf_for(b, CT(W)->qm.in);
        }
        cpu_pool_run(b->pool, out, g, do_matmul, &j);
        count_read(b, W, quant ? qbytes(W, out) : (size_t)lmh_nelem(W) * lmh_dtype_size(W->dtype));
        if (op->src[2]) count_read(b, op->src[2], (size_t)out * lmh_dtype_size(op->src[2]->dtype));
        break;
    }
    case LMH_OP_RMS_NORM: {
        int64_t rows = lmh_nelem(a) / lmh_inner(a);
        cpu_pool_run(b->pool, rows, grain_for(rows, th, 4), do_rms_norm, &j);
        break;
    }
    case LMH_OP_ADD:
    case LMH_OP_MUL:
    case LMH_OP_SCALE:
    case LMH_OP_SWIGLU:
    case LMH_OP_GEGLU:
    case LMH_OP_SWIGLU_OAI:
    case LMH_OP_SOFTCAP: {
        int64_t n = lmh_nelem(op->dst);
        cpu_pool_run(b->pool, n, grain_for(n, th, 4096), do_elementwise, &j);
        break;
    }
    case LMH_OP_COPY: {
        int64_t n = lmh_nelem(op->dst);
        cpu_pool_run(b->pool, n, grain_for(n, th, 8192), do_copy, &j);
        break;
    }
    case LMH_OP_ROPE:
    case LMH_OP_ROPE_SWITCH:
        cpu_pool_run(b->pool, a->ne[0], 1, do_rope, &j);
        break;
    case LMH_OP_TRANSPOSE: {
        int64_t rows = a->ne[0] * a->ne[1];
        cpu_pool_run(b->pool, rows, grain_for(rows, th, 16), do_transpose, &j);
        break;
    }
    case LMH_OP_ATTENTION:
        return attention(b, op);
    case LMH_OP_MOE_ROUTE:
        cpu_pool_run(b->pool, a->ne[0], 8, do_moe_route, &j);
        break;
    case LMH_OP_MOE_MATMUL:
        return moe_matmul(b, op);
    case LMH_OP_SIGMOID_GATE:
        cpu_pool_run(b->pool, lmh_nelem(a) / lmh_inner(a), 16, do_sigmoid_gate, &j);
        break;
    case LMH_OP_MOE_COMBINE:
        cpu_pool_run(b->pool, a->ne[0], 4, do_moe_combine, &j);
        break;
    case LMH_OP_ARGMAX:
        cpu_pool_run(b->pool, lmh_nelem(op->dst), 1, do_argmax, &j);
        break;
    case LMH_OP_COLS: {
        int64_t rows = lmh_nelem(op->dst) / lmh_inner(op->dst);
        cpu_pool_run(b->pool, rows, grain_for(rows, th, 16), do_cols, &j);
        break;
    }
    case LMH_OP_UNARY: {
        int64_t n = lmh_nelem(op->dst);
        cpu_pool_run(b->pool, n, grain_for(n, th, 4096), do_unary, &j);
        break;
    }
    case LMH_OP_CONV1D:
    case LMH_OP_SSM_SCAN:
    case LMH_OP_SSD_SCAN:
    case LMH_OP_DELTA_RULE:
        return recurrent_op(b, op);
    default:
        return LMH_EUNSUPPORTED;
    }
    return LMH_OK;
}

static int cpu_sync(lmh_backend *b) {
    (void)b; /* ops ran at enqueue */
    return LMH_OK;
}

static void cpu_memory(lmh_backend *b, lmh_backend_mem *m) {
    m->weights = atomic_load(&b->weight_bytes);
    m->other = atomic_load(&b->other_bytes);
    m->mapped = atomic_load(&b->mapped_bytes);
    m->weight_bytes_read = atomic_load(&b->weight_read);
}

static int cpu_device_memory(lmh_backend *b, uint64_t *free_bytes, uint64_t *total_bytes) {
    (void)b;
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    unsigned long long kb = 0;
    char line[256];
    FILE *f = fopen("/proc/meminfo", "r");
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    if (f) fclose(f);
    *total_bytes = pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : 0;
    *free_bytes = kb ? (uint64_t)kb << 10 : *total_bytes;
    return *total_bytes ? LMH_OK : LMH_EUNSUPPORTED;
}

static const char *cpu_describe(lmh_backend *b) {
    return b->desc;
}

static int32_t cpu_precision(lmh_backend *b) {
    return b->precision;
}

static int cpu_create(const lmh_host_api *host, const lmh_backend_opts *o, lmh_backend **out,
                      char *err, size_t err_len) {
    (void)host;
    char key[32], val[32];
    const char *params = lmh_opts_params(o);
    if (lmh_kv_next(&params, key, sizeof key, val, sizeof val)) {
        snprintf(err, err_len,
                 "unknown option '%s' (the cpu backend takes none: --threads and --precision "
                 "set its threads and arithmetic)",
                 key);
        return LMH_EINVAL;
    }
    char force[32] = "";
    lmh_debug_get("simd", force, sizeof force);
    const cpu_kernels *k = cpu_kernels_select(force[0] ? force : NULL);
    if (!k) {
        snprintf(err, err_len, "LMHOST_DEBUG simd=%s: this CPU or build cannot run that path",
                 force);
        return LMH_EUNSUPPORTED;
    }
    lmh_backend *b = calloc(1, sizeof *b);
    if (!b) return LMH_ENOMEM;
    b->k = k;
    b->qk = cpu_qkernels_for(k->name);
    b->q8 = cpu_q8kernel_for(b->qk);
    b->precision =
        lmh_opts_precision(o) == LMH_PRECISION_FAST ? LMH_PRECISION_FAST : LMH_PRECISION_EXACT;
    b->pool = cpu_pool_new(o && o->threads > 0 ? o->threads : 0);
    if (!b->pool) {
        free(b);
        snprintf(err, err_len, "cannot start worker threads");
        return LMH_ENOMEM;
    }
    snprintf(b->desc, sizeof b->desc, "cpu(%s, %d threads)", k->name, cpu_pool_threads(b->pool));
    *out = b;
    return LMH_OK;
}

static void cpu_destroy(lmh_backend *b) {
    if (!b) return;
    while (b->kernels) {
        struct lmh_kernel *k = b->kernels;
        b->kernels = k->next;
        free(k);
    }
    cpu_pool_free(b->pool);
    free(b->qbuf);
    free(b->q8mem);
    free(b->abuf);
    drop_vecs(b, NULL, 0);
    free(b);
}

static int cpu_init(const lmh_host_api *host, char *err, size_t err_len) {
    (void)err;
    (void)err_len;
    g_host = host;
    return 0;
}

/* lmh_backend_api.compute_peak: the kernel table's multiply-add chains on every worker,
 * PEAK_TASKS a worker handed out as the products' chunks are; rounds doubled until a run
 * takes 30 ms, then the best of three runs. */
#define PEAK_TASKS 4
typedef struct peak_job {
    const cpu_kernels *k;
    int64_t iters;
    float sink[256 * PEAK_TASKS]; /* the chains' sums, kept so that they are computed */
} peak_job;

static void do_peak(void *arg, int64_t i0, int64_t i1, int worker) {
    (void)worker;
    peak_job *j = arg;
    for (int64_t i = i0; i < i1; i++) j->sink[i] = j->k->fma_loop(j->iters, 0.999f, 0.5f);
}

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cpu_compute_peak(lmh_backend *b, double *flop_per_s, char *what, size_t what_len) {
    int th = cpu_pool_threads(b->pool);
    if (th > 256) return LMH_EUNSUPPORTED;
    peak_job *j = calloc(1, sizeof *j);
    if (!j) return LMH_ENOMEM;
    j->k = b->k;
    j->iters = 1024;
    int64_t tasks = (int64_t)th * PEAK_TASKS;
    double best = 0;
    for (int runs = 0; runs < 3;) {
        double t0 = seconds();
        cpu_pool_run(b->pool, tasks, 1, do_peak, j);
        double t = seconds() - t0;
        if (t < 0.03 && j->iters < ((int64_t)1 << 40)) {
            j->iters *= 2;
            continue;
        }
        double f = (double)tasks * (double)j->iters * b->k->fma_flops / t;
        if (f > best) best = f;
        runs++;
    }
    free(j);
    *flop_per_s = best;
    snprintf(what, what_len, "f32 multiply-adds, %s, %d threads; best of 3", b->k->name, th);
    return LMH_OK;
}

static int cpu_kernel_add(lmh_backend *b, const lmh_kernel_desc *desc, lmh_kernel **out, char *err,
                          size_t err_len) {
    *out = NULL;
    for (struct lmh_kernel *k = b->kernels; k; k = k->next)
        if (k->desc == desc) {
            *out = k;
            return LMH_OK;
        }
    if (!desc || desc->size < offsetof(lmh_kernel_desc, cpu) + sizeof desc->cpu || !desc->cpu) {
        snprintf(err, err_len, "kernel '%s' has no implementation for the CPU",
                 desc && desc->name ? desc->name : "?");
        return LMH_EUNSUPPORTED;
    }
    struct lmh_kernel *k = calloc(1, sizeof *k);
    if (!k) return LMH_ENOMEM;
    k->desc = desc;
    k->next = b->kernels;
    b->kernels = k;
    *out = k;
    return LMH_OK;
}

typedef struct kernel_job {
    const struct lmh_kernel *k;
    lmh_kernel_cpu_args args;
} kernel_job;

static void do_kernel_range(void *arg, int64_t i0, int64_t i1, int worker) {
    (void)worker;
    const kernel_job *j = arg;
    j->k->desc->cpu(&j->args, (uint32_t)i0, (uint32_t)(i1 - i0));
}

static int cpu_kernel_run(lmh_backend *b, lmh_kernel *k, const lmh_kernel_call *call) {
    if (!k || !call || call->n_tensors > LMH_KERNEL_MAX_TENSORS) return LMH_EINVAL;
    kernel_job j = {.k = k, .args = {.call = call}};
    for (uint32_t i = 0; i < call->n_tensors; i++) {
        if (!call->t[i]) return LMH_EINVAL;
        j.args.data[i] = CT(call->t[i])->data;
        if (b->vecs && (call->writes >> i & 1) && CT(call->t[i])->weight)
            drop_vecs(b, CT(call->t[i])->data, CT(call->t[i])->bytes);
    }
    if (call->groups) cpu_pool_run(b->pool, call->groups, 1, do_kernel_range, &j);
    return LMH_OK;
}

static const char *const weight_dtypes[] = {"f32", "f16", "bf16", "q2",    "q3", "q4",
                                            "q5",  "q6",  "q8",   "mxfp4", NULL};
static const char *const ops[] = {
    "get_rows",   "matmul",      "rms_norm",    "add",          "mul",       "scale",
    "swiglu",     "geglu",       "rope",        "copy",         "attention", "softcap",
    "moe_route",  "moe_matmul",  "moe_combine", "sigmoid_gate", "transpose", "argmax",
    "cols",       "unary",       "conv1d",      "ssm_scan",     "ssd_scan",  "delta_rule",
    "swiglu_oai", "rope_switch", NULL};

static const lmh_backend_api api = {
    .size = sizeof(lmh_backend_api),
    .weight_dtypes = weight_dtypes,
    .ops = ops,
    .create = cpu_create,
    .destroy = cpu_destroy,
    .describe = cpu_describe,
    .supports = cpu_supports,
    .tensor_new = cpu_tensor_new,
    .tensor_wrap = cpu_tensor_wrap,
    .tensor_view = cpu_tensor_view,
    .tensor_free = cpu_tensor_free,
    .upload = cpu_upload,
    .download = cpu_download,
    .enqueue = cpu_enqueue,
    .sync = cpu_sync,
    .memory = cpu_memory,
    .tensor_quant = cpu_tensor_quant,
    .compute_peak = cpu_compute_peak,
    .kernel_add = cpu_kernel_add,
    .kernel_run = cpu_kernel_run,
    .precision = cpu_precision,
    .device_memory = cpu_device_memory,
    .tensor_quant_write = cpu_tensor_quant_write,
};

static const lmh_plugin_info info = {
    LMH_PLUGIN_HEADER,
    .kind = LMH_KIND_BACKEND,
    .name = "cpu",
    .version = "0.1.0",
    .summary = "host CPU; f32 compute over f32/f16/bf16 and MLX 2-8 bit weights; AVX-512, "
               "AVX2+FMA, NEON or "
               "portable C chosen at run time",
    .init = cpu_init,
    .api = &api,
};

LMH_EXPORT const lmh_plugin_info *lmhost_plugin_entry(void) {
    return &info;
}
