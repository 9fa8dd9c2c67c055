/* The TurboQuant cache's kernels as C functions for CPU backends (header only, included
 * once by cache_tq.c; shaders/ compute the same for Vulkan). Layout of the stores, per
 * virtual head (a K/V head's block of m values; a head of 256 is two):
 *   keys   [vheads, cap, kw] words, kw = cw + sw + 1: per head, the codes of every row
 *          (cap x cw words), then their QJL signs (cap x sw, tq3 only), then their norms
 *          (cap words: two fp16, lo | hi << 16);
 *   values [vheads, cap * cw + cap / 2] words: the codes of every row, then one fp16 norm
 *          a row, two a word (cap is even).
 * Planes rather than records so that a GPU reads words at aligned places; the bytes a row
 * takes are the spec's record sizes (68 and 50 at m = 128 for tq3). The hot rows are f16
 * [hcap, kv_heads, hd], a ring (position p in row p % hcap). */
#ifndef LMHOST_TQ_KERNELS_H
#define LMHOST_TQ_KERNELS_H

#include "lmhost/lmhost.h"
#include "tq_codec.h"

#include <stdlib.h>

#define TQ_WG 64 /* items a workgroup of decode and move */

typedef struct tq_side {
    int32_t hd, m, nb;  /* values a head, a block, blocks a head */
    int32_t cw, sw, kw; /* words a block and row: codes, signs, all (keys) */
} tq_side;

static inline uint64_t tq_v_head_words(int32_t cw, int32_t cap) {
    return (uint64_t)cap * (uint64_t)cw + (uint64_t)cap / 2;
}

/* ---- encode: params 0 items (rows x vheads), 1 kv heads, 2 hd, 3 m, 4 bits, 5 qjl
 * (1: keys of tq3), 6 keys (1) or values (0), 7 source (0: f32 rows [n, kvh, hd]; 1: the
 * f16 ring [hcap, kvh, hd]), 8 the ring's first position, 9 hcap, 10 first store row,
 * 11 store rows (cap). Tensors: source, store. A workgroup a block. ---- */
static void tq_encode_item(const lmh_kernel_cpu_args *a, uint32_t item) {
    const uint32_t *p = a->call->params;
    uint32_t kvh = p[1], hd = p[2], m = p[3], bits = p[4], qjl = p[5], keys = p[6];
    uint32_t nb = hd / m, vh_all = kvh * nb, r = item / vh_all, vh = item % vh_all;
    uint32_t h = vh / nb, blk = vh % nb, cap = p[11], row = p[10] + r;
    tq_tables t;
    tq_tables_for(&t, (int)m, (int)bits);
    float x[TQ_MAX_M];
    if (p[7] == 0) {
        const float *src = (const float *)a->data[0] + ((size_t)r * kvh + h) * hd + blk * m;
        memcpy(x, src, m * 4);
    } else {
        uint32_t slot = (p[8] + r) % p[9];
        const uint16_t *src =
            (const uint16_t *)a->data[0] + ((size_t)slot * kvh + h) * hd + blk * m;
        for (uint32_t i = 0; i < m; i++) x[i] = tq_float(src[i]);
    }
    uint32_t cw = bits * m / 32, sw = qjl ? m / 32 : 0, *st = a->data[1];
    uint32_t codes[TQ_MAX_M * 4 / 32], signs[TQ_MAX_M / 32];
    uint32_t norms = tq_encode(&t, x, (int)qjl, codes, signs);
    if (keys) {
        uint32_t *base = st + (size_t)vh * cap * (cw + sw + 1);
        memcpy(base + (size_t)row * cw, codes, cw * 4);
        if (sw) memcpy(base + (size_t)cap * cw + (size_t)row * sw, signs, sw * 4);
        base[(size_t)cap * (cw + sw) + row] = norms;
    } else {
        uint32_t *base = st + (size_t)vh * tq_v_head_words(cw, cap);
        memcpy(base + (size_t)row * cw, codes, cw * 4);
        uint16_t *nh = (uint16_t *)(base + (size_t)cap * cw);
        nh[row] = (uint16_t)norms;
    }
}

