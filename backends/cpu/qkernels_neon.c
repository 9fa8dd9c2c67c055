/* Quantized kernels for NEON (AArch64 Advanced SIMD). 4- and 8-bit codes are unpacked in
 * registers: for 4 bits, 16 bytes hold 32 codes whose low and high nibbles are split and
 * zipped back into code order, then widened to 32-bit lanes; 8-bit codes are widened
 * directly. Other widths are unpacked a group at a time by the portable bit stream into a
 * small buffer. dequant writes rows as f32 (cpu_q_matmul's batches, embeddings); matvec
 * decodes with the arithmetic of the f32 kernels over dequant's output (same bits). */
#include "qkernels.h"
#include "reduce_neon.h"

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

/* The G codes of the group at p as floats: 4- and 8-bit ones 16 bytes at a time in
 * registers, other widths through the portable bit stream. */
static inline void group_codes(const uint8_t *p, int32_t G, int bits, float *out) {
    if (bits != 4 && bits != 8) {
        unpack_group((const uint32_t *)p, G, bits, out);
        return;
    }
    const int step = bits == 4 ? 32 : 16; /* codes per 16 bytes */
    for (int32_t c = 0; c < G; c += step, p += 16) {
        uint8x16_t v = vld1q_u8(p);
        float32x4_t q[8];
        if (bits == 4) {
            uint8x16_t lo = vandq_u8(v, vdupq_n_u8(0x0f)), hi = vshrq_n_u8(v, 4);
            widen16(vzip1q_u8(lo, hi), q);
            widen16(vzip2q_u8(lo, hi), q + 4);
        } else {
            widen16(v, q);
        }
        for (int i = 0; i < step / 4; i++) vst1q_f32(out + c + 4 * i, q[i]);
    }
}

static void dequant_neon(const cpu_qmat *w, int64_t row, int64_t k0, int64_t k1, float *y) {
    const int32_t G = w->group, bits = w->bits;
    const int64_t gb = (int64_t)G * bits / 8; /* bytes per group */
    const uint8_t *base = (const uint8_t *)(w->q + row * w->wpr);
    /* cpu_q_matmul dequantizes CPU_Q_ROWS rows, then multiplies them out of cache: fetch
     * the next block's rows meanwhile so that memory never idles (a prefetch past the
     * tensor's end is harmless: it never faults). */
    const int64_t ahead = (int64_t)CPU_Q_ROWS * w->wpr * 4;
    for (int64_t g = k0 / G; g < k1 / G; g++) {
        const uint8_t *p = base + g * gb;
        if (((uintptr_t)p & 63) < (uintptr_t)gb)
            __builtin_prefetch(p + ahead); /* once per cache line */
        const float32x4_t s = vdupq_n_f32(cpu_q_sb_at(w->sb, w->scales, row * w->gpr + g));
        const float32x4_t b = vdupq_n_f32(cpu_q_sb_at(w->sb, w->biases, row * w->gpr + g));
        float *yg = y + g * G - k0;
        group_codes(p, G, bits, yg);
        for (int32_t c = 0; c < G; c += 4) vst1q_f32(yg + c, vfmaq_f32(b, vld1q_f32(yg + c), s));
    }
}

/* R (1..4) weight rows from o against x: R accumulator chains and R weight streams. The
 * arithmetic is dequant_neon's (w = b + q * s, fused) followed by kernels_neon.c's decode
 * (acc += x * w lane-wise along k, a cpu_hsum4_neon per kblock, blocks added in order), so
 * the result is the bits of the f32 product over the dequantized rows. */
