/* Quantized kernels for AVX2+FMA. Codes are unpacked in registers, eight per vector:
 *  - 4 bits: a 32-bit word holds 8 codes; broadcast to the 8 lanes, each lane shifted
 *    by its code's place and masked.
 *  - 8 bits: 8 bytes widened straight to 32-bit lanes.
 *  - 2 and 3 bits: 8 codes lie in one 32-bit word: unpacked as 4 bits are.
 *  - 5 and 6 bits: 8 codes lie in `bits` bytes, so one 8-byte load broadcast to both
 *    halves, a byte shuffle that puts each code's two bytes in its 32-bit lane, a variable
 *    shift and a mask unpack them with the same four instructions.
 * The 4- and 8-bit loads stay inside their group; the others may read up to 8 bytes
 * past it, so groups that close to the tensor's end are padded (dequant) or go through
 * dequant (matvec). Two entry points: dequant (rows into f32, for cpu_q_matmul's batches and
 * embeddings) and matvec (decode, fused, with the arithmetic of the f32 kernels over
 * dequant's output so that both give the same bits). */
#include "qkernels.h"
#include "reduce_avx2.h"

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

typedef struct unpacker {
    __m256i shuf, shift, mask;
    __m256i wshift; /* 2 and 3 bits: code i's place in a 32-bit word, i * bits */
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
    u.wshift =
        _mm256_setr_epi32(0, bits, 2 * bits, 3 * bits, 4 * bits, 5 * bits, 6 * bits, 7 * bits);
    u.shuf = _mm256_loadu_si256((const __m256i *)s);
    u.shift = _mm256_loadu_si256((const __m256i *)sh);
    u.mask = _mm256_set1_epi32((1 << bits) - 1);
    return u;
}

/* Eight 2- or 3-bit codes from p, which fit one 32-bit word (reads 4 bytes): as
 * unpack8_q4, the word broadcast to the lanes and each shifted by its code's place, with no
 * byte shuffle. The 4096 -> 14336 product on 2 threads: 3 bits 2.92-3.04 against 3.77-3.91
 * ms with the shuffle, 2 bits 2.68-2.73 against 3.56-3.83. */
static inline __m256 unpack8_w(const unpacker *u, const uint8_t *p) {
    uint32_t wd;
    memcpy(&wd, p, sizeof wd);
    __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32((int)wd), u->wshift);
    return _mm256_cvtepi32_ps(_mm256_and_si256(v, u->mask));
}

/* Eight codes from p (reads 8 bytes; the caller pads the tensor's last group). */
static inline __m256 unpack8(const unpacker *u, const uint8_t *p) {
    __m256i v = _mm256_broadcastsi128_si256(_mm_loadl_epi64((const __m128i *)p));
    v = _mm256_shuffle_epi8(v, u->shuf);
    v = _mm256_and_si256(_mm256_srlv_epi32(v, u->shift), u->mask);
    return _mm256_cvtepi32_ps(v);
}

/* Eight 4-bit codes, the 32-bit word at p (codes LSB first), in order: the word broadcast
 * to every lane (a load, no shuffle), each lane shifted by 4 x its index (sh) and masked
 * (m). Measured against splitting 8 bytes' nibbles with byte shuffles and widening them
 * (the 4-bit decode matvec [14336 x 4096], 2 threads): 3.0 against 4.3 ms; the shuffles
 * competed with the FMAs for the vector ports. */
#define Q4_SHIFTS _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)
static inline __m256 unpack8_q4(const uint8_t *p, __m256i sh, __m256i m) {
    uint32_t wd;
    memcpy(&wd, p, sizeof wd);
    __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32((int)wd), sh);
    return _mm256_cvtepi32_ps(_mm256_and_si256(v, m));
}

static inline __m256 unpack8_q8(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

static void dequant_avx2(const cpu_qmat *w, int64_t row, int64_t k0, int64_t k1, float *y) {
    const int32_t G = w->group, bits = w->bits;
    const int64_t gb = (int64_t)G * bits / 8; /* bytes per group */
    const unpacker u = make_unpacker(bits);
    const __m256i q4_shift = Q4_SHIFTS, q4_mask = _mm256_set1_epi32(15);
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
        const __m256 s = _mm256_set1_ps(cpu_q_sb_at(w->sb, w->scales, row * w->gpr + g));
        const __m256 b = _mm256_set1_ps(cpu_q_sb_at(w->sb, w->biases, row * w->gpr + g));
        float *yg = y + g * G - k0;
        if (bits == 4) {
            for (int32_t c = 0; c < G; c += 8, p += 4)
                _mm256_storeu_ps(yg + c, _mm256_fmadd_ps(unpack8_q4(p, q4_shift, q4_mask), s, b));
        } else if (bits == 8) {
            for (int32_t c = 0; c < G; c += 8, p += 8)
                _mm256_storeu_ps(yg + c, _mm256_fmadd_ps(unpack8_q8(p), s, b));
        } else {
            for (int32_t c = 0; c < G; c += 8, p += bits)
                _mm256_storeu_ps(
                    yg + c, _mm256_fmadd_ps(bits < 4 ? unpack8_w(&u, p) : unpack8(&u, p), s, b));
        }
    }
}