static void tq_encode_cpu(const lmh_kernel_cpu_args *a, uint32_t first, uint32_t count) {
    for (uint32_t i = first; i < first + count && i < a->call->params[0]; i++) tq_encode_item(a, i);
}

/* ---- decode: params 0 items (rows x vheads), 1 kv heads, 2 hd, 3 m, 4 bits, 5 qjl
 * (the store has QJL signs), 6 keys, 7 first store row, 8 store rows (cap), 9 whether the
 * QJL term counts (qjl=off reads the same records without it). Tensors: store, f32 rows [n, kvh,
 * hd] (row r is store row first + r). A workgroup a block. ---- */
static void tq_decode_item(const lmh_kernel_cpu_args *a, uint32_t item) {
    const uint32_t *p = a->call->params;
    uint32_t kvh = p[1], hd = p[2], m = p[3], bits = p[4], qjl = p[5], keys = p[6];
    uint32_t nb = hd / m, vh_all = kvh * nb, r = item / vh_all, vh = item % vh_all;
    uint32_t h = vh / nb, blk = vh % nb, cap = p[8], row = p[7] + r;
    tq_tables t;
    tq_tables_for(&t, (int)m, (int)bits);
    uint32_t cw = bits * m / 32, sw = qjl ? m / 32 : 0, norms;
    const uint32_t *st = a->data[0], *codes, *signs = NULL;
    if (keys) {
        const uint32_t *base = st + (size_t)vh * cap * (cw + sw + 1);
        codes = base + (size_t)row * cw;
        if (sw) signs = base + (size_t)cap * cw + (size_t)row * sw;
        norms = base[(size_t)cap * (cw + sw) + row];
    } else {
        const uint32_t *base = st + (size_t)vh * tq_v_head_words(cw, cap);
        codes = base + (size_t)row * cw;
        norms = ((const uint16_t *)(base + (size_t)cap * cw))[row];
    }
    float *out = (float *)a->data[1] + ((size_t)r * kvh + h) * hd + blk * m;
    tq_decode(&t, codes, signs, norms, (int)(qjl && p[9]), out);
}

static void tq_decode_cpu(const lmh_kernel_cpu_args *a, uint32_t first, uint32_t count) {
    for (uint32_t i = first; i < first + count && i < a->call->params[0]; i++) tq_decode_item(a, i);
}

/* ---- move: params 0 items (words a head), 1 from, 2 to (word offsets in the first
 * head), 3 and 4 the source's and destination's words a head, 5 heads. Tensors: source,
 * destination. TQ_WG words (of every head) a workgroup. ---- */
static void tq_move_cpu(const lmh_kernel_cpu_args *a, uint32_t first, uint32_t count) {
    const uint32_t *p = a->call->params, *src = a->data[0];
    uint32_t *dst = a->data[1];
    uint64_t end = (uint64_t)(first + count) * TQ_WG;
    if (end > p[0]) end = p[0];
    uint32_t heads = p[5]; /* a workgroup copies its words of every head */
    for (uint32_t h = 0; h < heads; h++)
        for (uint64_t k = (uint64_t)first * TQ_WG; k < end; k++)
            dst[(uint64_t)p[2] + h * (uint64_t)p[4] + k] =
                src[(uint64_t)p[1] + h * (uint64_t)p[3] + k];
}

/* ---- attend: one decode query over a sequence's rows, a workgroup a K/V head and chunk
 * of rows (cold chunks first: rows [0, c0) of the stores; then hot ones: positions
 * [c0, pos) of the ring); each writes its partial (weighted values, max, sum) for
 * attend_merge. params 0 items (kvh x chunks), 1 heads, 2 kvh, 3 dk, 4 dv, 5 bits, 6 qjl,
 * 7 c0, 8 pos, 9 hcap, 10 cap, 11 scale and 12 soft-cap (f32 bits), 13 rows a chunk,
 * 14 cold chunks, 15 whether the QJL term counts. Tensors: q [1, heads, dk], keys, values, hot
 * keys, hot values, partials [heads, chunks, dv + 2]. The query sees every row (decode: its own
 * position is the last). ---- */

