/* Quantized kernels for AVX-512 (F, BW, VL). Codes are unpacked in registers, sixteen per
 * vector, and never stored:
 *  - 4 bits: 16 bytes hold 32 codes; the low and high nibbles are split and interleaved
 *    back into code order with two byte unpacks, then widened to 32-bit lanes.
 *  - 8 bits: 16 bytes widened straight to 32-bit lanes.
 *  - other widths: 16 codes lie in 2 * bits bytes, so one 16-byte load broadcast to the
 *    four 128-bit lanes, a byte shuffle that puts each code's two bytes in its 32-bit
 *    lane, a variable shift and a mask unpack them with the same four instructions.
 * The 4- and 8-bit loads stay inside their group; the generic one may read up to 16 bytes
 * past it, so groups that close to the tensor's end are padded (dequant) or go through
 * dequant (matvec). Two entry points: dequant (rows into f32, for cpu_q_matmul's batches and
 * embeddings) and matvec (decode, fused, with the arithmetic of the f32 kernels over
 * dequant's output so that both give the same bits). */
#include "qkernels.h"
#include "reduce_avx512.h"

#include <immintrin.h>
#include <string.h>

typedef struct unpacker {
    __m512i shuf, shift, mask;
} unpacker;

static unpacker make_unpacker(int bits) {
    int8_t s[64];
    int32_t sh[16];
    for (int i = 0; i < 16; i++) {
        /* every 128-bit lane holds the same 16 bytes (pshufb is per lane); for 8 bits the
         * second byte of code 15 wraps to byte 0, which the mask drops */
        int lo = (i * bits) >> 3, at = (i / 4) * 16 + (i % 4) * 4;
        s[at + 0] = (int8_t)lo;
        s[at + 1] = (int8_t)((lo + 1) & 15);
        s[at + 2] = -1;
        s[at + 3] = -1;
        sh[i] = (i * bits) & 7;
    }
    unpacker u;
    u.shuf = _mm512_loadu_si512(s);
    u.shift = _mm512_loadu_si512(sh);
    u.mask = _mm512_set1_epi32((1 << bits) - 1);
    return u;
}

/* Sixteen codes of any width from p (reads 16 bytes). */
static inline __m512 unpack16(const unpacker *u, const uint8_t *p) {
    __m512i v = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)p));
    v = _mm512_shuffle_epi8(v, u->shuf);
    v = _mm512_and_si512(_mm512_srlv_epi32(v, u->shift), u->mask);
    return _mm512_cvtepi32_ps(v);
}

/* Thirty-two 4-bit codes from the 16 bytes at p, in order: q[0] codes 0..15, q[1] 16..31. */
static inline void unpack32_q4(const uint8_t *p, __m512 q[2]) {
    const __m128i m = _mm_set1_epi8(0x0f);
    __m128i v = _mm_loadu_si128((const __m128i *)p);
    __m128i lo = _mm_and_si128(v, m), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
    q[0] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));
    q[1] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(lo, hi)));
}

