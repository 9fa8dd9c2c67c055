/* Kernels over MLX affine-quantized weights (abi.h LMH_Q2..LMH_Q8), one table per
 * instruction set like kernels.h. The weights stay packed; a product dequantizes small
 * blocks of them (w = s * q + b, one rounding) into a cache-resident f32 buffer and runs
 * the f32 kernels of the same path over it, block by block of k exactly as those kernels
 * block k. So a quantized product gives the same bits as the f32 product over the
 * dequantized matrix, whatever the batch (batch invariance: continuous batching and
 * chunked prefill never change a result), and it inherits the f32 kernels' speed. */
#ifndef LMHOST_CPU_QKERNELS_H
#define LMHOST_CPU_QKERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__F16C__)
#include <immintrin.h>
#endif

/* One quantized matrix [rows, in] (an expert's slice of a stack is one too). */
typedef struct cpu_qmat {
    const uint32_t *q;  /* rows x wpr words: each row an LSB-first stream of `bits`-wide codes */
    const void *scales; /* rows x gpr values of sb (0 f32, 1 f16, 2 bf16 as lmh_dtype; 3 MX) */
    const void *biases;
    int32_t sb, bits, group;
    int64_t rows, in, wpr, gpr; /* wpr = in * bits / 32, gpr = in / group */
} cpu_qmat;

/* sb of a microscaled 4-bit matrix (abi.h LMH_MXFP4): bits 4, group 32, each row's blocks of
 * 16 bytes (the even value in the low nibble: an LSB-first 4-bit stream, like q4) e2m1
 * codes, scales one e8m0 byte a block, no biases. A value is cpu_mx_lut2[code] (twice the
 * e2m1 value, an integer in [-12, 12]) times cpu_mx_half_scale(s) = 2^(s - 128): both
 * factors and their product are exact in f32, so every path dequantizes to the same bits
 * and the exact mode's products are the f32 products over the exact weights. */