#define TQ_ATT_G    16  /* queries a K/V head, at most */
#define TQ_ATT_D    512 /* head size, at most */
#define TQ_ATT_ROWS 64  /* rows a block of the online softmax */

static inline int tq_block(int32_t hd) {
    return hd == 64 ? 64 : hd > 0 && hd % 128 == 0 ? 128 : 0;
}

/* A block's codes as their centroids */
static inline void tq_unpack(const uint32_t *codes, int bits, int m, const float *cb, float *out) {
    if (bits == 4) {
        for (int w = 0; w < m / 8; w++) {
            uint32_t v = codes[w];
            for (int j = 0; j < 8; j++) out[w * 8 + j] = cb[(v >> (4 * j)) & 15u];
        }
        return;
    }
    const uint8_t *b = (const uint8_t *)codes;
    for (int k = 0; k < m / 8; k++) {
        uint32_t v =
            (uint32_t)b[3 * k] | (uint32_t)b[3 * k + 1] << 8 | (uint32_t)b[3 * k + 2] << 16;
        for (int j = 0; j < 8; j++) out[k * 8 + j] = cb[(v >> (3 * j)) & 7u];
    }
}

static inline float tq_dot(const float *a, const float *b, int n) {
    float l[8] = {0};
    for (int i = 0; i < n; i += 8)
        for (int u = 0; u < 8; u++) l[u] += a[i + u] * b[i + u];
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

/* sum of +-a[i], + where bit i of s is set */
static inline float tq_signed_sum(const float *a, const uint32_t *s, int n) {
    float l[8] = {0};
    for (int i = 0; i < n; i += 8)
        for (int u = 0; u < 8; u++) {
            int k = i + u;
            l[u] += (s[k >> 5] >> (k & 31)) & 1u ? a[k] : -a[k];
        }
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define TQ_CLONES __attribute__((target_clones("avx2", "default")))
#define TQ_AVX2   __attribute__((target("avx2,fma")))

/* tq_unpack with AVX2: 8 codes at a time, their centroids from a register (permutevar) */
TQ_AVX2 static void tq_unpack_avx2(const uint32_t *codes, int bits, int m, const float *cb,
                                   float *out) {
    const __m256 lo = _mm256_loadu_ps(cb);
    if (bits == 4) {
        const __m256 hi = _mm256_loadu_ps(cb + 8);
        const __m256i sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
        for (int w = 0; w < m / 8; w++) {
            __m256i c = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)codes[w]), sh),
                                         _mm256_set1_epi32(15));
            __m256 a = _mm256_permutevar8x32_ps(lo, c), b = _mm256_permutevar8x32_ps(hi, c);
            __m256 up = _mm256_castsi256_ps(_mm256_cmpgt_epi32(c, _mm256_set1_epi32(7)));
            _mm256_storeu_ps(out + 8 * w, _mm256_blendv_ps(a, b, up));
        }
        return;
    }
    const __m256i sh = _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21);
    const uint8_t *b = (const uint8_t *)codes;
    for (int k = 0; k < m / 8; k++) {
        uint32_t v = (uint32_t)b[3 * k] | (uint32_t)b[3 * k + 1] << 8 | (uint32_t)b[3 * k + 2] << 16;
        __m256i c = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)v), sh),
                                     _mm256_set1_epi32(7));
        _mm256_storeu_ps(out + 8 * k, _mm256_permutevar8x32_ps(lo, c));
    }
}

