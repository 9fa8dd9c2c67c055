/* Quantized kernels for NEON (AArch64 Advanced SIMD): the portable unpacking of a group
 * into floats, then the products with vector FMAs over a tile of x rows. */
#include "qkernels.h"

#include <arm_neon.h>

static void unpack_group(const uint32_t *wp, int32_t group, int bits, float *out) {
    uint64_t buf = 0;
    int have = 0;
    const uint32_t mask = (1u << bits) - 1;
    for (int32_t k = 0; k < group; k++) {
        if (have < bits) {
            buf |= (uint64_t)*wp++ << have;
            have += 32;
        }
        out[k] = (float)((uint32_t)buf & mask);
        buf >>= bits;
        have -= bits;
    }
}

static void matmul_neon(const float *x, const float *xsum, int64_t n, const cpu_qmat *w,
                        int64_t o0, int64_t o1, float *y, int64_t ldy) {
    const int64_t in = w->in, gpr = w->gpr, gw = (int64_t)w->group * w->bits / 32;
    float q[128];
    for (int64_t r0 = 0; r0 < n; r0 += 4) {
        int64_t nr = n - r0 < 4 ? n - r0 : 4;
        for (int64_t o = o0; o < o1; o++) {
            float32x4_t acc[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
            float bsum[4] = {0, 0, 0, 0};
            for (int64_t g = 0; g < gpr; g++) {
                unpack_group(w->q + o * w->wpr + g * gw, w->group, w->bits, q);
                float s = cpu_q_sb(w, w->scales, o * gpr + g);
                float b = cpu_q_sb(w, w->biases, o * gpr + g);
                for (int64_t r = 0; r < nr; r++) {
                    const float *xp = x + (r0 + r) * in + g * w->group;
                    float32x4_t d = vdupq_n_f32(0);
                    for (int32_t k = 0; k < w->group; k += 4)
                        d = vfmaq_f32(d, vld1q_f32(q + k), vld1q_f32(xp + k));
                    acc[r] = vfmaq_n_f32(acc[r], d, s);
                    bsum[r] += b * xsum[(r0 + r) * gpr + g];
                }
            }
            for (int64_t r = 0; r < nr; r++) y[(r0 + r) * ldy + o] = vaddvq_f32(acc[r]) + bsum[r];
        }
    }
}

static void dequant_row_neon(const cpu_qmat *w, int64_t row, float *y) {
    const int64_t gw = (int64_t)w->group * w->bits / 32;
    for (int64_t g = 0; g < w->gpr; g++) {
        float *yp = y + g * w->group;
        unpack_group(w->q + row * w->wpr + g * gw, w->group, w->bits, yp);
        float32x4_t s = vdupq_n_f32(cpu_q_sb(w, w->scales, row * w->gpr + g));
        float32x4_t b = vdupq_n_f32(cpu_q_sb(w, w->biases, row * w->gpr + g));
        for (int32_t k = 0; k < w->group; k += 4) vst1q_f32(yp + k, vfmaq_f32(b, vld1q_f32(yp + k), s));
    }
}

const cpu_qkernels cpu_qkernels_neon = {
    .name = "neon",
    .matmul = matmul_neon,
    .dequant_row = dequant_row_neon,
};