/* n scales or biases from index i on, as f32, eight at a time where they are 16-bit */
static inline void sb_run(int32_t sb, const void *p, int64_t i, int n, float *out) {
    int j = 0;
    if (sb == 2)
        for (; j + 8 <= n; j += 8) {
            __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i + j));
            __m256i f = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
            _mm256_storeu_ps(out + j, _mm256_castsi256_ps(f));
        }
    else if (sb == 1)
        for (; j + 8 <= n; j += 8)
            _mm256_storeu_ps(out + j, _mm256_cvtph_ps(_mm_loadu_si128(
                                          (const __m128i *)((const uint16_t *)p + i + j))));
    for (; j < n; j++) out[j] = cpu_q_sb_at(sb, p, i + j);
}

/* the unpack a product's codes take (LOW: 2 and 3 bits) */
enum { GENERIC = 0, LOW = 1, Q4 = 4, Q8 = 8 };
#define MV_MAX_KBLOCK 1024 /* the largest k block matvec_avx2 lets through */
#define PF_AHEAD      1024 /* bytes of a weight row fetched ahead by mv_rows */

/* R (1..4) weight rows from o against x: R accumulator chains and R weight streams. The
 * arithmetic is dequant_avx2's (w = fma(q, s, b)) followed by kernels_avx2.c's decode
 * (acc = fma(x, w, acc) lane-wise along k, a cpu_hsum4_256 per kblock, blocks added in
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
        __m256 acc[4];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
        /* the block's scales and biases as f32 first, eight at a time: converted one by one
         * in the group loop they made the 8-bit product 9% slower (4-bit: no difference) */
        const int64_t g0 = kb / G;
        const int ng = (int)((ke - kb) / G);
        float sf[4][MV_MAX_KBLOCK / 32], bf[4][MV_MAX_KBLOCK / 32]; /* groups: 32 at least */
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            sb_run(w->sb, w->scales, (o + r) * gpr + g0, ng, sf[r]);
            sb_run(w->sb, w->biases, (o + r) * gpr + g0, ng, bf[r]);
        }
        for (int64_t g = g0; g < ke / G; g++) {
            const float *xg = x + g * G;
            __m256 s[4], b[4];
            const uint8_t *p[4];
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                s[r] = _mm256_broadcast_ss(&sf[r][g - g0]);
                b[r] = _mm256_broadcast_ss(&bf[r][g - g0]);
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
                const __m256i sh = Q4_SHIFTS, m = _mm256_set1_epi32(15);
                _Pragma("GCC unroll 4") for (int32_t c = 0; c < G; c += 8) {
                    const __m256 x0 = _mm256_loadu_ps(xg + c);
                    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                        __m256 q = unpack8_q4(p[r] + c / 2, sh, m);
                        acc[r] = _mm256_fmadd_ps(x0, _mm256_fmadd_ps(q, s[r], b[r]), acc[r]);
                    }
                }
            } else {
                for (int32_t c = 0; c < G; c += 8) {
                    const __m256 x0 = _mm256_loadu_ps(xg + c);
                    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                        __m256 q = MODE == Q8    ? unpack8_q8(p[r] + c)
                                   : MODE == LOW ? unpack8_w(u, p[r] + c / 8 * bits)
                                                 : unpack8(u, p[r] + c / 8 * bits);
                        acc[r] = _mm256_fmadd_ps(x0, _mm256_fmadd_ps(q, s[r], b[r]), acc[r]);
                    }
                }
            }
        }
        if (R == 4) {
            __m128 s4 = cpu_hsum4_256(acc[0], acc[1], acc[2], acc[3]);
            if (kb > 0) s4 = _mm_add_ps(s4, _mm_loadu_ps(y + o));
            _mm_storeu_ps(y + o, s4);
        } else {
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                float t = cpu_hsum_256(acc[r]);
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
        dequant_avx2(w, o, kb, ke, buf);
        __m256 acc = _mm256_setzero_ps();
        for (int64_t k = kb; k < ke; k += 8)
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), _mm256_load_ps(buf + k - kb), acc);
        float t = cpu_hsum_256(acc);
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
    if (MODE == GENERIC || MODE == LOW) {
        const int64_t rb = w->wpr * 4, safe = w->rows - 1 - (16 + rb - 1) / rb;
        if (end > safe + 1) end = safe + 1 > o0 ? safe + 1 : o0;
    }
    int64_t o = o0;
    for (; o + 4 <= end; o += 4) mv_rows(w, &u, x, o, y, kblock, 4, MODE);
    for (; o < end; o++) mv_rows(w, &u, x, o, y, kblock, 1, MODE);
    for (; o < o1; o++) mv_row_dequant(w, x, o, y, kblock);
}