/* tq_signed_sum with AVX2: a byte of signs selects 8 lanes */
TQ_AVX2 static float tq_signed_sum_avx2(const float *a, const uint32_t *s, int n) {
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const uint8_t *sb = (const uint8_t *)s;
    __m256 pos = _mm256_setzero_ps(), all = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) {
        __m256 x = _mm256_loadu_ps(a + i);
        __m256i m = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(sb[i / 8]), bit), bit);
        pos = _mm256_add_ps(pos, _mm256_and_ps(x, _mm256_castsi256_ps(m)));
        all = _mm256_add_ps(all, x);
    }
    __m256 r = _mm256_sub_ps(_mm256_add_ps(pos, pos), all);
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(r), _mm256_extractf128_ps(r, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}

/* f16 to f32 with F16C */
TQ_AVX2 __attribute__((target("f16c"))) static void tq_halfs_avx2(const uint16_t *h, float *out,
                                                                   int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    for (; i < n; i++) out[i] = tq_float(h[i]);
}

static int tq_avx2(void) {
    static int have = -1; /* a race here writes the same value */
    if (have < 0) {
        char simd[16] = ""; /* the CPU backend's choice of path (LMHOST_DEBUG simd) */
        lmh_debug_get("simd", simd, sizeof simd);
        have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("f16c") && strcmp(simd, "portable") != 0;
    }
    return have;
}
#define TQ_UNPACK(c, b, m, cb, o)                                                                  \
    (tq_avx2() ? tq_unpack_avx2(c, b, m, cb, o) : tq_unpack(c, b, m, cb, o))
#define TQ_SIGNED(a, s, n) (tq_avx2() ? tq_signed_sum_avx2(a, s, n) : tq_signed_sum(a, s, n))
#define TQ_HALFS(h, o, n)                                                                          \
    do {                                                                                           \
        if (tq_avx2())                                                                             \
            tq_halfs_avx2(h, o, n);                                                                \
        else                                                                                       \
            for (int i_ = 0; i_ < (n); i_++) (o)[i_] = tq_float((h)[i_]);                          \
    } while (0)
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#define TQ_CLONES

/* tq_unpack with NEON: a lane's centroid as 4 bytes looked up in the codebook's bytes */
static inline uint8x16_t tq_byte_index(uint32x4_t c) {
    return vreinterpretq_u8_u32(vaddq_u32(vmulq_n_u32(c, 0x04040404u), vdupq_n_u32(0x03020100u)));
}

static void tq_unpack_neon(const uint32_t *codes, int bits, int m, const float *cb, float *out) {
    const uint8_t *t = (const uint8_t *)cb;
    if (bits == 4) {
        uint8x16x4_t tab = {{vld1q_u8(t), vld1q_u8(t + 16), vld1q_u8(t + 32), vld1q_u8(t + 48)}};
        const int32_t sl[4] = {0, -4, -8, -12}, sh[4] = {-16, -20, -24, -28};
        for (int w = 0; w < m / 8; w++) {
            uint32x4_t v = vdupq_n_u32(codes[w]), k = vdupq_n_u32(15);
            uint32x4_t a = vandq_u32(vshlq_u32(v, vld1q_s32(sl)), k);
            uint32x4_t b = vandq_u32(vshlq_u32(v, vld1q_s32(sh)), k);
            vst1q_f32(out + 8 * w, vreinterpretq_f32_u8(vqtbl4q_u8(tab, tq_byte_index(a))));
            vst1q_f32(out + 8 * w + 4, vreinterpretq_f32_u8(vqtbl4q_u8(tab, tq_byte_index(b))));
        }
        return;
    }
    uint8x16x2_t tab = {{vld1q_u8(t), vld1q_u8(t + 16)}};
    const int32_t sl[4] = {0, -3, -6, -9}, sh[4] = {-12, -15, -18, -21};
    const uint8_t *b = (const uint8_t *)codes;
    for (int k = 0; k < m / 8; k++) {
        uint32_t v = (uint32_t)b[3 * k] | (uint32_t)b[3 * k + 1] << 8 | (uint32_t)b[3 * k + 2] << 16;
        uint32x4_t vv = vdupq_n_u32(v), s7 = vdupq_n_u32(7);
        uint32x4_t lo = vandq_u32(vshlq_u32(vv, vld1q_s32(sl)), s7);
        uint32x4_t hi = vandq_u32(vshlq_u32(vv, vld1q_s32(sh)), s7);
        vst1q_f32(out + 8 * k, vreinterpretq_f32_u8(vqtbl2q_u8(tab, tq_byte_index(lo))));
        vst1q_f32(out + 8 * k + 4, vreinterpretq_f32_u8(vqtbl2q_u8(tab, tq_byte_index(hi))));
    }
}