static inline __m512 unpack16_q8(const uint8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

static void dequant_avx512(const cpu_qmat *w, int64_t row, int64_t k0, int64_t k1, float *y) {
    const int32_t G = w->group, bits = w->bits;
    const int64_t gb = (int64_t)G * bits / 8; /* bytes per group */
    const unpacker u = make_unpacker(bits);
    const uint8_t *base = (const uint8_t *)(w->q + row * w->wpr);
    /* cpu_q_matmul dequantizes CPU_Q_ROWS rows, then multiplies them out of cache: fetch
     * the next block's rows meanwhile so that memory never idles (a prefetch past the
     * tensor's end is harmless: it never faults). */
    const int64_t ahead = (int64_t)CPU_Q_ROWS * w->wpr * 4;
    /* the generic loads read up to 16 bytes past a group: pad the groups that close to
     * the end of the tensor (its last rows, when rows are short) */
    const uint8_t *end = (const uint8_t *)(w->q + w->rows * w->wpr);
    const int generic = bits != 4 && bits != 8;
    uint8_t pad[128 + 16];
    for (int64_t g = k0 / G; g < k1 / G; g++) {
        const uint8_t *p = base + g * gb;
        if (((uintptr_t)p & 63) < (uintptr_t)gb)
            _mm_prefetch((const char *)(p + ahead), _MM_HINT_T0); /* once per cache line */
        if (generic && end - p < gb + 16) {
            memcpy(pad, p, (size_t)gb);
            memset(pad + gb, 0, 16);
            p = pad;
        }
        const __m512 s = _mm512_set1_ps(cpu_q_sb_at(w->sb, w->scales, row * w->gpr + g));
        const __m512 b = _mm512_set1_ps(cpu_q_sb_at(w->sb, w->biases, row * w->gpr + g));
        float *yg = y + g * G - k0;
        if (bits == 4) {
            for (int32_t c = 0; c < G; c += 32, p += 16) {
                __m512 q[2];
                unpack32_q4(p, q);
                _mm512_storeu_ps(yg + c, _mm512_fmadd_ps(q[0], s, b));
                _mm512_storeu_ps(yg + c + 16, _mm512_fmadd_ps(q[1], s, b));
            }
        } else if (bits == 8) {
            for (int32_t c = 0; c < G; c += 16, p += 16)
                _mm512_storeu_ps(yg + c, _mm512_fmadd_ps(unpack16_q8(p), s, b));
        } else {
            for (int32_t c = 0; c < G; c += 16, p += 2 * bits)
                _mm512_storeu_ps(yg + c, _mm512_fmadd_ps(unpack16(&u, p), s, b));
        }
    }
}

enum { GENERIC = 0, Q4 = 4, Q8 = 8 };
#define PF_AHEAD 1024 /* bytes of a weight row fetched ahead by mv_rows */

/* R (1..4) weight rows from o against x: R accumulator chains and R weight streams. The
 * arithmetic is dequant_avx512's (w = fma(q, s, b)) followed by kernels_avx512.c's decode
 * (acc = fma(x, w, acc) lane-wise along k, a cpu_hsum4_512 per kblock, blocks added in
 * order), so the result is the bits of the f32 product over the dequantized rows. */
static inline __attribute__((always_inline)) void mv_rows(const cpu_qmat *w, const unpacker *u,
                                                          const float *x, int64_t o, float *y,
                                                          int64_t kblock, const int R,
                                                          const int MODE) {
    const int32_t G = w->group, bits = w->bits;
    const int64_t gb = (int64_t)G * bits / 8, in = w->in, gpr = w->gpr;
    const uint8_t *row[4];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) row[r] =
        (const uint8_t *)(w->q + (o + r) * w->wpr);
    for (int64_t kb = 0; kb < in; kb += kblock) {
        const int64_t ke = in - kb < kblock ? in : kb + kblock;
        __m512 acc[4];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
        for (int64_t g = kb / G; g < ke / G; g++) {
            const float *xg = x + g * G;
            __m512 s[4], b[4];
            const uint8_t *p[4];
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                s[r] = _mm512_set1_ps(cpu_q_sb_at(w->sb, w->scales, (o + r) * gpr + g));
                b[r] = _mm512_set1_ps(cpu_q_sb_at(w->sb, w->biases, (o + r) * gpr + g));
                p[r] = row[r] + g * gb;
                /* R interleaved streams (and their scales): fetch ahead, once per line */
                if (((uintptr_t)p[r] & 63) < (uintptr_t)gb)
                    _mm_prefetch((const char *)(p[r] + PF_AHEAD), _MM_HINT_T0);
                if ((g & 15) == 0) { /* and their scales and biases (16+ per line) */
                    const int64_t at = ((o + r) * gpr + g + 64) * (w->sb == 0 ? 4 : 2);
                    _mm_prefetch((const char *)w->scales + at, _MM_HINT_T0);
                    _mm_prefetch((const char *)w->biases + at, _MM_HINT_T0);
                }
            }
            if (MODE == Q4) {
                _Pragma("GCC unroll 2") for (int32_t c = 0; c < G; c += 32) {
                    const __m512 x0 = _mm512_loadu_ps(xg + c), x1 = _mm512_loadu_ps(xg + c + 16);
                    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                        __m512 q[2];
                        unpack32_q4(p[r] + c / 2, q);
                        acc[r] = _mm512_fmadd_ps(x0, _mm512_fmadd_ps(q[0], s[r], b[r]), acc[r]);
                        acc[r] = _mm512_fmadd_ps(x1, _mm512_fmadd_ps(q[1], s[r], b[r]), acc[r]);
                    }
                }
            } else {
                for (int32_t c = 0; c < G; c += 16) {
                    const __m512 x0 = _mm512_loadu_ps(xg + c);
                    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                        __m512 q = MODE == Q8 ? unpack16_q8(p[r] + c)
                                              : unpack16(u, p[r] + c / 16 * 2 * bits);
                        acc[r] = _mm512_fmadd_ps(x0, _mm512_fmadd_ps(q, s[r], b[r]), acc[r]);
                    }
                }
            }
        }
        if (R == 4) {
            __m128 s4 = cpu_hsum4_512(acc[0], acc[1], acc[2], acc[3]);
            if (kb > 0) s4 = _mm_add_ps(s4, _mm_loadu_ps(y + o));
            _mm_storeu_ps(y + o, s4);
        } else {
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                float t = cpu_hsum_512(acc[r]);
                y[o + r] = kb > 0 ? y[o + r] + t : t;
            }
        }
    }
}

