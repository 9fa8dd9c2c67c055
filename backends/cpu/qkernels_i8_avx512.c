/* Fast-mode quantized kernel (qkernels.h, cpu_q8kernel) for AVX-512 with VNNI and VBMI:
 * codes times int8 activations with vpdpbusd, 64 per instruction. Built with
 * -mavx512vnni -mavx512vbmi; cpu_q8kernel_for picks it only after CPUID says the CPU has
 * both (qkernels_portable.c).
 *
 * Unpacking any width b <= 8: 64 codes of b bits are 8 b bytes, and 8 codes are exactly b
 * bytes, so one masked load (never past the codes: masked-off bytes do not fault), a
 * vpermb that gives each qword the b bytes of its 8 codes, a vpmultishiftqb that takes
 * byte k of a qword from bit k b of it, and a mask give the 64 codes as bytes in order.
 * 8-bit codes are the bytes themselves.
 *
 * Float order of a row (fixed, whatever n, threads or output split): one accumulator of
 * 16 lanes; for each weight group in order the exact int32 lane sums (vpdpbusd from zero,
 * over the group's 64-code chunks; a group of 32 fills 8 lanes, two such groups a vector)
 * are converted and added as acc = fma(isum, s d, acc), s d = s[g] * d[g] rounded once;
 * a second 16-lane accumulator adds b[g] * xs[g] for 16 groups at a time; y is the fixed
 * reduction of acc + accb. */
#include "qkernels.h"

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct unpack64 {
    __m512i perm, shift, mask;
    __mmask64 full, half; /* load masks: 64 codes (8 b bytes), 32 codes */
} unpack64;

static unpack64 make_unpack64(int bits) {
    uint8_t perm[64], sh[64];
    for (int j = 0; j < 8; j++)
        for (int k = 0; k < 8; k++) {
            perm[j * 8 + k] = (uint8_t)(k < bits ? j * bits + k : 0);
            sh[j * 8 + k] = (uint8_t)(k * bits);
        }
    unpack64 u;
    u.perm = _mm512_loadu_si512(perm);
    u.shift = _mm512_loadu_si512(sh);
    u.mask = _mm512_set1_epi8((char)((1u << bits) - 1));
    u.full = bits == 8 ? ~(__mmask64)0 : ((__mmask64)1 << (8 * bits)) - 1;
    u.half = ((__mmask64)1 << (4 * bits)) - 1;
    return u;
}

/* 64 codes (or 32 with the half mask; the rest zero) from p, as bytes in order. */
static inline __m512i codes64(const unpack64 *u, const uint8_t *p, __mmask64 lm, const int B8) {
    __m512i v = _mm512_maskz_loadu_epi8(lm, p);
    if (B8) return v;
    v = _mm512_permutexvar_epi8(u->perm, v);
    v = _mm512_multishift_epi64_epi8(u->shift, v);
    return _mm512_and_si512(v, u->mask);
}

/* 16 scales or biases from i (masked: lanes past m are zero). */
static inline __m512 sb16(int32_t sb, const void *p, int64_t i, __mmask16 m) {
    if (sb == 0) return _mm512_maskz_loadu_ps(m, (const float *)p + i);
    const __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i);
    if (sb == 1) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

#define PF_AHEAD 1024

/* R (1..4) weight rows from o against one activation row; G the group, B8 8-bit codes.
 * With ub (prefill), the rows' codes come unpacked, a byte each, from ub + (o - ub0) *
 * stride: the same integers, so the same float steps give the same bits. */
