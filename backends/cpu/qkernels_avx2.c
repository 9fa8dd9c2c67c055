/* Quantized kernels for AVX2+FMA. Codes are unpacked in registers, eight per vector:
 *  - 4 bits: 8 bytes hold 16 codes; the low and high nibbles are split and interleaved
 *    back into code order with one byte unpack, then widened to 32-bit lanes.
 *  - 8 bits: 8 bytes widened straight to 32-bit lanes.
 *  - other widths: 8 codes lie in `bits` bytes, so one 8-byte load broadcast to both
 *    halves, a byte shuffle that puts each code's two bytes in its 32-bit lane, a variable
 *    shift and a mask unpack them with the same four instructions.
 * The 4- and 8-bit loads stay inside their group; the generic one may read up to 8 bytes
 * past it, which only the tensor's last row needs padding for. */
#include "qkernels.h"

#include <immintrin.h>
#include <string.h>

typedef struct unpacker {
    __m256i shuf, shift, mask;
} unpacker;

static unpacker make_unpacker(int bits) {
    int8_t s[32];
    int32_t sh[8];
    for (int i = 0; i < 8; i++) {
        /* lanes 4..7 sit in the upper half, which holds the same 8 bytes (pshufb is per
         * half) */
        int lo = (i * bits) >> 3, at = (i / 4) * 16 + (i % 4) * 4;
        s[at + 0] = (int8_t)lo;
        s[at + 1] = (int8_t)(lo + 1);
        s[at + 2] = -1;
        s[at + 3] = -1;
        sh[i] = (i * bits) & 7;
    }
    unpacker u;
    u.shuf = _mm256_loadu_si256((const __m256i *)s);
    u.shift = _mm256_loadu_si256((const __m256i *)sh);
    u.mask = _mm256_set1_epi32((1 << bits) - 1);
    return u;
}

/* Eight codes from p (reads 8 bytes; the caller pads the tensor's last group). */
static inline __m256 unpack8(const unpacker *u, const uint8_t *p) {
    __m256i v = _mm256_broadcastsi128_si256(_mm_loadl_epi64((const __m128i *)p));
    v = _mm256_shuffle_epi8(v, u->shuf);
    v = _mm256_and_si256(_mm256_srlv_epi32(v, u->shift), u->mask);
    return _mm256_cvtepi32_ps(v);
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

/* Sixteen 4-bit codes from the 8 bytes at p, in order: q[0] codes 0..7, q[1] 8..15. */
static inline void unpack16_q4(const uint8_t *p, __m256 q[2]) {
    const __m128i m = _mm_set1_epi8(0x0f);
    __m128i v = _mm_loadl_epi64((const __m128i *)p);
    __m128i c = _mm_unpacklo_epi8(_mm_and_si128(v, m), _mm_and_si128(_mm_srli_epi16(v, 4), m));
    q[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(c));
    q[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(c, 8)));
}

static inline __m256 unpack8_q8(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

enum { GENERIC = 0, Q4 = 4, Q8 = 8 };

/* Rows [r0, r0 + NR) of x times weight row o. MODE is a constant after inlining, so each
 * width gets its own loop. */
static inline __attribute__((always_inline)) void tile(const unpacker *u, const float *x,
                                                       const float *xsum, int64_t r0,
                                                       const cpu_qmat *w, int64_t o, float *y,
                                                       int64_t ldy, const int NR, const int MODE) {
    const int64_t in = w->in, gpr = w->gpr;
    const int32_t G = w->group, bits = w->bits;
    const int64_t gb = (int64_t)G * bits / 8; /* bytes per group */
    /* the generic loads of the tensor's last row would run past its data */
    const int pad_tail = MODE == GENERIC && o == w->rows - 1;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    float bsum[4] = {0, 0, 0, 0};
    uint8_t pad[128 + 16];
    const uint8_t *row = (const uint8_t *)(w->q + o * w->wpr);
    for (int64_t g = 0; g < gpr; g++) {
        const uint8_t *p = row + g * gb;
        if (pad_tail) {
            memcpy(pad, p, (size_t)gb);
            memset(pad + gb, 0, 16);
            p = pad;
        }
        const float *xg = x + r0 * in + g * G;
        __m256 d[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                       _mm256_setzero_ps()};
        if (MODE == Q4) {
            for (int32_t c = 0; c < G; c += 16, p += 8) {
                __m256 q[2];
                unpack16_q4(p, q);
                for (int r = 0; r < NR; r++) {
                    d[r] = _mm256_fmadd_ps(q[0], _mm256_loadu_ps(xg + r * in + c), d[r]);
                    d[r] = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(xg + r * in + c + 8), d[r]);
                }
            }
        } else {
            for (int32_t c = 0; c < G; c += 8, p += bits) {
                __m256 q = MODE == Q8 ? unpack8_q8(p) : unpack8(u, p);
                for (int r = 0; r < NR; r++)
                    d[r] = _mm256_fmadd_ps(q, _mm256_loadu_ps(xg + r * in + c), d[r]);
            }
        }
        __m256 s = _mm256_set1_ps(cpu_q_sb_at(w->sb, w->scales, o * gpr + g));
        for (int r = 0; r < NR; r++) {
            acc[r] = _mm256_fmadd_ps(s, d[r], acc[r]);
            bsum[r] += cpu_q_sb_at(w->sb, w->biases, o * gpr + g) * xsum[(r0 + r) * gpr + g];
        }
    }
    for (int r = 0; r < NR; r++) y[(r0 + r) * ldy + o] = hsum(acc[r]) + bsum[r];
}

