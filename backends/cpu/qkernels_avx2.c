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

const cpu_qkernels cpu_qkernels_avx2 = {
    .name = "avx2",
    .dequant = dequant_avx2,
    .matvec = matvec_avx2,
};