static inline __attribute__((always_inline)) void
rows_k(const cpu_qmat *w, const unpack64 *u, const int8_t *xq, const float *xd, const float *xs,
       int64_t o, float *y, const int R, const int G, const int B8, const uint8_t *ub, int64_t ub0,
       int64_t stride) {
    const int64_t gpr = w->gpr, bits = w->bits;
    const uint8_t *urow[4] = {0};
    if (ub)
        for (int r = 0; r < R; r++) urow[r] = ub + (o + r - ub0) * stride;
    const uint8_t *row[4];
    __m512 acc[4], accb[4];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
        row[r] = (const uint8_t *)(w->q + (o + r) * w->wpr);
        acc[r] = _mm512_setzero_ps();
        accb[r] = _mm512_setzero_ps();
    }
    for (int64_t g0 = 0; g0 < gpr; g0 += 16) {
        const int ng = gpr - g0 < 16 ? (int)(gpr - g0) : 16;
        const __mmask16 m = (__mmask16)((1u << ng) - 1);
        const __m512 dv = _mm512_maskz_loadu_ps(m, xd + g0), xv = _mm512_maskz_loadu_ps(m, xs + g0);
        _Alignas(64) float sd[4][16];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            const int64_t at = (o + r) * gpr + g0;
            const __m512 s = sb16(w->sb, w->scales, at, m), b = sb16(w->sb, w->biases, at, m);
            _mm512_store_ps(sd[r], _mm512_mul_ps(s, dv));
            accb[r] = _mm512_fmadd_ps(b, xv, accb[r]);
            const int64_t ahead = (at + 64) * (w->sb == 0 ? 4 : 2);
            _mm_prefetch((const char *)w->scales + ahead, _MM_HINT_T0);
            _mm_prefetch((const char *)w->biases + ahead, _MM_HINT_T0);
        }
        if (G == 32) {
            for (int j = 0; j < ng; j += 2) {
                const int64_t k = (g0 + j) * 32;
                const int half = j + 1 == ng; /* the row's last, odd group */
                const __m512i x =
                    _mm512_maskz_loadu_epi8(half ? 0xffffffffu : ~(__mmask64)0, xq + k);
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                    const uint8_t *p = row[r] + k * bits / 8;
                    __m512i c;
                    if (ub) {
                        c = _mm512_maskz_loadu_epi8(half ? 0xffffffffu : ~(__mmask64)0,
                                                    urow[r] + k);
                    } else {
                        if (((uintptr_t)p & 63) < (uintptr_t)(8 * bits))
                            _mm_prefetch((const char *)p + PF_AHEAD, _MM_HINT_T0);
                        c = codes64(u, p, half ? u->half : u->full, B8);
                    }
                    const __m512i is = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c, x);
                    /* lanes 0-7 group j, 8-15 group j + 1 (its sd is 0 past the row) */
                    const __m512 sc = _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(sd[r][j]),
                                                           _mm512_set1_ps(sd[r][j + 1]));
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), sc, acc[r]);
                }
            }
        } else {
            for (int j = 0; j < ng; j++) {
                const int64_t k = (g0 + j) * G;
                const __m512i x0 = _mm512_loadu_si512(xq + k);
                const __m512i x1 = G == 128 ? _mm512_loadu_si512(xq + k + 64) : x0;
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                    const uint8_t *p = row[r] + k * bits / 8;
                    __m512i c0, c1 = _mm512_setzero_si512();
                    if (ub) {
                        c0 = _mm512_loadu_si512(urow[r] + k);
                        if (G == 128) c1 = _mm512_loadu_si512(urow[r] + k + 64);
                    } else {
                        if (((uintptr_t)p & 63) < (uintptr_t)(G * bits / 8))
                            _mm_prefetch((const char *)p + PF_AHEAD, _MM_HINT_T0);
                        c0 = codes64(u, p, u->full, B8);
                        if (G == 128) c1 = codes64(u, p + 8 * bits, u->full, B8);
                    }
                    __m512i is = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c0, x0);
                    if (G == 128) is = _mm512_dpbusd_epi32(is, c1, x1);
                    acc[r] =
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_set1_ps(sd[r][j]), acc[r]);
                }
            }
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) y[o + r] =
        _mm512_reduce_add_ps(_mm512_add_ps(acc[r], accb[r]));
}

static inline __attribute__((always_inline)) void
rows_g(const cpu_qmat *w, const int8_t *xq, const float *xd, const float *xs, int64_t o0,
       int64_t o1, float *y, const int G, const int B8, const uint8_t *ub, int64_t ub0,
       int64_t stride) {
    const unpack64 u = make_unpack64(w->bits);
    int64_t o = o0;
    /* Four rows at a time share the activation loads where unpacking is the work (2 and 3
     * bits); from 4 bits on a row at a time, whose three streams (codes, scales, biases)
     * the prefetchers keep up with better than twelve: 8-bit 1.5-2.1 against 2.1-2.5 ms,
     * 4-bit 1.09-1.29 against 1.40-1.52 (the 4096 -> 14336 product, 2 threads). The
     * float steps of a row are the same either way. */
    if (w->bits <= 3 || ub) /* (unpacked codes, in cache: four accumulator chains) */
        for (; o + 4 <= o1; o += 4) rows_k(w, &u, xq, xd, xs, o, y, 4, G, B8, ub, ub0, stride);
    for (; o < o1; o++) rows_k(w, &u, xq, xd, xs, o, y, 1, G, B8, ub, ub0, stride);
}

static void rows_any(const cpu_qmat *w, const int8_t *xq, const float *xd, const float *xs,
                     int64_t o0, int64_t o1, float *y, const uint8_t *ub, int64_t ub0,
                     int64_t stride) {
    const int b8 = w->bits == 8 && !ub; /* (unpacked codes are bytes whatever the width) */
    switch (w->group) {
    case 32:
        if (b8)
            rows_g(w, xq, xd, xs, o0, o1, y, 32, 1, ub, ub0, stride);
        else
            rows_g(w, xq, xd, xs, o0, o1, y, 32, 0, ub, ub0, stride);
        break;
    case 64:
        if (b8)
            rows_g(w, xq, xd, xs, o0, o1, y, 64, 1, ub, ub0, stride);
        else
            rows_g(w, xq, xd, xs, o0, o1, y, 64, 0, ub, ub0, stride);
        break;
    default: /* 128 */
        if (b8)
            rows_g(w, xq, xd, xs, o0, o1, y, 128, 1, ub, ub0, stride);
        else
            rows_g(w, xq, xd, xs, o0, o1, y, 128, 0, ub, ub0, stride);
        break;
    }
}

