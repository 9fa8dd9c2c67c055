/* Quantized kernels for NEON (AArch64 Advanced SIMD). 4- and 8-bit codes are unpacked in
 * registers: for 4 bits, 16 bytes hold 32 codes whose low and high nibbles are split and
 * zipped back into code order, then widened to 32-bit lanes; 8-bit codes are widened
 * directly. Other widths are unpacked a group at a time by the portable bit stream into a
 * small buffer. The products are vector FMAs over a tile of x rows. */
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

/* Sixteen byte-sized codes as four vectors of floats. */
static inline void widen16(uint8x16_t c, float32x4_t q[4]) {
    uint16x8_t lo = vmovl_u8(vget_low_u8(c)), hi = vmovl_u8(vget_high_u8(c));
    q[0] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(lo)));
    q[1] = vcvtq_f32_u32(vmovl_u16(vget_high_u16(lo)));
    q[2] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(hi)));
    q[3] = vcvtq_f32_u32(vmovl_u16(vget_high_u16(hi)));
}

enum { GENERIC = 0, Q4 = 4, Q8 = 8 };

static inline __attribute__((always_inline)) void tile(const float *x, const float *xsum,
                                                       int64_t r0, const cpu_qmat *w, int64_t o,
                                                       float *y, int64_t ldy, const int NR,
                                                       const int MODE) {
    const int64_t in = w->in, gpr = w->gpr;
    const int32_t G = w->group, bits = w->bits;
    const int64_t gb = (int64_t)G * bits / 8;
    float32x4_t acc[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
    float bsum[4] = {0, 0, 0, 0};
    float qf[128];
    const uint8_t *row = (const uint8_t *)(w->q + o * w->wpr);
    for (int64_t g = 0; g < gpr; g++) {
        const uint8_t *p = row + g * gb;
        const float *xg = x + r0 * in + g * G;
        float32x4_t d[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
        if (MODE == Q4 || MODE == Q8) {
            /* 32 codes (4 bits, 16 bytes) or 16 codes (8 bits) per step */
            const int step = MODE == Q4 ? 32 : 16;
            for (int32_t c = 0; c < G; c += step, p += 16) {
                uint8x16_t v = vld1q_u8(p);
                float32x4_t q[8];
                if (MODE == Q4) {
                    uint8x16_t lo = vandq_u8(v, vdupq_n_u8(0x0f)), hi = vshrq_n_u8(v, 4);
                    widen16(vzip1q_u8(lo, hi), q);
                    widen16(vzip2q_u8(lo, hi), q + 4);
                } else {
                    widen16(v, q);
                }
                for (int r = 0; r < NR; r++)
                    for (int k = 0; k < step / 4; k++)
                        d[r] = vfmaq_f32(d[r], q[k], vld1q_f32(xg + r * in + c + 4 * k));
            }
        } else {
            unpack_group((const uint32_t *)p, G, bits, qf);
            for (int r = 0; r < NR; r++)
                for (int32_t k = 0; k < G; k += 4)
                    d[r] = vfmaq_f32(d[r], vld1q_f32(qf + k), vld1q_f32(xg + r * in + k));
        }
        for (int r = 0; r < NR; r++) {
            acc[r] = vfmaq_n_f32(acc[r], d[r], cpu_q_sb_at(w->sb, w->scales, o * gpr + g));
            bsum[r] += cpu_q_sb_at(w->sb, w->biases, o * gpr + g) * xsum[(r0 + r) * gpr + g];
        }
    }
    for (int r = 0; r < NR; r++) y[(r0 + r) * ldy + o] = vaddvq_f32(acc[r]) + bsum[r];
}

static inline __attribute__((always_inline)) void matmul_mode(const float *x, const float *xsum,
                                                              int64_t n, const cpu_qmat *w,
                                                              int64_t o0, int64_t o1, float *y,
                                                              int64_t ldy, const int MODE) {
    /* Blocks of 16 weight rows stay in L1/L2 while every tile of 4 x rows passes. */
    for (int64_t ob = o0; ob < o1; ob += 16) {
        int64_t oe = ob + 16 < o1 ? ob + 16 : o1;
        for (int64_t r0 = 0; r0 < n; r0 += 4) {
            int64_t nr = n - r0;
            for (int64_t o = ob; o < oe; o++) {
                if (nr >= 4)
                    tile(x, xsum, r0, w, o, y, ldy, 4, MODE);
                else if (nr == 3)
                    tile(x, xsum, r0, w, o, y, ldy, 3, MODE);
                else if (nr == 2)
                    tile(x, xsum, r0, w, o, y, ldy, 2, MODE);
                else
                    tile(x, xsum, r0, w, o, y, ldy, 1, MODE);
            }
        }
    }
}

static void matmul_neon(const float *x, const float *xsum, int64_t n, const cpu_qmat *w, int64_t o0,
                        int64_t o1, float *y, int64_t ldy) {
    if (w->bits == 4)
        matmul_mode(x, xsum, n, w, o0, o1, y, ldy, Q4);
    else if (w->bits == 8)
        matmul_mode(x, xsum, n, w, o0, o1, y, ldy, Q8);
    else
        matmul_mode(x, xsum, n, w, o0, o1, y, ldy, GENERIC);
}

static void dequant_row_neon(const cpu_qmat *w, int64_t row, float *y) {
    const int64_t gw = (int64_t)w->group * w->bits / 32;
    for (int64_t g = 0; g < w->gpr; g++) {
        float *yp = y + g * w->group;
        unpack_group(w->q + row * w->wpr + g * gw, w->group, w->bits, yp);
        float32x4_t s = vdupq_n_f32(cpu_q_sb_at(w->sb, w->scales, row * w->gpr + g)),
                    b = vdupq_n_f32(cpu_q_sb_at(w->sb, w->biases, row * w->gpr + g));
        for (int32_t k = 0; k < w->group; k += 4)
            vst1q_f32(yp + k, vfmaq_f32(b, vld1q_f32(yp + k), s));
    }
}

const cpu_qkernels cpu_qkernels_neon = {
    .name = "neon",
    .matmul = matmul_neon,
    .dequant_row = dequant_row_neon,
};
