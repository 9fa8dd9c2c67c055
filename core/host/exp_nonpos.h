/* A vectorised exp for the sampler's softmax (and its test): GCC/Clang generic vectors, so
 * SSE2 or NEON without intrinsics. */
#ifndef LMHOST_EXP_NONPOS_H
#define LMHOST_EXP_NONPOS_H

#include <stdint.h>

/* exp(x) for x <= 0 (or NaN, from a +inf logit less the +inf maximum: taken as 0, so it
 * weighs 1 as the largest), four at a time in the compiler's generic vectors (SSE2, NEON):
 * exp(x) = 2^k e^r with k = round(x / ln 2), r = x - k ln 2 (ln 2 in two parts, so r is
 * exact) and e^r by its Taylor series to degree 7 (|r| <= 0.35: relative error about 1e-7,
 * as expf's). Below -87, where expf is denormal or 0, it gives 0. (The sampler's softmax:
 * glibc's expf, a call an element, took 0.9 ms over a 151936-entry vocabulary, between every
 * two decoded tokens.) */
typedef float f32x4 __attribute__((vector_size(16)));
typedef int32_t i32x4 __attribute__((vector_size(16)));

static inline __attribute__((always_inline)) f32x4 exp_nonpos4(f32x4 x) {
    i32x4 nan = x != x, low = x < -87.0f;
    x = (f32x4)((i32x4)x & ~nan);
    const f32x4 floor = {-87.0f, -87.0f, -87.0f, -87.0f};
    x = (f32x4)(((i32x4)x & ~low) | ((i32x4)floor & low));
    i32x4 k = __builtin_convertvector(x * 1.44269504f - 0.5f, i32x4); /* x <= 0: nearest */
    f32x4 kf = __builtin_convertvector(k, f32x4);
    f32x4 r = (x - kf * 0.693145751953125f) - kf * 1.428606765330187e-6f;
    f32x4 p = r * (1.0f / 5040) + 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    return (f32x4)((i32x4)(p * (f32x4)((k + 127) << 23)) & ~low);
}

#endif