static void q8_rows_avx512(const cpu_qmat *w, const int8_t *xq, const float *xd, const float *xs,
                           const int32_t *xi, int64_t o0, int64_t o1, float *y) {
    (void)xi;
    rows_any(w, xq, xd, xs, o0, o1, y, NULL, 0, 0);
}

/* Prefill: rows [o0, o1) unpacked once into ub (a byte a code, stride bytes a row), then
 * each activation row against them. */
static void q8_unpack_avx512(const cpu_qmat *w, int64_t o0, int64_t o1, uint8_t *ub,
                             int64_t stride) {
    const unpack64 u = make_unpack64(w->bits);
    const int b8 = w->bits == 8;
    for (int64_t o = o0; o < o1; o++) {
        const uint8_t *row = (const uint8_t *)(w->q + o * w->wpr);
        for (int64_t k = 0; k < w->in; k += 64) {
            const __mmask64 lm = w->in - k >= 64 ? u.full : u.half;
            const uint8_t *p = row + k * w->bits / 8;
            const __m512i c = b8 ? codes64(&u, p, lm, 1) : codes64(&u, p, lm, 0);
            _mm512_storeu_si512(ub + (o - o0) * stride + k, c);
        }
    }
}

static void q8_rows_u8_avx512(const cpu_qmat *w, const uint8_t *ub, int64_t ub0, int64_t stride,
                              const int8_t *xq, const float *xd, const float *xs, const int32_t *xi,
                              int64_t o0, int64_t o1, float *y) {
    (void)xi;
    rows_any(w, xq, xd, xs, o0, o1, y, ub, ub0, stride);
}

/* Microscaled rows (sb CPU_Q_MX, blocks of 32 values, 16 bytes of 4-bit codes each): two
 * blocks a step. The codes unpack as 4-bit MLX codes do (the even value in the low
 * nibble), a vpermb maps each to its magnitude (2 |e2m1|, 0..12) and the code's sign bit
 * negates the activation instead, so vpdpbusd's unsigned x signed product is exact. Float
 * order of a row: lanes 0-7 the first block, 8-15 the second, acc = fma(isum,
 * 2^(s - 128) d, acc) block pair by block pair, then one fixed reduction. */
static void q8_rows_mx_avx512(const cpu_qmat *w, const int8_t *xq, const float *xd, const float *xs,
                              const int32_t *xi, int64_t o0, int64_t o1, float *y) {
    (void)xs;
    (void)xi;
    const unpack64 u = make_unpack64(4);
    uint8_t mag[64];
    for (int i = 0; i < 64; i++) mag[i] = (uint8_t)abs(cpu_mx_lut2[i & 15]);
    const __m512i lut = _mm512_loadu_si512(mag), sign = _mm512_set1_epi8(8);
    const int64_t gpr = w->gpr;
    for (int64_t o = o0; o < o1; o++) {
        const uint8_t *row = (const uint8_t *)(w->q + o * w->wpr);
        const uint8_t *sc = (const uint8_t *)w->scales + o * gpr;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t g = 0; g < gpr; g += 2) {
            const int half = g + 1 == gpr; /* the row's last, odd block */
            const uint8_t *p = row + g * 16;
            if (((uintptr_t)p & 63) < 32) _mm_prefetch((const char *)p + PF_AHEAD, _MM_HINT_T0);
            const __m512i x =
                _mm512_maskz_loadu_epi8(half ? 0xffffffffu : ~(__mmask64)0, xq + g * 32);
            const __m512i c = codes64(&u, p, half ? u.half : u.full, 0);
            const __mmask64 neg = _mm512_test_epi8_mask(c, sign);
            const __m512i xn = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
            const __m512i is =
                _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_permutexvar_epi8(c, lut), xn);
            const float s0 = cpu_mx_half_scale(sc[g]) * xd[g],
                        s1 = half ? 0.0f : cpu_mx_half_scale(sc[g + 1]) * xd[g + 1];
            const __m512 sv = _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(s0), _mm512_set1_ps(s1));
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), sv, acc);
        }
        y[o] = _mm512_reduce_add_ps(acc);
    }
}

const cpu_q8kernel cpu_q8kernel_avx512 = {.name = "avx512-i8",
                                          .rows = q8_rows_avx512,
                                          .unpack = q8_unpack_avx512,
                                          .rows_u8 = q8_rows_u8_avx512,
                                          .rows_mx = q8_rows_mx_avx512};
