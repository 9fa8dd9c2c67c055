/* Kernels over MLX affine-quantized weights (abi.h LMH_Q2..LMH_Q8), one table per
 * instruction set like kernels.h, computed on the packed data: a group of codes is
 * unpacked in registers, and since sum_k x_k (s q_k + b) = s * sum_k x_k q_k + b * sum_k x_k,
 * only the integer codes meet x; the group sums of x are computed once per row of x. */
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
    const void *scales; /* rows x gpr values of sb (0 f32, 1 f16, 2 bf16 as lmh_dtype) */
    const void *biases;
    int32_t sb, bits, group;
    int64_t rows, in, wpr, gpr; /* wpr = in * bits / 32, gpr = in / group */
} cpu_qmat;

typedef struct cpu_qkernels {
    const char *name; /* the cpu_kernels path it goes with */
    /* y[r * ldy + o] = sum_k x[r * in + k] * W[o, k] for r in [0, n), o in [o0, o1).
     * xsum holds the group sums of x ([n, gpr], cpu_q_group_sums). Each group of W is
     * unpacked once per tile of x rows; with n == 1 every weight byte is read once. */
    void (*matmul)(const float *x, const float *xsum, int64_t n, const cpu_qmat *w, int64_t o0,
                   int64_t o1, float *y, int64_t ldy);
    /* y[0, in) = row `row` of W dequantized (embeddings). */
    void (*dequant_row)(const cpu_qmat *w, int64_t row, float *y);
} cpu_qkernels;

/* The table that goes with kernel path `name` ("portable", "avx2", "avx512", "neon"), so
 * the quantized kernels follow the LMHOST_SIMD choice cpu_kernels_select made; the
 * portable table when this build has no such path. */
const cpu_qkernels *cpu_qkernels_for(const char *name);

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
 * value cost a third of a 4-bit matvec. `sb` is w->sb; the branch is the same for a
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
/* xsum[r * (in / group) + g] = sum of x[r, g * group .. (g + 1) * group). */
void cpu_q_group_sums(const float *x, int64_t n, int64_t in, int32_t group, float *xsum);

#endif