/* The same for one row through dequant (its loads are padded for the tensor's last row). */
static void mv_row_dequant(const cpu_qmat *w, const float *x, int64_t o, float *y, int64_t kblock) {
    _Alignas(64) float buf[1024];
    const int64_t step = kblock < 1024 ? kblock : 1024;
    for (int64_t kb = 0; kb < w->in; kb += step) {
        const int64_t ke = w->in - kb < step ? w->in : kb + step;
        dequant_avx512(w, o, kb, ke, buf);
        __m512 acc = _mm512_setzero_ps();
        for (int64_t k = kb; k < ke; k += 16)
            acc = _mm512_fmadd_ps(_mm512_loadu_ps(x + k), _mm512_load_ps(buf + k - kb), acc);
        float t = cpu_hsum_512(acc);
        y[o] = kb > 0 ? y[o] + t : t;
    }
}

static inline __attribute__((always_inline)) void matvec_mode(const cpu_qmat *w, const float *x,
                                                              int64_t o0, int64_t o1, float *y,
                                                              int64_t kblock, const int MODE) {
    const unpacker u = make_unpacker(w->bits);
    /* The generic loads read up to 16 bytes past a group: the rows within 16 bytes of the
     * tensor's end go through dequant, which pads them (same arithmetic, same bits). */
    int64_t end = o1;
    if (MODE == GENERIC) {
        const int64_t rb = w->wpr * 4, safe = w->rows - 1 - (16 + rb - 1) / rb;
        if (end > safe + 1) end = safe + 1 > o0 ? safe + 1 : o0;
    }
    int64_t o = o0;
    for (; o + 4 <= end; o += 4) mv_rows(w, &u, x, o, y, kblock, 4, MODE);
    for (; o < end; o++) mv_rows(w, &u, x, o, y, kblock, 1, MODE);
    for (; o < o1; o++) mv_row_dequant(w, x, o, y, kblock);
}

static void matvec_avx512(const cpu_qmat *w, const float *x, int64_t o0, int64_t o1, float *y,
                          int64_t kblock) {
    if (kblock > 1024) kblock = 1024; /* the paths' blocks are 512; keeps mv_row_dequant's buffer */
    if (w->bits == 4)
        matvec_mode(w, x, o0, o1, y, kblock, Q4);
    else if (w->bits == 8)
        matvec_mode(w, x, o0, o1, y, kblock, Q8);
    else
        matvec_mode(w, x, o0, o1, y, kblock, GENERIC);
}

/* ---- microscaled 4-bit (qkernels.h CPU_Q_MX) ----------------------------------------
 * As in the avx2 path: nibbles split and interleaved back into order, a byte shuffle
 * through cpu_mx_lut2, widened sixteen at a time and multiplied by 2^(s - 128) (exact);
 * matvec_mx adds them with matmul_f32's arithmetic (one cpu_hsum4_512 per kblock). */
