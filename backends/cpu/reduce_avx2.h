/* Horizontal sums for the AVX2 kernels, shared by the f32 and quantized tables so that
 * both reduce a vector by the same tree: part of what makes a quantized product give the
 * bits of the f32 product over the dequantized matrix. */
#ifndef LMHOST_CPU_REDUCE_AVX2_H
#define LMHOST_CPU_REDUCE_AVX2_H

#include <immintrin.h>

/* {sum a, sum b, sum c, sum d}; each sum depends on its own vector only. */
static inline __attribute__((always_inline)) __m128 cpu_hsum4_256(__m256 a, __m256 b, __m256 c,
                                                                  __m256 d) {
    __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
    __m256 s = _mm256_hadd_ps(ab, cd);
    return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

/* One sum by the same tree (adding zeros is exact). */
static inline __attribute__((always_inline)) float cpu_hsum_256(__m256 v) {
    const __m256 z = _mm256_setzero_ps();
    return _mm_cvtss_f32(cpu_hsum4_256(v, z, z, z));
}

#endif