static float tq_signed_sum_neon(const float *a, const uint32_t *s, int n) {
    const uint32_t bl[4] = {1, 2, 4, 8}, bh[4] = {16, 32, 64, 128};
    const uint32x4_t lo = vld1q_u32(bl), hi = vld1q_u32(bh);
    const uint8_t *sb = (const uint8_t *)s;
    float32x4_t pos = vdupq_n_f32(0.0f), all = vdupq_n_f32(0.0f);
    for (int i = 0; i < n; i += 8) {
        uint32x4_t v = vdupq_n_u32(sb[i / 8]);
        float32x4_t x0 = vld1q_f32(a + i), x1 = vld1q_f32(a + i + 4);
        pos = vaddq_f32(pos, vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(x0),
                                                             vtstq_u32(v, lo))));
        pos = vaddq_f32(pos, vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(x1),
                                                             vtstq_u32(v, hi))));
        all = vaddq_f32(all, vaddq_f32(x0, x1));
    }
    return vaddvq_f32(vsubq_f32(vaddq_f32(pos, pos), all));
}

static int tq_neon(void) {
    static int have = -1;
    if (have < 0) {
        char simd[16] = "";
        lmh_debug_get("simd", simd, sizeof simd);
        have = strcmp(simd, "portable") != 0;
    }
    return have;
}
#define TQ_UNPACK(c, b, m, cb, o)                                                                  \
    (tq_neon() ? tq_unpack_neon(c, b, m, cb, o) : tq_unpack(c, b, m, cb, o))
#define TQ_SIGNED(a, s, n) (tq_neon() ? tq_signed_sum_neon(a, s, n) : tq_signed_sum(a, s, n))
#define TQ_HALFS(h, o, n)                                                                          \
    do {                                                                                           \
        for (int i_ = 0; i_ < (n); i_++) (o)[i_] = tq_float((h)[i_]);                              \
    } while (0)
#else
#define TQ_CLONES
#define TQ_UNPACK(c, b, m, cb, o) tq_unpack(c, b, m, cb, o)
#define TQ_SIGNED(a, s, n)        tq_signed_sum(a, s, n)
#define TQ_HALFS(h, o, n)                                                                          \
    do {                                                                                           \
        for (int i_ = 0; i_ < (n); i_++) (o)[i_] = tq_float((h)[i_]);                              \
    } while (0)
#endif

