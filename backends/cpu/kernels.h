/* Inner loops of the CPU backend, one table per instruction set. The backend picks a
 * table at run time (cpu_kernels_select) and splits work over its thread pool; each
 * function here is single-threaded and works on the range it is given. */
#ifndef LMHOST_CPU_KERNELS_H
#define LMHOST_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

typedef struct cpu_kernels {
    const char *name; /* "portable", "avx2", "avx512", "neon" */
    /* matmul sums k in blocks of kblock (a multiple of 128): each output is the blocks'
     * partial sums added in order, each partial formed the same way for every n, so a row's
     * result does not depend on the other rows in the batch (batch invariance).
     * cpu_q_matmul follows the same blocks. */
    int64_t kblock;

    /* y[r * ldy + o] = sum_k x[r * k_dim + k] * w[o * k_dim + k]
     * for r in [0, n) and o in [o0, o1). w is [out, k_dim] row-major in the named dtype
     * (f16 and bf16 as raw uint16 bit patterns). k_dim is any size >= 1 (not only a
     * multiple of the vector width). When n > 1 the weight rows are read once per tile
     * of x rows, not once per x row. */
    void (*matmul_f32)(const float *x, int64_t n, int64_t k_dim, const float *w, int64_t o0,
                       int64_t o1, float *y, int64_t ldy);
    void (*matmul_f16)(const float *x, int64_t n, int64_t k_dim, const uint16_t *w, int64_t o0,
                       int64_t o1, float *y, int64_t ldy);
    void (*matmul_bf16)(const float *x, int64_t n, int64_t k_dim, const uint16_t *w, int64_t o0,
                        int64_t o1, float *y, int64_t ldy);

    /* sum_i a[i] * b[i], b in f32 / f16 / bf16. */
    float (*dot_f32)(const float *a, const float *b, int64_t n);
    float (*dot_f16)(const float *a, const uint16_t *b, int64_t n);
    float (*dot_bf16)(const float *a, const uint16_t *b, int64_t n);
    /* y[i] += a * x[i], x in f32 / f16 / bf16. */
    void (*axpy_f32)(float *y, float a, const float *x, int64_t n);
    void (*axpy_f16)(float *y, float a, const uint16_t *x, int64_t n);
    void (*axpy_bf16)(float *y, float a, const uint16_t *x, int64_t n);
    /* Attention over a block of n keys for the G query heads that share one K/V head (the
     * CPU backend's LMH_OP_ATTENTION, cpu_backend.c), so that each K and V row is read once
     * for the whole group. Every value below is made the same way wherever its key sits in
     * the block and however many keys or heads the call has, so a block cut in two (a ring
     * that wraps) or a longer block gives the same bits for the same keys.
     *
     * attn_scores: s[g * lds + i] = scale * sum_k q[g * d + k] * K[i * ldk + k] for g < G,
     * i < n (each a dot product of its own, summed as the path's dot products are). */
    void (*attn_scores_f32)(const float *q, int G, int64_t d, const float *K, int64_t ldk,
                            int64_t n, float scale, float *s, int64_t lds);
    void (*attn_scores_f16)(const float *q, int G, int64_t d, const uint16_t *K, int64_t ldk,
                            int64_t n, float scale, float *s, int64_t lds);
    void (*attn_scores_bf16)(const float *q, int G, int64_t d, const uint16_t *K, int64_t ldk,
                             int64_t n, float scale, float *s, int64_t lds);
    /* s[0..n) (n >= 1) made cap * tanh(s / cap) when cap > 0, then *mx = max s and
     * s[i] = exp(s[i] - *mx); returns the sum of the s[i] (in an order that depends on n
     * only). exp is the path's own (a polynomial on the SIMD paths, within 2 ulp). */
    float (*attn_softmax)(float *s, int64_t n, float cap, float *mx);
    /* o[g * dv + j] += sum_{i < n} p[g * lds + i] * V[i * ldv + j] for g < G, j < dv, the keys
     * added to o one at a time in order (o is read first and written last, so two calls
     * over the halves of a block give the bits of one call over the block). */
    void (*attn_values_f32)(const float *p, int G, int64_t lds, const float *V, int64_t ldv,
                            int64_t n, int64_t dv, float *o);
    void (*attn_values_f16)(const float *p, int G, int64_t lds, const uint16_t *V, int64_t ldv,
                            int64_t n, int64_t dv, float *o);
    void (*attn_values_bf16)(const float *p, int G, int64_t lds, const uint16_t *V, int64_t ldv,
                             int64_t n, int64_t dv, float *o);

    /* y[i] = a * y[i] + b * x[i] (a decayed state plus an update: the recurrent ops). */
    void (*axpby_f32)(float *y, float a, float b, const float *x, int64_t n);

    /* Conversions of n elements. f32 -> f16 rounds to nearest even (like numpy/torch);
     * f32 -> bf16 rounds to nearest even and keeps NaN a NaN. */
    void (*f16_to_f32)(const uint16_t *x, float *y, int64_t n);
    void (*bf16_to_f32)(const uint16_t *x, float *y, int64_t n);
    void (*f32_to_f16)(const float *x, uint16_t *y, int64_t n);
    void (*f32_to_bf16)(const float *x, uint16_t *y, int64_t n);

    /* The multiply-add probe: iters rounds of independent chains acc = acc * m + c with
     * this path's instructions, fma_flops FLOP a round (2 a multiply-add); returns the
     * chains' sum so that none of the work can be left out. */
    float (*fma_loop)(int64_t iters, float m, float c);
    int fma_flops;
} cpu_kernels;

/* The table for `force` ("portable", "avx2", "avx512", "neon") when given and runnable
 * on this CPU, else the best one this CPU runs. NULL only when `force` names a path this
 * CPU or build cannot run. */
const cpu_kernels *cpu_kernels_select(const char *force);
/* Every table this build has that this CPU can run, NULL-terminated (for tests). */
const cpu_kernels *const *cpu_kernels_available(void);

/* Scalar conversions shared by all paths (exact, round to nearest even). */
float cpu_f16_to_f32(uint16_t h);
uint16_t cpu_f32_to_f16(float f);
float cpu_bf16_to_f32(uint16_t h);
uint16_t cpu_f32_to_bf16(float f);

#endif