static void matvec_avx2(const cpu_qmat *w, const float *x, int64_t o0, int64_t o1, float *y,
                        int64_t kblock) {
    if (kblock > MV_MAX_KBLOCK) /* the paths' blocks are 512; keeps mv_row_dequant's buffer */
        kblock = MV_MAX_KBLOCK;
    if (w->bits == 4)
        matvec_mode(w, x, o0, o1, y, kblock, Q4);
    else if (w->bits == 8)
        matvec_mode(w, x, o0, o1, y, kblock, Q8);
    else if (w->bits < 4)
        matvec_mode(w, x, o0, o1, y, kblock, LOW);
    else
        matvec_mode(w, x, o0, o1, y, kblock, GENERIC);
}

/* ---- microscaled 4-bit (qkernels.h CPU_Q_MX) ----------------------------------------
 * A block's 16 bytes split into low and high nibbles and interleaved back into order (32
 * codes), a byte shuffle through cpu_mx_lut2 gives each code's integer, and 8 at a time
 * they are widened, converted and multiplied by 2^(s - 128): exact, so dequant_mx and
 * matvec_mx make the same weights, and matvec_mx adds them with matmul_f32's arithmetic
 * (acc = fma(x, w, acc) lane-wise along k, one cpu_hsum4_256 per kblock, blocks added in
 * order). */
static inline void mx_ints(const uint8_t *p, __m128i lut, __m128i *i0, __m128i *i1) {
    const __m128i m = _mm_set1_epi8(0x0f);
    const __m128i v = _mm_loadu_si128((const __m128i *)p);
    const __m128i lo = _mm_and_si128(v, m), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
    *i0 = _mm_shuffle_epi8(lut, _mm_unpacklo_epi8(lo, hi)); /* values 0..15 */
    *i1 = _mm_shuffle_epi8(lut, _mm_unpackhi_epi8(lo, hi)); /* values 16..31 */
}

/* The block's 32 weights, w[0..3] eight each. */
static inline void mx_block(const uint8_t *p, __m128i lut, __m256 hs, __m256 w[4]) {
    __m128i i0, i1;
    mx_ints(p, lut, &i0, &i1);
    w[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(i0)), hs);
    w[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(i0, 8))), hs);
    w[2] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(i1)), hs);
    w[3] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(i1, 8))), hs);
}

