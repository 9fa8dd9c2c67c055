/* Horizontal sums for the AVX-512 kernels, shared by the f32 and quantized tables so that
 * both reduce a vector by the same tree: part of what makes a quantized product give the
 * bits of the f32 product over the dequantized matrix. */
#ifndef LMHOST_CPU_REDUCE_AVX512_H
#define LMHOST_CPU_REDUCE_AVX512_H

#include <immintrin.h>

/* 16 lanes to 8 (AVX512F only: no DQ needed). */
static inline __attribute__((always_inline)) __m256 cpu_fold256(__m512 v) {
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    return _mm256_add_ps(_mm512_castps512_ps256(v), hi);
}

/* {sum a, sum b, sum c, sum d}; each sum depends on its own vector only. */
static inline __attribute__((always_inline)) __m128 cpu_hsum4_512(__m512 a, __m512 b, __m512 c,
                                                                  __m512 d) {
    __m256 ab = _mm256_hadd_ps(cpu_fold256(a), cpu_fold256(b));
    __m256 cd = _mm256_hadd_ps(cpu_fold256(c), cpu_fold256(d));
    __m256 s = _mm256_hadd_ps(ab, cd);
    return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

/* One sum by the same tree (adding zeros is exact). */
static inline __attribute__((always_inline)) float cpu_hsum_512(__m512 v) {
    const __m512 z = _mm512_setzero_ps();
    return _mm_cvtss_f32(cpu_hsum4_512(v, z, z, z));
}

#endif