static inline void mx_block(const uint8_t *p, __m128i lut, __m512 hs, __m512 w[2]) {
    const __m128i m = _mm_set1_epi8(0x0f);
    const __m128i v = _mm_loadu_si128((const __m128i *)p);
    const __m128i lo = _mm_and_si128(v, m), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
    const __m128i i0 = _mm_shuffle_epi8(lut, _mm_unpacklo_epi8(lo, hi));
    const __m128i i1 = _mm_shuffle_epi8(lut, _mm_unpackhi_epi8(lo, hi));
    w[0] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(i0)), hs);
    w[1] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(i1)), hs);
}

static void dequant_mx_avx512(const cpu_qmat *w, int64_t row, int64_t k0, int64_t k1, float *y) {
    const __m128i lut = _mm_loadu_si128((const __m128i *)cpu_mx_lut2);
    const uint8_t *rb = (const uint8_t *)(w->q + row * w->wpr);
    const uint8_t *sc = (const uint8_t *)w->scales + row * w->gpr;
    const int64_t ahead = (int64_t)CPU_Q_ROWS * w->wpr * 4;
    for (int64_t g = k0 / 32; g < k1 / 32; g++) {
        const uint8_t *p = rb + g * 16;
        if (((uintptr_t)p & 63) < 16) _mm_prefetch((const char *)(p + ahead), _MM_HINT_T0);
        __m512 v[2];
        mx_block(p, lut, _mm512_set1_ps(cpu_mx_half_scale(sc[g])), v);
        _mm512_storeu_ps(y + g * 32 - k0, v[0]);
        _mm512_storeu_ps(y + g * 32 - k0 + 16, v[1]);
    }
}

static inline __attribute__((always_inline)) void
mx_rows(const cpu_qmat *w, const float *x, int64_t o, float *y, int64_t kblock, const int R) {
    const __m128i lut = _mm_loadu_si128((const __m128i *)cpu_mx_lut2);
    const int64_t in = w->in;
    const uint8_t *row[4], *sc[4];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
        row[r] = (const uint8_t *)(w->q + (o + r) * w->wpr);
        sc[r] = (const uint8_t *)w->scales + (o + r) * w->gpr;
    }
    for (int64_t kb = 0; kb < in; kb += kblock) {
        const int64_t ke = in - kb < kblock ? in : kb + kblock;
        __m512 acc[4];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
        for (int64_t g = kb / 32; g < ke / 32; g++) {
            const __m512 x0 = _mm512_loadu_ps(x + g * 32), x1 = _mm512_loadu_ps(x + g * 32 + 16);
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                const uint8_t *p = row[r] + g * 16;
                if (((uintptr_t)p & 63) < 16)
                    _mm_prefetch((const char *)(p + PF_AHEAD), _MM_HINT_T0);
                __m512 v[2];
                mx_block(p, lut, _mm512_set1_ps(cpu_mx_half_scale(sc[r][g])), v);
                acc[r] = _mm512_fmadd_ps(x0, v[0], acc[r]);
                acc[r] = _mm512_fmadd_ps(x1, v[1], acc[r]);
            }
        }
        if (R == 4) {
            __m128 s4 = cpu_hsum4_512(acc[0], acc[1], acc[2], acc[3]);
            if (kb > 0) s4 = _mm_add_ps(s4, _mm_loadu_ps(y + o));
            _mm_storeu_ps(y + o, s4);
        } else {
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                float t = cpu_hsum_512(acc[r]);
                y[o + r] = kb > 0 ? y[o + r] + t : t;
            }
        }
    }
}

static void matvec_mx_avx512(const cpu_qmat *w, const float *x, int64_t o0, int64_t o1, float *y,
                             int64_t kblock) {
    int64_t o = o0;
    for (; o + 4 <= o1; o += 4) mx_rows(w, x, o, y, kblock, 4);
    for (; o < o1; o++) mx_rows(w, x, o, y, kblock, 1);
}

const cpu_qkernels cpu_qkernels_avx512 = {
    .name = "avx512",
    .dequant = dequant_avx512,
    .matvec = matvec_avx512,
    .dequant_mx = dequant_mx_avx512,
    .matvec_mx = matvec_mx_avx512,
};