TQ_CLONES static void tq_attend_item(const lmh_kernel_cpu_args *a, uint32_t item) {
    const uint32_t *p = a->call->params;
    uint32_t heads = p[1], kvh = p[2], dk = p[3], dv = p[4], bits = p[5], qjl = p[6];
    uint32_t c0 = p[7], pos = p[8], hcap = p[9], cap = p[10], chunk = p[13], ncc = p[14];
    uint32_t nch = ncc + (pos - c0 + chunk - 1) / chunk, g = item / nch, ch = item % nch;
    uint32_t G = heads / kvh;
    float scale, softcap;
    memcpy(&scale, &p[11], 4);
    memcpy(&softcap, &p[12], 4);
    const float *q = a->data[0];
    int cold = ch < ncc;
    uint32_t first = cold ? ch * chunk : c0 + (ch - ncc) * chunk;
    uint32_t last = cold ? (first + chunk < c0 ? first + chunk : c0)
                         : (first + chunk < pos ? first + chunk : pos);
    int mk = tq_block((int32_t)dk), mv = tq_block((int32_t)dv);
    tq_tables tk, tv;
    tq_tables_for(&tk, mk ? mk : 128, (int)bits);
    tq_tables_for(&tv, mv ? mv : 128, (int)bits);
    uint32_t nbk = mk ? dk / (uint32_t)mk : 0, nbv = mv ? dv / (uint32_t)mv : 0;
    /* the queries, rotated once (cold chunks); kept as they are for hot ones */
    static _Thread_local float qr[TQ_ATT_G][TQ_ATT_D], qp[TQ_ATT_G][TQ_ATT_D];
    static _Thread_local float acc[TQ_ATT_G][TQ_ATT_D], sp[TQ_ATT_G][TQ_ATT_ROWS];
    float m_[TQ_ATT_G], l_[TQ_ATT_G];
    const int use_qjl = qjl && p[15];
    for (uint32_t h = 0; h < G; h++) {
        const float *qh = q + (size_t)(g * G + h) * dk;
        memcpy(qr[h], qh, dk * 4);
        if (cold)
            for (uint32_t b = 0; b < nbk; b++) {
                TQ_R_FWD(&tk, qr[h] + b * mk);
                if (use_qjl) {
                    memcpy(qp[h] + b * mk, qh + b * mk, (size_t)mk * 4);
                    TQ_P_FWD(&tk, qp[h] + b * mk);
                }
            }
        m_[h] = -INFINITY;
        l_[h] = 0.0f;
        memset(acc[h], 0, dv * 4);
    }
    const uint32_t *ks = a->data[1], *vs = a->data[2];
    const uint16_t *hk = a->data[3], *hv = a->data[4];
    uint32_t cwk = bits * (uint32_t)tk.m / 32, swk = qjl ? (uint32_t)tk.m / 32 : 0;
    uint32_t cwv = bits * (uint32_t)tv.m / 32;
    float row[TQ_ATT_D];
    for (uint32_t r0 = first; r0 < last; r0 += TQ_ATT_ROWS) {
        uint32_t rows = last - r0 < TQ_ATT_ROWS ? last - r0 : TQ_ATT_ROWS;
        for (uint32_t t = 0; t < rows; t++) {
            uint32_t j = r0 + t;
            if (cold) {
                float sc[TQ_ATT_G] = {0};
                for (uint32_t b = 0; b < nbk; b++) {
                    const uint32_t *base = ks + (size_t)(g * nbk + b) * cap * (cwk + swk + 1);
                    uint32_t nw = base[(size_t)cap * (cwk + swk) + j];
                    float n = tq_float((uint16_t)(nw & 0xffffu));
                    TQ_UNPACK(base + (size_t)j * cwk, (int)bits, tk.m, tk.c, row);
                    const uint32_t *sg = base + (size_t)cap * cwk + (size_t)j * swk;
                    float gk = use_qjl ? tq_float((uint16_t)(nw >> 16)) * tk.kappa : 0.0f;
                    for (uint32_t h = 0; h < G; h++) {
                        float s = tq_dot(qr[h] + b * mk, row, tk.m);
                        if (use_qjl) s += gk * TQ_SIGNED(qp[h] + b * mk, sg, tk.m);
                        sc[h] += n * s;
                    }
                }
                for (uint32_t h = 0; h < G; h++) sp[h][t] = sc[h];
            } else {
                const uint16_t *kr = hk + ((size_t)(j % hcap) * kvh + g) * dk;
                TQ_HALFS(kr, row, (int)dk);
                for (uint32_t h = 0; h < G; h++) sp[h][t] = tq_dot(qr[h], row, (int)dk);
            }
            for (uint32_t h = 0; h < G; h++) {
                float s = sp[h][t] * scale;
                sp[h][t] = softcap > 0.0f ? softcap * tanhf(s / softcap) : s;
            }
        }
        for (uint32_t h = 0; h < G; h++) {
            float mn = m_[h];
            for (uint32_t t = 0; t < rows; t++) mn = fmaxf(mn, sp[h][t]);
            float al = mn == -INFINITY ? 1.0f : expf(m_[h] - mn);
            l_[h] *= al;
            for (uint32_t i = 0; i < dv; i++) acc[h][i] *= al;
            for (uint32_t t = 0; t < rows; t++) {
                float e = expf(sp[h][t] - mn);
                sp[h][t] = e;
                l_[h] += e;
            }
            m_[h] = mn;
        }
        for (uint32_t t = 0; t < rows; t++) {
            uint32_t j = r0 + t;
            if (cold) {
                for (uint32_t b = 0; b < nbv; b++) {
                    const uint32_t *base = vs + (size_t)(g * nbv + b) * tq_v_head_words(cwv, cap);
                    float s = tq_float(((const uint16_t *)(base + (size_t)cap * cwv))[j]);
                    TQ_UNPACK(base + (size_t)j * cwv, (int)bits, tv.m, tv.c, row);
                    for (uint32_t h = 0; h < G; h++) {
                        float w = sp[h][t] * s, *ah = acc[h] + b * mv;
                        for (int i = 0; i < tv.m; i++) ah[i] += w * row[i];
                    }
                }
            } else {
                const uint16_t *vr = hv + ((size_t)(j % hcap) * kvh + g) * dv;
                TQ_HALFS(vr, row, (int)dv);
                for (uint32_t h = 0; h < G; h++) {
                    float w = sp[h][t];
                    for (uint32_t i = 0; i < dv; i++) acc[h][i] += w * row[i];
                }
            }
        }
    }
    float *part = a->data[5];
    for (uint32_t h = 0; h < G; h++) {
        if (cold) /* back from the rotated basis, once a chunk */
            for (uint32_t b = 0; b < nbv; b++) TQ_R_INV(&tv, acc[h] + b * mv);
        float *o = part + ((size_t)(g * G + h) * nch + ch) * (dv + 2);
        memcpy(o, acc[h], dv * 4);
        o[dv] = m_[h];
        o[dv + 1] = l_[h];
    }
}