static inline __attribute__((always_inline)) void matmul_mode(const float *x, const float *xsum,
                                                              int64_t n, const cpu_qmat *w,
                                                              int64_t o0, int64_t o1, float *y,
                                                              int64_t ldy, const int MODE) {
    const unpacker u = make_unpacker(w->bits);
    /* Blocks of 16 weight rows stay in L1/L2 while every tile of 4 x rows passes. */
    for (int64_t ob = o0; ob < o1; ob += 16) {
        int64_t oe = ob + 16 < o1 ? ob + 16 : o1;
        for (int64_t r0 = 0; r0 < n; r0 += 4) {
            int64_t nr = n - r0;
            for (int64_t o = ob; o < oe; o++) {
                if (nr >= 4)
                    tile(&u, x, xsum, r0, w, o, y, ldy, 4, MODE);
                else if (nr == 3)
                    tile(&u, x, xsum, r0, w, o, y, ldy, 3, MODE);
                else if (nr == 2)
                    tile(&u, x, xsum, r0, w, o, y, ldy, 2, MODE);
                else
                    tile(&u, x, xsum, r0, w, o, y, ldy, 1, MODE);
            }
        }
    }
}

static void matmul_avx2(const float *x, const float *xsum, int64_t n, const cpu_qmat *w, int64_t o0,
                        int64_t o1, float *y, int64_t ldy) {
    if (w->bits == 4)
        matmul_mode(x, xsum, n, w, o0, o1, y, ldy, Q4);
    else if (w->bits == 8)
        matmul_mode(x, xsum, n, w, o0, o1, y, ldy, Q8);
    else
        matmul_mode(x, xsum, n, w, o0, o1, y, ldy, GENERIC);
}

static void dequant_row_avx2(const cpu_qmat *w, int64_t row, float *y) {
    const unpacker u = make_unpacker(w->bits);
    const int64_t gb = (int64_t)w->group * w->bits / 8;
    const uint8_t *base = (const uint8_t *)(w->q + row * w->wpr);
    uint8_t pad[128 + 16];
    for (int64_t g = 0; g < w->gpr; g++) {
        const uint8_t *p = base + g * gb;
        if (row == w->rows - 1) { /* as in tile: the last row's loads get padding */
            memcpy(pad, p, (size_t)gb);
            memset(pad + gb, 0, 16);
            p = pad;
        }
        __m256 s = _mm256_set1_ps(cpu_q_sb_at(w->sb, w->scales, row * w->gpr + g)),
               b = _mm256_set1_ps(cpu_q_sb_at(w->sb, w->biases, row * w->gpr + g));
        for (int32_t c = 0; c < w->group; c += 8, p += w->bits)
            _mm256_storeu_ps(y + g * w->group + c, _mm256_fmadd_ps(unpack8(&u, p), s, b));
    }
}

const cpu_qkernels cpu_qkernels_avx2 = {
    .name = "avx2",
    .matmul = matmul_avx2,
    .dequant_row = dequant_row_avx2,
};
