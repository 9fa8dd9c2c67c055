/* Horizontal sums for the NEON kernels, shared by the f32 and quantized tables so that
 * both reduce a vector by the same tree: part of what makes a quantized product give the
 * bits of the f32 product over the dequantized matrix. */
#ifndef LMHOST_CPU_REDUCE_NEON_H
#define LMHOST_CPU_REDUCE_NEON_H

#include <arm_neon.h>

/* {sum a, sum b, sum c, sum d}; each sum depends on its own vector only. */
static inline __attribute__((always_inline)) float32x4_t
cpu_hsum4_neon(float32x4_t a, float32x4_t b, float32x4_t c, float32x4_t d) {
    return vpaddq_f32(vpaddq_f32(a, b), vpaddq_f32(c, d));
}

/* One sum by the same tree (adding zeros is exact). */
static inline __attribute__((always_inline)) float cpu_hsum_neon(float32x4_t v) {
    const float32x4_t z = vdupq_n_f32(0);
    return vgetq_lane_f32(cpu_hsum4_neon(v, z, z, z), 0);
}

#endif