#define CPU_Q_MX 3
extern const int8_t cpu_mx_lut2[16];
static inline float cpu_mx_half_scale(uint8_t s) {
    /* 2^(s - 128): a normal float from s = 2 on, the subnormals 2^-127 and 2^-128 below */
    uint32_t u = s >= 2 ? (uint32_t)(s - 1) << 23 : 0x00400000u >> (1 - s);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

typedef struct cpu_qkernels {
    const char *name; /* the cpu_kernels path it goes with */
    /* y[0, k1 - k0) = W[row, k0..k1) dequantized; k0 and k1 are multiples of the group.
     * Codes are unpacked in registers and each weight byte is read once. */
    void (*dequant)(const cpu_qmat *w, int64_t row, int64_t k0, int64_t k1, float *y);
    /* Decode: y[o] = sum_k x[k] * W[o, k] for o in [o0, o1), dequantizing in registers
     * with the arithmetic the f32 kernels of the path apply to dequant's output (lane-wise
     * FMAs along k, one reduction per kblock of k, blocks added in order), so it gives
     * the bits cpu_q_matmul gives for the same row in a batch. NULL: no fused kernel. */
    void (*matvec)(const cpu_qmat *w, const float *x, int64_t o0, int64_t o1, float *y,
                   int64_t kblock);
    /* The same two for microscaled matrices (sb CPU_Q_MX); matvec_mx may be NULL. */
    void (*dequant_mx)(const cpu_qmat *w, int64_t row, int64_t k0, int64_t k1, float *y);
    void (*matvec_mx)(const cpu_qmat *w, const float *x, int64_t o0, int64_t o1, float *y,
                      int64_t kblock);
} cpu_qkernels;

/* Row `row`'s values [k0, k1) as f32 through the table's dequant for w's kind. */
static inline void cpu_q_dequant(const cpu_qkernels *qk, const cpu_qmat *w, int64_t row, int64_t k0,
                                 int64_t k1, float *y) {
    (w->sb == CPU_Q_MX ? qk->dequant_mx : qk->dequant)(w, row, k0, k1, y);
}

struct cpu_kernels;
/* Rows of W per block of cpu_q_matmul: dequantized whole (read from memory in order, so
 * the hardware prefetcher streams them) into `buf`, which stays in L2, then multiplied by
 * the f32 kernel, which blocks k itself. */
#define CPU_Q_ROWS 8
/* y[r * ldy + o] = sum_k x[r * in + k] * W[o, k] for r in [0, n), o in [o0, o1) (k and qk
 * of the same path). Decode (n == 1) runs qk's fused matvec, which reads each weight
 * byte once; n > 1 dequantizes blocks of whole rows into buf (CPU_Q_ROWS * in floats,
 * one per thread) once for all n rows and runs k's matmul_f32 over them. Both give the
 * same bits for a row. With buf NULL it goes row by row (slow, same bits). */
void cpu_q_matmul(const struct cpu_kernels *k, const cpu_qkernels *qk, const float *x, int64_t n,
                  const cpu_qmat *w, int64_t o0, int64_t o1, float *y, int64_t ldy, float *buf);

/* The table that goes with kernel path `name` ("portable", "avx2", "avx512", "neon"), so
 * the quantized kernels follow the choice (LMHOST_DEBUG simd) cpu_kernels_select made; the
 * portable table when this build has no such path. */
const cpu_qkernels *cpu_qkernels_for(const char *name);

/* ---- Fast mode (LMH_PRECISION_FAST): int8 activations, integer dot products ---------
 *
 * The activations of an op are quantized once (cpu_q8_quantize) to int8 per block of
 * `group` values, the weight's own groups: q = round_half_even(x * 127 / max|x|), d =
 * max|x| / 127, and xs = d * sum(q) (the sum of the quantized values, not of x: then the
 * bias term is exactly b * sum(d q), the result is the product of the dequantized weights
 * with the dequantized activations and its error is sum(w e) over the centred weights w =
 * s q + b, not sum((w - b) e), which is larger for MLX's biases near -s 2^(bits-1)). A
 * weight-group-wide block (not 32) costs one float step per group instead of one per 32
 * codes; its accuracy is measured in test_q8 (the worst relative error is printed).
 *
 * A row then is y[o] = sum_g s[o,g] d[g] isum[o,g] + b[o,g] xs[g], isum the exact integer
 * dot product of the (unsigned) codes with the int8 activations of group g.
 *
 * Invariance: the integer sums are exact, whatever instructions form them, and each path
 * has ONE row function (cpu_q8kernel.rows) that does the float steps of a row in one fixed
 * order (over the groups in order, lane-wise, then one fixed reduction), reading nothing
 * but that row of W and that row of the activations. Decode (n == 1) calls it for each
 * weight row, prefill (cpu_q8_matmul, n > 1) calls the same function for each activation
 * row over a block of CPU_Q8_ROWS weight rows that stays in cache. So, within one path, a
 * row's bits do not depend on the batch size n, the thread count or how the output rows
 * are split. Different paths (avx512-i8, avx2-i8, neon-i8, portable-i8) may differ in the
 * last bits; the exact mode above is untouched. */
typedef struct cpu_q8act {
    int64_t n, in;
    int32_t group;
    int8_t *q;     /* n x in, in [-127, 127] */
    float *d;      /* n x (in / group) scales */
    float *xs;     /* n x (in / group): d * isum */
    int32_t *isum; /* n x (in / group): sum of q (exact) */
} cpu_q8act;

/* One activation row (its q, d, xs, isum) against weight rows [o0, o1): y[o]. */
typedef void (*cpu_q8_rows_fn)(const cpu_qmat *w, const int8_t *xq, const float *xd,
                               const float *xs, const int32_t *xi, int64_t o0, int64_t o1,
                               float *y);
typedef struct cpu_q8kernel {
    const char *name; /* "avx512-i8", "avx2-i8", "neon-i8", "neon-dot-i8", "portable-i8" */
    cpu_q8_rows_fn rows;
    /* Optional, for prefill: weight rows [o0, o1) unpacked to a byte a code (row o at
     * ub + (o - o0) * stride), and `rows` over such rows (row o at ub + (o - ub0) * stride),
     * with the same float steps, so the same bits. */
    void (*unpack)(const cpu_qmat *w, int64_t o0, int64_t o1, uint8_t *ub, int64_t stride);
    void (*rows_u8)(const cpu_qmat *w, const uint8_t *ub, int64_t ub0, int64_t stride,
                    const int8_t *xq, const float *xd, const float *xs, const int32_t *xi,
                    int64_t o0, int64_t o1, float *y);
    /* `rows` for microscaled matrices (sb CPU_Q_MX, activations in blocks of 32): the codes
     * as cpu_mx_lut2's integers, so isum is exact and a row is
     * y[o] = sum_g (2^(s - 128) d[g]) isum[o,g] in one fixed order. NULL: cpu_q8_matmul
     * uses the portable one, and the backend keeps such matrices on the exact kernels. */
    cpu_q8_rows_fn rows_mx;
} cpu_q8kernel;

/* The portable microscaled row function (cpu_q8kernel.rows_mx's stand-in). */
void cpu_q8_mx_rows_portable(const cpu_qmat *w, const int8_t *xq, const float *xd, const float *xs,
                             const int32_t *xi, int64_t o0, int64_t o1, float *y);
/* Bytes cpu_q8_quantize needs for n rows of `in` in groups of `group`. */
size_t cpu_q8_bytes(int64_t n, int64_t in, int32_t group);
/* Quantizes x [n, in] into `mem` (cpu_q8_bytes of it, 64-byte aligned) and fills a. */
void cpu_q8_quantize(const float *x, int64_t n, int64_t in, int32_t group, void *mem, cpu_q8act *a);
/* Rows of W per block of cpu_q8_matmul (n > 1): 16 rows of 4096 8-bit codes are 64 KiB. */
#define CPU_Q8_ROWS 16
/* Bytes of cpu_q8_matmul's scratch for rows of `in` values: a block's codes a byte each. */
static inline size_t cpu_q8_scratch_bytes(int64_t in) {
    return (size_t)CPU_Q8_ROWS * (size_t)((in + 63) & ~(int64_t)63);
}
/* y[r * ldy + o] = row r of a against W[o] for r in [0, a->n), o in [o0, o1). With
 * scratch (cpu_q8_scratch_bytes(w->in), one per thread) and a kernel that unpacks, n > 1
 * unpacks each block of weight rows once for all the activation rows (same bits). */
void cpu_q8_matmul(const cpu_q8kernel *k, const cpu_q8act *a, const cpu_qmat *w, int64_t o0,
                   int64_t o1, float *y, int64_t ldy, uint8_t *scratch);
/* The fast kernel for the exact table qk (by its name), checked against this CPU: the
 * avx512 table gets avx512-i8 only where the CPU has AVX512-VNNI and AVX512-VBMI, else
 * avx2-i8; neon gets the dot-product kernel where the build targets it. */
const cpu_q8kernel *cpu_q8kernel_for(const cpu_qkernels *qk);
/* Every fast kernel this build has that this CPU can run, NULL-terminated (for tests). */
const cpu_q8kernel *const *cpu_q8kernels_available(void);

/* Shared by every path (qkernels_portable.c). */
/* Code j of a packed row. */
static inline uint32_t cpu_q_code(const uint32_t *row, int64_t j, int bits) {
    int64_t bit = j * bits;
    uint64_t two = row[bit / 32];
    if (bit % 32 + bits > 32) two |= (uint64_t)row[bit / 32 + 1] << 32;
    return (uint32_t)(two >> (bit % 32)) & ((1u << bits) - 1);
}
/* Packs n codes (n * bits a multiple of 32) into LSB-first little-endian words. */
void cpu_q_pack(const uint32_t *codes, int64_t n, int bits, uint32_t *words);
/* Scale or bias i as f32. */
float cpu_q_sb(const cpu_qmat *w, const void *p, int64_t i);
/* Scale or bias i as f32, inline: the SIMD kernels read two per group, and a call per
 * value cost a third of a 4-bit decode. `sb` is w->sb; the branch is the same for a
 * whole tensor, so it predicts perfectly. */
static inline float cpu_q_sb_at(int32_t sb, const void *p, int64_t i) {
    const uint16_t h = ((const uint16_t *)p)[sb == 0 ? 0 : i];
    if (sb == 0) return ((const float *)p)[i];
    if (sb == 2) { /* bf16: the upper half of an f32 */
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, sizeof f);
        return f;
    }
#if defined(__F16C__)
    return _cvtsh_ss(h);
#elif defined(__aarch64__)
    __fp16 f;
    memcpy(&f, &h, sizeof f);
    return (float)f;
#else
    return cpu_q_sb(&(cpu_qmat){.sb = 1}, p, i);
#endif
}

#endif