static void dequant_mx_avx2(const cpu_qmat *w, int64_t row, int64_t k0, int64_t k1, float *y) {
    const __m128i lut = _mm_loadu_si128((const __m128i *)cpu_mx_lut2);
    const uint8_t *rb = (const uint8_t *)(w->q + row * w->wpr);
    const uint8_t *sc = (const uint8_t *)w->scales + row * w->gpr;
    const int64_t ahead = (int64_t)CPU_Q_ROWS * w->wpr * 4;
    for (int64_t g = k0 / 32; g < k1 / 32; g++) {
        const uint8_t *p = rb + g * 16;
        if (((uintptr_t)p & 63) < 16) _mm_prefetch((const char *)(p + ahead), _MM_HINT_T0);
        __m256 v[4];
        mx_block(p, lut, _mm256_set1_ps(cpu_mx_half_scale(sc[g])), v);
        float *yg = y + g * 32 - k0;
        for (int c = 0; c < 4; c++) _mm256_storeu_ps(yg + 8 * c, v[c]);
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
        __m256 acc[4];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
        for (int64_t g = kb / 32; g < ke / 32; g++) {
            const float *xg = x + g * 32;
            const __m256 x0 = _mm256_loadu_ps(xg), x1 = _mm256_loadu_ps(xg + 8),
                         x2 = _mm256_loadu_ps(xg + 16), x3 = _mm256_loadu_ps(xg + 24);
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                const uint8_t *p = row[r] + g * 16;
                if (((uintptr_t)p & 63) < 16)
                    _mm_prefetch((const char *)(p + PF_AHEAD), _MM_HINT_T0);
                __m256 v[4];
                mx_block(p, lut, _mm256_set1_ps(cpu_mx_half_scale(sc[r][g])), v);
                acc[r] = _mm256_fmadd_ps(x0, v[0], acc[r]);
                acc[r] = _mm256_fmadd_ps(x1, v[1], acc[r]);
                acc[r] = _mm256_fmadd_ps(x2, v[2], acc[r]);
                acc[r] = _mm256_fmadd_ps(x3, v[3], acc[r]);
            }
        }
        if (R == 4) {
            __m128 s4 = cpu_hsum4_256(acc[0], acc[1], acc[2], acc[3]);
            if (kb > 0) s4 = _mm_add_ps(s4, _mm_loadu_ps(y + o));
            _mm_storeu_ps(y + o, s4);
        } else {
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                float t = cpu_hsum_256(acc[r]);
                y[o + r] = kb > 0 ? y[o + r] + t : t;
            }
        }
    }
}

static void matvec_mx_avx2(const cpu_qmat *w, const float *x, int64_t o0, int64_t o1, float *y,
                           int64_t kblock) {
    int64_t o = o0;
    for (; o + 4 <= o1; o += 4) mx_rows(w, x, o, y, kblock, 4);
    for (; o < o1; o++) mx_rows(w, x, o, y, kblock, 1);
}

const cpu_qkernels cpu_qkernels_avx2 = {
    .name = "avx2",
    .dequant = dequant_avx2,
    .matvec = matvec_avx2,
    .dequant_mx = dequant_mx_avx2,
    .matvec_mx = matvec_mx_avx2,
};

/* ---- fast mode (qkernels.h, cpu_q8kernel): codes times int8 activations --------------
 * 32 codes per step as bytes in order:
 *  - 8 bits: the 32 bytes.
 *  - 4 bits: 16 bytes, low and high nibbles interleaved back into order.
 *  - 2, 3, 5, 6 bits: the step's 4 b bytes (b dwords, a masked load that never reads past
 *    them), copied so that each 128-bit half holds the bytes of its 8 codes, a byte
 *    shuffle that gives code i the 16-bit lane of its two bytes, a multiply by
 *    2^(16 - sh - b) that puts its top bit at bit 15 (sh + b <= 13: in the lane) and a
 *    uniform shift right by 16 - b; packed to bytes and put back in order.
 * Products: codes of b <= 6 bits are <= 63, activations in [-127, 127], so vpmaddubsw's
 * int16 pair sums are at most 2 * 63 * 127 = 16002 < 32767: no saturation; vpmaddwd by
 * ones widens them to int32. 8-bit codes (<= 255) could reach 2 * 255 * 127 = 64770, so
 * they are widened to int16 instead and multiplied with vpmaddwd, whose int32 pair sums
 * (at most 64770) cannot overflow. A group of G codes sums at most 128 * 255 * 127 < 2^23.
 * Float order of a row: per group in order, acc = fma(isum lanes, s d, acc) over 8 lanes,
 * accb += b xs as scalars; y = the fixed reduction of acc (cpu_hsum_256) + accb. */
typedef struct unpack32 {
    __m256i idx_a, idx_b, shuf, mul;
    __m256i load; /* dword mask of the b dwords */
    int bits;
} unpack32;

static unpack32 make_unpack32(int bits) {
    unpack32 u;
    int32_t ia[8], ib[8], ld[8];
    int8_t sh[32];
    int16_t mul[16];
    const int base_b = bits / 2; /* first dword of the window of codes 16..31 */
    for (int i = 0; i < 8; i++) {
        ia[i] = i & 3;
        ib[i] = base_b + (i & 3);
        ld[i] = i < bits ? -1 : 0;
    }
    for (int h = 0; h < 2; h++)       /* half h: codes 8 h .. 8 h + 7 of the 16 */
        for (int i = 0; i < 8; i++) { /* (the same pattern serves both 16-code windows) */
            const int c = 8 * h + i, bit = c * bits;
            /* window A starts at byte 0, window B at byte 4 base_b, 2 bits ahead of code 16's
             * first byte by (2 b - 4 base_b) bytes: 0 or 2 */
            sh[16 * h + 2 * i] = (int8_t)(bit / 8);
            sh[16 * h + 2 * i + 1] = (int8_t)(bit / 8 + 1);
            mul[8 * h + i] = (int16_t)(1 << (16 - bit % 8 - bits));
        }
    u.idx_a = _mm256_loadu_si256((const __m256i *)ia);
    u.idx_b = _mm256_loadu_si256((const __m256i *)ib);
    u.shuf = _mm256_loadu_si256((const __m256i *)sh);
    u.mul = _mm256_loadu_si256((const __m256i *)mul);
    u.load = _mm256_loadu_si256((const __m256i *)ld);
    u.bits = bits;
    return u;
}