static void tq_attend_cpu(const lmh_kernel_cpu_args *a, uint32_t first, uint32_t count) {
    for (uint32_t i = first; i < first + count && i < a->call->params[0]; i++) tq_attend_item(a, i);
}

/* ---- attend_merge: params 0 items (heads), 1 chunks, 2 dv, 3 whether there are sinks.
 * Tensors: partials, out [1, heads, dv], the sinks f32 [heads] (ABI 1.10 attention sinks:
 * each head's joins its denominator). A workgroup a head. ---- */
static void tq_merge_cpu(const lmh_kernel_cpu_args *a, uint32_t first, uint32_t count) {
    const uint32_t *p = a->call->params;
    const float *part = a->data[0];
    float *out = a->data[1];
    const float *sinks = p[3] ? a->data[2] : NULL;
    uint32_t nch = p[1], dv = p[2];
    float w[1024]; /* a chunk's weight (chunks are at most ATT_MAXCH, cache_tq.c) */
    for (uint32_t h = first; h < first + count && h < p[0]; h++) {
        const float *b = part + (size_t)h * nch * (dv + 2);
        float m = -INFINITY, l = 0.0f;
        for (uint32_t c = 0; c < nch; c++)
            if (b[c * (dv + 2) + dv + 1] > 0.0f) m = fmaxf(m, b[c * (dv + 2) + dv]);
        for (uint32_t c = 0; c < nch && c < 1024; c++) {
            const float *pc = b + c * (dv + 2);
            w[c] = pc[dv + 1] > 0.0f ? expf(pc[dv] - m) : 0.0f;
            l += pc[dv + 1] * w[c];
        }
        if (sinks) l += expf(sinks[h] - m);
        for (uint32_t i = 0; i < dv; i++) {
            float acc = 0.0f;
            for (uint32_t c = 0; c < nch && c < 1024; c++)
                if (w[c] != 0.0f) acc += b[c * (dv + 2) + i] * w[c];
            out[(size_t)h * dv + i] = acc / l;
        }
    }
}

#endif