static inline __attribute__((always_inline)) void
mv_rows(const cpu_qmat *w, const float *x, int64_t o, float *y, int64_t kblock, const int R) {
    const int32_t G = w->group, bits = w->bits;
    const int64_t gb = (int64_t)G * bits / 8, in = w->in, gpr = w->gpr;
    float qf[4][128];
    for (int64_t kb = 0; kb < in; kb += kblock) {
        const int64_t ke = in - kb < kblock ? in : kb + kblock;
        float32x4_t acc[4];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r] = vdupq_n_f32(0);
        for (int64_t g = kb / G; g < ke / G; g++) {
            const float *xg = x + g * G;
            float32x4_t s[4], b[4];
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                s[r] = vdupq_n_f32(cpu_q_sb_at(w->sb, w->scales, (o + r) * gpr + g));
                b[r] = vdupq_n_f32(cpu_q_sb_at(w->sb, w->biases, (o + r) * gpr + g));
                const uint8_t *p = (const uint8_t *)(w->q + (o + r) * w->wpr) + g * gb;
                group_codes(p, G, bits, qf[r]);
            }
            for (int32_t c = 0; c < G; c += 4) {
                const float32x4_t xv = vld1q_f32(xg + c);
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r] =
                    vfmaq_f32(acc[r], xv, vfmaq_f32(b[r], vld1q_f32(qf[r] + c), s[r]));
            }
        }
        if (R == 4) {
            float32x4_t s4 = cpu_hsum4_neon(acc[0], acc[1], acc[2], acc[3]);
            if (kb > 0) s4 = vaddq_f32(s4, vld1q_f32(y + o));
            vst1q_f32(y + o, s4);
        } else {
            for (int r = 0; r < R; r++) {
                float t = cpu_hsum_neon(acc[r]);
                y[o + r] = kb > 0 ? y[o + r] + t : t;
            }
        }
    }
}

static void matvec_neon(const cpu_qmat *w, const float *x, int64_t o0, int64_t o1, float *y,
                        int64_t kblock) {
    int64_t o = o0;
    for (; o + 4 <= o1; o += 4) mv_rows(w, x, o, y, kblock, 4);
    for (; o < o1; o++) mv_rows(w, x, o, y, kblock, 1);
}

/* Microscaled 4-bit (qkernels.h CPU_Q_MX): a block's nibbles zipped back into order, a
 * table lookup through cpu_mx_lut2, widened and multiplied by 2^(s - 128) (exact). Decode
 * goes through cpu_q_matmul's row path (this dequant, then the f32 kernel): same bits. */
static void dequant_mx_neon(const cpu_qmat *w, int64_t row, int64_t k0, int64_t k1, float *y) {
    const int8x16_t lut = vld1q_s8(cpu_mx_lut2);
    const uint8_t *rb = (const uint8_t *)(w->q + row * w->wpr);
    const uint8_t *sc = (const uint8_t *)w->scales + row * w->gpr;
    for (int64_t g = k0 / 32; g < k1 / 32; g++) {
        const uint8x16_t v = vld1q_u8(rb + g * 16);
        const uint8x16x2_t z = vzipq_u8(vandq_u8(v, vdupq_n_u8(0x0f)), vshrq_n_u8(v, 4));
        const float32x4_t hs = vdupq_n_f32(cpu_mx_half_scale(sc[g]));
        float *yg = y + g * 32 - k0;
        for (int h = 0; h < 2; h++) {
            const int8x16_t c = vqtbl1q_s8(lut, z.val[h]);
            const int16x8_t lo = vmovl_s8(vget_low_s8(c)), hi = vmovl_s8(vget_high_s8(c));
            vst1q_f32(yg + 16 * h, vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), hs));
            vst1q_f32(yg + 16 * h + 4, vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(lo))), hs));
            vst1q_f32(yg + 16 * h + 8, vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), hs));
            vst1q_f32(yg + 16 * h + 12, vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(hi))), hs));
        }
    }
}

const cpu_qkernels cpu_qkernels_neon = {
    .name = "neon",
    .dequant = dequant_neon,
    .matvec = matvec_neon,
    .dequant_mx = dequant_mx_neon,
    .matvec_mx = NULL,
};

/* ---- fast mode (qkernels.h, cpu_q8kernel): codes times int8 activations --------------
 * Codes come as bytes in order: 8 bits are the bytes, 4 bits split nibbles zipped back,
 * other widths the portable bit stream into a group buffer. Products are signed: codes of
 * b <= 6 bits (<= 63) are valid int8; 8-bit codes c are taken as c - 128 (flip the top bit)
 * and 128 * sum(x) (the exact integer sum kept by cpu_q8_quantize) added back, so the
 * integer sum is exact either way. With the dot-product extension (sdot, ARMv8.2-A
 * +dotprod) 16 products a step; without it vmull_s8 (|c x| <= 128 * 127 = 16256 fits
 * int16) and vpadalq_s16 (pairs into int32). Float order of a row, the portable one:
 * per group in order acc += (s d) isum, accb += b xs; y = acc + accb. */