/* 16 codes as 16-bit lanes from a window whose byte 0 is the first code's byte. */
static inline __m256i codes16(const unpack32 *u, __m256i win, __m256i shuf) {
    __m256i v = _mm256_shuffle_epi8(win, shuf);
    v = _mm256_mullo_epi16(v, u->mul);
    return _mm256_srl_epi16(v, _mm_cvtsi32_si128(16 - u->bits));
}

enum { C_GEN = 0, C_4 = 4, C_8 = 8 };

/* 32 codes as bytes in order (C_4, C_GEN). */
static inline __m256i codes32(const unpack32 *u, const uint8_t *p, const int MODE) {
    if (MODE == C_4) {
        const __m128i m = _mm_set1_epi8(0x0f), v = _mm_loadu_si128((const __m128i *)p);
        const __m128i lo = _mm_and_si128(v, m), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
        return _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
    }
    const __m256i v = _mm256_maskload_epi32((const int *)p, u->load);
    /* codes 16..31 start at byte 2 b; the window B starts at dword b / 2 (byte 4 (b / 2)),
     * so 2 b - 4 (b / 2) bytes (0 or 2) before them: shift the shuffle by that much */
    const __m256i a = _mm256_permutevar8x32_epi32(v, u->idx_a);
    const __m256i b = _mm256_permutevar8x32_epi32(v, u->idx_b);
    const int skew = 2 * u->bits - 4 * (u->bits / 2);
    const __m256i ca = codes16(u, a, u->shuf);
    const __m256i cb = codes16(u, b, _mm256_add_epi8(u->shuf, _mm256_set1_epi8((char)skew)));
    /* packus per half: [A0-7 B16-23 | A8-15 B24-31] -> qwords 0 2 1 3 */
    return _mm256_permute4x64_epi64(_mm256_packus_epi16(ca, cb), 0xd8);
}

/* int32 lane sums of 32 codes at p times the 32 activations at x. */
static inline __m256i dot32(const unpack32 *u, const uint8_t *p, const int8_t *x, const int MODE) {
    const __m256i xv = _mm256_loadu_si256((const __m256i *)x);
    if (MODE == C_8) {
        const __m256i c = _mm256_loadu_si256((const __m256i *)p);
        const __m256i lo = _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm256_castsi256_si128(c)),
                                             _mm256_cvtepi8_epi16(_mm256_castsi256_si128(xv)));
        const __m256i hi = _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm256_extracti128_si256(c, 1)),
                                             _mm256_cvtepi8_epi16(_mm256_extracti128_si256(xv, 1)));
        return _mm256_add_epi32(lo, hi);
    }
    const __m256i prod = _mm256_maddubs_epi16(codes32(u, p, MODE), xv);
    return _mm256_madd_epi16(prod, _mm256_set1_epi16(1));
}

static inline __attribute__((always_inline)) void q8_rows_k(const cpu_qmat *w, const unpack32 *u,
                                                            const int8_t *xq, const float *xd,
                                                            const float *xs, int64_t o, float *y,
                                                            const int R, const int MODE) {
    const int32_t G = w->group, bits = w->bits;
    const int64_t gpr = w->gpr, gb = (int64_t)G * bits / 8;
    const uint8_t *row[4];
    __m256 acc[4];
    float accb[4];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
        row[r] = (const uint8_t *)(w->q + (o + r) * w->wpr);
        acc[r] = _mm256_setzero_ps();
        accb[r] = 0;
    }
    for (int64_t g = 0; g < gpr; g++) {
        const int8_t *xg = xq + g * G;
        __m256i is[4];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            const uint8_t *p = row[r] + g * gb;
            if (((uintptr_t)p & 63) < (uintptr_t)gb)
                _mm_prefetch((const char *)p + 1024, _MM_HINT_T0);
            is[r] = dot32(u, p, xg, MODE);
        }
        for (int32_t c = 32; c < G; c += 32)
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) is[r] =
                _mm256_add_epi32(is[r], dot32(u, row[r] + g * gb + c * bits / 8, xg + c, MODE));
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            const int64_t at = (o + r) * gpr + g;
            const float s = cpu_q_sb_at(w->sb, w->scales, at);
            const float b = cpu_q_sb_at(w->sb, w->biases, at);
            const float sd = s * xd[g], bx = b * xs[g];
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[r]), _mm256_set1_ps(sd), acc[r]);
            accb[r] = accb[r] + bx;
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) y[o + r] = cpu_hsum_256(acc[r]) + accb[r];
}