static inline void codes_group(const uint8_t *p, int32_t G, int bits, uint8_t *c) {
    if (bits == 8) {
        for (int32_t k = 0; k < G; k += 16) vst1q_u8(c + k, vld1q_u8(p + k));
    } else if (bits == 4) {
        const uint8x16_t m = vdupq_n_u8(0x0f);
        for (int32_t k = 0; k < G; k += 32) {
            const uint8x16_t v = vld1q_u8(p + k / 2);
            const uint8x16x2_t z = vzipq_u8(vandq_u8(v, m), vshrq_n_u8(v, 4));
            vst1q_u8(c + k, z.val[0]);
            vst1q_u8(c + k + 16, z.val[1]);
        }
    } else {
        uint64_t buf = 0;
        int have = 0;
        const uint32_t mask = (1u << bits) - 1;
        const uint32_t *wp = (const uint32_t *)(const void *)p;
        for (int32_t k = 0; k < G; k++) {
            if (have < bits) {
                buf |= (uint64_t)*wp++ << have;
                have += 32;
            }
            c[k] = (uint8_t)((uint32_t)buf & mask);
            buf >>= bits;
            have -= bits;
        }
    }
}

static inline __attribute__((always_inline)) void q8_rows_n(const cpu_qmat *w, const int8_t *xq,
                                                            const float *xd, const float *xs,
                                                            const int32_t *xi, int64_t o0,
                                                            int64_t o1, float *y, const int DOT) {
    const int32_t G = w->group, bits = w->bits;
    const int64_t gb = (int64_t)G * bits / 8;
    (void)DOT; /* no sdot in this build: the widening multiplies only */
    const uint8x16_t flip = vdupq_n_u8(bits == 8 ? 0x80 : 0);
    uint8_t c[128];
    for (int64_t o = o0; o < o1; o++) {
        const uint8_t *row = (const uint8_t *)(w->q + o * w->wpr);
        float acc = 0, accb = 0;
        for (int64_t g = 0; g < w->gpr; g++) {
            const int8_t *x = xq + g * G;
            codes_group(row + g * gb, G, bits, c);
            int32x4_t is = vdupq_n_s32(0);
            for (int32_t k = 0; k < G; k += 16) {
                const int8x16_t cv = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(c + k), flip));
                const int8x16_t xv = vld1q_s8(x + k);
#if defined(__ARM_FEATURE_DOTPROD)
                if (DOT) {
                    is = vdotq_s32(is, cv, xv);
                    continue;
                }
#endif
                is = vpadalq_s16(is, vmull_s8(vget_low_s8(cv), vget_low_s8(xv)));
                is = vpadalq_s16(is, vmull_high_s8(cv, xv));
            }
            int32_t isum = vaddvq_s32(is);
            if (bits == 8) isum += 128 * xi[g];
            const float s = cpu_q_sb_at(w->sb, w->scales, o * w->gpr + g);
            const float b = cpu_q_sb_at(w->sb, w->biases, o * w->gpr + g);
            const float sd = s * xd[g], bx = b * xs[g];
            acc += sd * (float)isum;
            accb += bx;
        }
        y[o] = acc + accb;
    }
}

static void q8_rows_neon(const cpu_qmat *w, const int8_t *xq, const float *xd, const float *xs,
                         const int32_t *xi, int64_t o0, int64_t o1, float *y) {
    q8_rows_n(w, xq, xd, xs, xi, o0, o1, y, 0);
}
const cpu_q8kernel cpu_q8kernel_neon = {.name = "neon-i8", .rows = q8_rows_neon};

#if defined(__ARM_FEATURE_DOTPROD)
static void q8_rows_neon_dot(const cpu_qmat *w, const int8_t *xq, const float *xd, const float *xs,
                             const int32_t *xi, int64_t o0, int64_t o1, float *y) {
    q8_rows_n(w, xq, xd, xs, xi, o0, o1, y, 1);
}
const cpu_q8kernel cpu_q8kernel_neon_dot = {.name = "neon-dot-i8", .rows = q8_rows_neon_dot};
#endif