static inline __attribute__((always_inline)) void q8_rows_mode(const cpu_qmat *w, const int8_t *xq,
                                                               const float *xd, const float *xs,
                                                               int64_t o0, int64_t o1, float *y,
                                                               const int MODE) {
    const unpack32 u = make_unpack32(w->bits);
    int64_t o = o0;
    for (; o + 4 <= o1; o += 4) q8_rows_k(w, &u, xq, xd, xs, o, y, 4, MODE);
    for (; o < o1; o++) q8_rows_k(w, &u, xq, xd, xs, o, y, 1, MODE);
}

static void q8_rows_avx2(const cpu_qmat *w, const int8_t *xq, const float *xd, const float *xs,
                         const int32_t *xi, int64_t o0, int64_t o1, float *y) {
    (void)xi;
    if (w->bits == 8)
        q8_rows_mode(w, xq, xd, xs, o0, o1, y, C_8);
    else if (w->bits == 4)
        q8_rows_mode(w, xq, xd, xs, o0, o1, y, C_4);
    else
        q8_rows_mode(w, xq, xd, xs, o0, o1, y, C_GEN);
}

/* Microscaled rows (sb CPU_Q_MX, blocks of 32): a block's nibbles in value order (as
 * mx_ints), a byte shuffle to their magnitudes (2 |e2m1|, 0..12), the code's sign bit
 * moved to the top of a byte so that _mm256_sign_epi8 negates the activation instead (a
 * zero there zeroes it too, where the magnitude is 0 anyway), then maddubs and madd: exact
 * int32 lane sums. Float order of a row: acc = fma(isum, 2^(s - 128) d, acc) block by
 * block, then cpu_hsum_256. */
static void q8_rows_mx_avx2(const cpu_qmat *w, const int8_t *xq, const float *xd, const float *xs,
                            const int32_t *xi, int64_t o0, int64_t o1, float *y) {
    (void)xs;
    (void)xi;
    int8_t mag[16];
    for (int i = 0; i < 16; i++) mag[i] = (int8_t)abs(cpu_mx_lut2[i]);
    const __m128i lut = _mm_loadu_si128((const __m128i *)mag), m = _mm_set1_epi8(0x0f);
    const __m256i ones = _mm256_set1_epi16(1);
    const int64_t gpr = w->gpr;
    for (int64_t o = o0; o < o1; o++) {
        const uint8_t *row = (const uint8_t *)(w->q + o * w->wpr);
        const uint8_t *sc = (const uint8_t *)w->scales + o * gpr;
        __m256 acc = _mm256_setzero_ps();
        for (int64_t g = 0; g < gpr; g++) {
            const uint8_t *p = row + g * 16;
            if (((uintptr_t)p & 63) < 16) _mm_prefetch((const char *)p + 1024, _MM_HINT_T0);
            const __m128i v = _mm_loadu_si128((const __m128i *)p);
            const __m128i lo = _mm_and_si128(v, m), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
            const __m256i c =
                _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
            const __m256i mg = _mm256_shuffle_epi8(_mm256_set_m128i(lut, lut), c);
            /* codes < 16: a 16-bit shift by 4 moves each byte's bit 3 to its bit 7 */
            const __m256i xv = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(xq + g * 32)),
                                                _mm256_slli_epi16(c, 4));
            const __m256i is = _mm256_madd_epi16(_mm256_maddubs_epi16(mg, xv), ones);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is),
                                  _mm256_set1_ps(cpu_mx_half_scale(sc[g]) * xd[g]), acc);
        }
        y[o] = cpu_hsum_256(acc);
    }
}

const cpu_q8kernel cpu_q8kernel_avx2 = {
    .name = "avx2-i8", .rows = q8_rows_avx2, .rows_mx = q8_rows_mx_avx2};
