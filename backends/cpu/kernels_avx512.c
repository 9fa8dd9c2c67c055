/* AVX-512 inner loops (x86-64; built with -mavx512f -mavx512bw -mavx512vl -mfma -mf16c,
 * picked at run time by kernels_select.c).
 *
 * Same plan as the AVX2 file, 16 lanes wide: R x O register tiles of accumulators along
 * k, decode straight over the weights, prefill over f32 blocks of weight rows in L1. The
 * part of k past the last full vector is one masked step (masked-off lanes are neither
 * read nor faulted), so there is no scalar tail in the matmul. */
#include "kernels.h"
#include "reduce_avx512.h"

#include <immintrin.h>
#include <math.h>
#include <stdalign.h>

#define VW 16  /* floats per vector */
#define TR 6   /* x rows per tile: 6x4 accumulators + 4 weights + 1 x = 29 zmm */
#define TO 4   /* weight rows per tile */
#define TD 8   /* weight rows per decode step */
#define OC 16  /* weight rows per prefill block */
#define KC 512 /* k per prefill block (a multiple of VW) */

#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")

INLINE __mmask16 tail_mask(int64_t n) {
    return (__mmask16)((1u << n) - 1);
}

INLINE __m512 ld_f32(const float *p) {
    return _mm512_loadu_ps(p);
}
INLINE __m512 ld_f16(const uint16_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)p));
}
/* bf16 is the top half of an f32: zero-extend to 32 bits and shift into place. */
INLINE __m512 ld_bf16(const uint16_t *p) {
    __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}
/* The first n (< VW) elements, zeros after. */
INLINE __m512 ldm_f32(const float *p, int64_t n) {
    return _mm512_maskz_loadu_ps(tail_mask(n), p);
}
INLINE __m512 ldm_f16(const uint16_t *p, int64_t n) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(tail_mask(n), p));
}
INLINE __m512 ldm_bf16(const uint16_t *p, int64_t n) {
    __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(tail_mask(n), p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

/* The reductions every AVX-512 path shares (reduce_avx512.h). */
#define hsum4 cpu_hsum4_512
#define hsum  cpu_hsum_512

/* y[r * ldy + o] (+)= horizontal sums of acc[r][o]. */
INLINE void tile_store(int R, int O, __m512 acc[TR][TO], float *y, int64_t ldy, int add) {
    UNROLL for (int r = 0; r < R; r++) {
        float *yr = y + r * ldy;
        if (O == 4) {
            __m128 s = hsum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
            if (add) s = _mm_add_ps(s, _mm_loadu_ps(yr));
            _mm_storeu_ps(yr, s);
        } else {
            UNROLL for (int o = 0; o < O; o++) {
                float s = hsum(acc[r][o]);
                yr[o] = add ? yr[o] + s : s;
            }
        }
    }
}

/* One R x O tile over k in [0, kc), any kc. R and O are constants after inlining, so acc
 * lives in registers. */
#define DEFINE_TILE(T, WT)                                                                         \
    INLINE void tile_##T(int R, int O, const float *x, int64_t ldx, const WT *w, int64_t ldw,      \
                         int64_t kc, float *y, int64_t ldy, int add) {                             \
        __m512 acc[TR][TO];                                                                        \
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int o = 0; o < O; o++) acc[r][o] =          \
            _mm512_setzero_ps();                                                                   \
        int64_t k = 0;                                                                             \
        for (; k + VW <= kc; k += VW) {                                                            \
            __m512 wv[TO];                                                                         \
            UNROLL for (int o = 0; o < O; o++) wv[o] = ld_##T(w + o * ldw + k);                    \
            UNROLL for (int r = 0; r < R; r++) {                                                   \
                const __m512 xv = _mm512_loadu_ps(x + r * ldx + k);                                \
                UNROLL for (int o = 0; o < O; o++) acc[r][o] =                                     \
                    _mm512_fmadd_ps(xv, wv[o], acc[r][o]);                                         \
            }                                                                                      \
        }                                                                                          \
        if (k < kc) {                                                                              \
            __m512 wv[TO];                                                                         \
            UNROLL for (int o = 0; o < O; o++) wv[o] = ldm_##T(w + o * ldw + k, kc - k);           \
            UNROLL for (int r = 0; r < R; r++) {                                                   \
                const __m512 xv = ldm_f32(x + r * ldx + k, kc - k);                                \
                UNROLL for (int o = 0; o < O; o++) acc[r][o] =                                     \
                    _mm512_fmadd_ps(xv, wv[o], acc[r][o]);                                         \
            }                                                                                      \
        }                                                                                          \
        tile_store(R, O, acc, y, ldy, add);                                                        \
    }                                                                                              \
    /* Any R in 1..TR, O in 1..TO, through a switch onto constant instances. */                    \
    static void tile_any_##T(int R, int O, const float *x, int64_t ldx, const WT *w, int64_t ldw,  \
                             int64_t kc, float *y, int64_t ldy, int add) {                         \
        switch (R * 8 + O) {                                                                       \
            TILE_CASES(T, 1)                                                                       \
            TILE_CASES(T, 2)                                                                       \
            TILE_CASES(T, 3)                                                                       \
            TILE_CASES(T, 4)                                                                       \
            TILE_CASES(T, 5)                                                                       \
            TILE_CASES(T, 6)                                                                       \
        default:                                                                                   \
            break;                                                                                 \
        }                                                                                          \
    }

#define TILE_CASE(T, R, O)                                                                         \
    case R * 8 + O:                                                                                \
        tile_##T(R, O, x, ldx, w, ldw, kc, y, ldy, add);                                           \
        break;
#define TILE_CASES(T, R) TILE_CASE(T, R, 1) TILE_CASE(T, R, 2) TILE_CASE(T, R, 3) TILE_CASE(T, R, 4)

DEFINE_TILE(f32, float)
DEFINE_TILE(f16, uint16_t)
DEFINE_TILE(bf16, uint16_t)

/* Decode (n = 1): O weight rows against one x, O accumulators, so O weight streams are in
 * flight and the loop is bound by memory bandwidth, not by FMA latency. k is summed in
 * blocks of KC exactly as the prefill tiles sum it (lane-wise along k, one horizontal sum
 * per block, blocks added in order), so a row's result is the same bits whether it was
 * decoded alone or computed in a batch: batch invariance. */
#define DEFINE_MV(T, WT)                                                                           \
    INLINE void mv_##T(int O, const float *x, const WT *w, int64_t k_dim, float *y) {              \
        for (int64_t kb = 0; kb < k_dim; kb += KC) {                                               \
            const int64_t ke = k_dim - kb < KC ? k_dim : kb + KC;                                  \
            __m512 a[TD];                                                                          \
            UNROLL for (int o = 0; o < O; o++) a[o] = _mm512_setzero_ps();                         \
            int64_t k = kb;                                                                        \
            for (; k + VW <= ke; k += VW) {                                                        \
                const __m512 xv = _mm512_loadu_ps(x + k);                                          \
                UNROLL for (int o = 0; o < O; o++) a[o] =                                          \
                    _mm512_fmadd_ps(xv, ld_##T(w + o * k_dim + k), a[o]);                          \
            }                                                                                      \
            if (k < ke) {                                                                          \
                const __m512 xv = ldm_f32(x + k, ke - k);                                          \
                UNROLL for (int o = 0; o < O; o++) a[o] =                                          \
                    _mm512_fmadd_ps(xv, ldm_##T(w + o * k_dim + k, ke - k), a[o]);                 \
            }                                                                                      \
            int o = 0;                                                                             \
            UNROLL for (; o + 4 <= O; o += 4) {                                                    \
                __m128 s = hsum4(a[o], a[o + 1], a[o + 2], a[o + 3]);                              \
                if (kb > 0) s = _mm_add_ps(s, _mm_loadu_ps(y + o));                                \
                _mm_storeu_ps(y + o, s);                                                           \
            }                                                                                      \
            UNROLL for (; o < O; o++) {                                                            \
                float s = hsum(a[o]);                                                              \
                y[o] = kb > 0 ? y[o] + s : s;                                                      \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
    static void matvec_##T(const float *x, int64_t k_dim, const WT *w, int64_t o0, int64_t o1,     \
                           float *y) {                                                             \
        int64_t o = o0;                                                                            \
        for (; o + TD <= o1; o += TD) mv_##T(TD, x, w + o * k_dim, k_dim, y + o);                  \
        for (; o + 4 <= o1; o += 4) mv_##T(4, x, w + o * k_dim, k_dim, y + o);                     \
        switch (o1 - o) {                                                                          \
        case 3:                                                                                    \
            mv_##T(3, x, w + o * k_dim, k_dim, y + o);                                             \
            break;                                                                                 \
        case 2:                                                                                    \
            mv_##T(2, x, w + o * k_dim, k_dim, y + o);                                             \
            break;                                                                                 \
        case 1:                                                                                    \
            mv_##T(1, x, w + o * k_dim, k_dim, y + o);                                             \
            break;                                                                                 \
        default:                                                                                   \
            break;                                                                                 \
        }                                                                                          \
    }

DEFINE_MV(f32, float)
DEFINE_MV(f16, uint16_t)
DEFINE_MV(bf16, uint16_t)

/* A block of `rows` weight rows by kc of k made f32 into buf (KC apart, zero-padded to
 * whole vectors) for the prefill loop. f32 is copied too: rows of a large matrix are a
 * multiple of 4 KiB apart and would fight over the same L1 sets. */
#define DEFINE_BLOCK(T, WT)                                                                        \
    static void block_##T(const WT *w, int64_t k_dim, int64_t rows, int64_t kc, float *buf) {      \
        for (int64_t i = 0; i < rows; i++) {                                                       \
            int64_t k = 0;                                                                         \
            for (; k + VW <= kc; k += VW)                                                          \
                _mm512_store_ps(buf + i * KC + k, ld_##T(w + i * k_dim + k));                      \
            if (k < kc) _mm512_store_ps(buf + i * KC + k, ldm_##T(w + i * k_dim + k, kc - k));     \
        }                                                                                          \
    }

DEFINE_BLOCK(f32, float)
DEFINE_BLOCK(f16, uint16_t)
DEFINE_BLOCK(bf16, uint16_t)

#define DEFINE_MATMUL(T, WT)                                                                       \
    static void matmul_##T(const float *x, int64_t n, int64_t k_dim, const WT *w, int64_t o0,      \
                           int64_t o1, float *y, int64_t ldy) {                                    \
        if (n <= 0 || o1 <= o0) return;                                                            \
        if (n == 1) {                                                                              \
            matvec_##T(x, k_dim, w, o0, o1, y);                                                    \
            return;                                                                                \
        }                                                                                          \
        if (n <= TR) {                                                                             \
            /* A few rows: each weight is used n times only, convert it in registers (k in         \
             * blocks of KC, as everywhere, for batch invariance). */                              \
            for (int64_t kb = 0; kb < k_dim; kb += KC) {                                           \
                const int64_t kc = k_dim - kb < KC ? k_dim - kb : KC;                              \
                for (int64_t o = o0; o < o1; o += TO)                                              \
                    tile_any_##T((int)n, o1 - o < TO ? (int)(o1 - o) : TO, x + kb, k_dim,          \
                                 w + o * k_dim + kb, k_dim, kc, y + o, ldy, kb > 0);               \
            }                                                                                      \
            return;                                                                                \
        }                                                                                          \
        alignas(64) float buf[OC * KC];                                                            \
        for (int64_t ob = o0; ob < o1; ob += OC) {                                                 \
            const int64_t oc = o1 - ob < OC ? o1 - ob : OC;                                        \
            for (int64_t kb = 0; kb < k_dim; kb += KC) {                                           \
                const int64_t kc = k_dim - kb < KC ? k_dim - kb : KC;                              \
                block_##T(w + ob * k_dim + kb, k_dim, oc, kc, buf);                                \
                for (int64_t r = 0; r < n; r += TR) {                                              \
                    const int rn = n - r < TR ? (int)(n - r) : TR;                                 \
                    for (int64_t o = 0; o < oc; o += TO)                                           \
                        tile_any_f32(rn, oc - o < TO ? (int)(oc - o) : TO, x + r * k_dim + kb,     \
                                     k_dim, buf + o * KC, KC, kc, y + r * ldy + ob + o, ldy,       \
                                     kb > 0);                                                      \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }

DEFINE_MATMUL(f32, float)
DEFINE_MATMUL(f16, uint16_t)
DEFINE_MATMUL(bf16, uint16_t)

/* ---- dot, axpy ---- */

#define DEFINE_DOT(T, WT)                                                                          \
    static float dot_##T(const float *a, const WT *b, int64_t n) {                                 \
        __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;                                \
        int64_t i = 0;                                                                             \
        for (; i + 4 * VW <= n; i += 4 * VW) {                                                     \
            s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), ld_##T(b + i), s0);                       \
            s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + VW), ld_##T(b + i + VW), s1);             \
            s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 2 * VW), ld_##T(b + i + 2 * VW), s2);     \
            s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 3 * VW), ld_##T(b + i + 3 * VW), s3);     \
        }                                                                                          \
        for (; i + VW <= n; i += VW)                                                               \
            s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), ld_##T(b + i), s0);                       \
        if (i < n) s1 = _mm512_fmadd_ps(ldm_f32(a + i, n - i), ldm_##T(b + i, n - i), s1);         \
        return hsum(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));                  \
    }                                                                                              \
    static void axpy_##T(float *y, float a, const WT *x, int64_t n) {                              \
        const __m512 av = _mm512_set1_ps(a);                                                       \
        int64_t i = 0;                                                                             \
        for (; i + 2 * VW <= n; i += 2 * VW) {                                                     \
            _mm512_storeu_ps(y + i, _mm512_fmadd_ps(av, ld_##T(x + i), _mm512_loadu_ps(y + i)));   \
            _mm512_storeu_ps(                                                                      \
                y + i + VW, _mm512_fmadd_ps(av, ld_##T(x + i + VW), _mm512_loadu_ps(y + i + VW))); \
        }                                                                                          \
        for (; i + VW <= n; i += VW)                                                               \
            _mm512_storeu_ps(y + i, _mm512_fmadd_ps(av, ld_##T(x + i), _mm512_loadu_ps(y + i)));   \
        if (i < n)                                                                                 \
            _mm512_mask_storeu_ps(                                                                 \
                y + i, tail_mask(n - i),                                                           \
                _mm512_fmadd_ps(av, ldm_##T(x + i, n - i), ldm_f32(y + i, n - i)));                \
    }

DEFINE_DOT(f32, float)
DEFINE_DOT(f16, uint16_t)

static void axpby_f32(float *y, float a, float b, const float *x, int64_t n) {
    const __m512 av = _mm512_set1_ps(a), bv = _mm512_set1_ps(b);
    int64_t i = 0;
    for (; i + VW <= n; i += VW)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(bv, _mm512_loadu_ps(x + i),
                                                _mm512_mul_ps(av, _mm512_loadu_ps(y + i))));
    if (i < n)
        _mm512_mask_storeu_ps(
            y + i, tail_mask(n - i),
            _mm512_fmadd_ps(bv, ldm_f32(x + i, n - i), _mm512_mul_ps(av, ldm_f32(y + i, n - i))));
}
DEFINE_DOT(bf16, uint16_t)

/* ---- attention (kernels.h: attn_*) ---- */

/* Keys this far ahead of the one being scored are asked for early: a block's K rows are a
 * kv head's slice of each cache row, kv_heads slices apart, which the hardware stream
 * prefetchers follow poorly. */
#define ATT_PF 8

/* GN heads x KN keys of scores (KN keys' rows against GN query vectors), any d: the part
 * past the last full vector is one masked step. Each score has an accumulator of its own
 * and the same reduction tree, so it does not depend on GN, KN or its place in a block. */
#define DEFINE_ATTN(T, WT)                                                                         \
    INLINE void sc_tile_##T(int GN, int KN, const float *q, int64_t d, const WT *k, int64_t ldk,   \
                            float scale, float *s, int64_t lds) {                                  \
        __m512 acc[4][4];                                                                          \
        UNROLL for (int g = 0; g < 4; g++) UNROLL for (int j = 0; j < 4; j++) acc[g][j] =          \
            _mm512_setzero_ps();                                                                   \
        int64_t kk = 0;                                                                            \
        for (; kk + VW <= d; kk += VW) {                                                           \
            __m512 kv[4];                                                                          \
            UNROLL for (int j = 0; j < KN; j++) kv[j] = ld_##T(k + j * ldk + kk);                  \
            UNROLL for (int g = 0; g < GN; g++) {                                                  \
                const __m512 qv = _mm512_loadu_ps(q + g * d + kk);                                 \
                UNROLL for (int j = 0; j < KN; j++) acc[g][j] =                                    \
                    _mm512_fmadd_ps(qv, kv[j], acc[g][j]);                                         \
            }                                                                                      \
        }                                                                                          \
        if (kk < d) {                                                                              \
            __m512 kv[4];                                                                          \
            UNROLL for (int j = 0; j < KN; j++) kv[j] = ldm_##T(k + j * ldk + kk, d - kk);         \
            UNROLL for (int g = 0; g < GN; g++) {                                                  \
                const __m512 qv = ldm_f32(q + g * d + kk, d - kk);                                 \
                UNROLL for (int j = 0; j < KN; j++) acc[g][j] =                                    \
                    _mm512_fmadd_ps(qv, kv[j], acc[g][j]);                                         \
            }                                                                                      \
        }                                                                                          \
        const __m128 sv = _mm_set1_ps(scale);                                                      \
        UNROLL for (int g = 0; g < GN; g++) {                                                      \
            const __m128 r = _mm_mul_ps(hsum4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]), sv);    \
            if (KN == 4)                                                                           \
                _mm_storeu_ps(s + g * lds, r);                                                     \
            else                                                                                   \
                s[g * lds] = _mm_cvtss_f32(r);                                                     \
        }                                                                                          \
    }                                                                                              \
    static void attn_scores_##T(const float *q, int G, int64_t d, const WT *K, int64_t ldk,        \
                                int64_t n, float scale, float *s, int64_t lds) {                   \
        const int64_t lines = ((int64_t)sizeof(WT) * d + 63) / 64;                                 \
        int64_t i = 0;                                                                             \
        for (; i + 4 <= n; i += 4) {                                                               \
            for (int64_t j = i + ATT_PF; j < i + ATT_PF + 4 && j < n; j++)                         \
                for (int64_t l = 0; l < lines; l++)                                                \
                    _mm_prefetch((const char *)(K + j * ldk) + 64 * l, _MM_HINT_T0);               \
            for (int g = 0; g < G; g += 4) {                                                       \
                const float *qg = q + g * d;                                                       \
                float *sg = s + g * lds + i;                                                       \
                switch (G - g < 4 ? G - g : 4) {                                                   \
                case 1:                                                                            \
                    sc_tile_##T(1, 4, qg, d, K + i * ldk, ldk, scale, sg, lds);                    \
                    break;                                                                         \
                case 2:                                                                            \
                    sc_tile_##T(2, 4, qg, d, K + i * ldk, ldk, scale, sg, lds);                    \
                    break;                                                                         \
                case 3:                                                                            \
                    sc_tile_##T(3, 4, qg, d, K + i * ldk, ldk, scale, sg, lds);                    \
                    break;                                                                         \
                default:                                                                           \
                    sc_tile_##T(4, 4, qg, d, K + i * ldk, ldk, scale, sg, lds);                    \
                    break;                                                                         \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        for (; i < n; i++)                                                                         \
            for (int g = 0; g < G; g++)                                                            \
                sc_tile_##T(1, 1, q + g * d, d, K + i * ldk, ldk, scale, s + g * lds + i, lds);    \
    }                                                                                              \
    /* GN heads x NV vectors of dv (the last one `rem` lanes) over n keys, o kept in registers     \
     * from the first key to the last. */                                                          \
    INLINE void val_tile_##T(int GN, int NV, const float *p, int64_t lds, const WT *v,             \
                             int64_t ldv, int64_t n, int64_t rem, float *o, int64_t dv) {          \
        __m512 acc[4][4];                                                                          \
        UNROLL for (int g = 0; g < GN; g++) UNROLL for (int c = 0; c < NV; c++) acc[g][c] =        \
            c == NV - 1 ? ldm_f32(o + g * dv + c * VW, rem) : ld_f32(o + g * dv + c * VW);         \
        const int64_t lines = ((int64_t)sizeof(WT) * ((NV - 1) * VW + rem) + 63) / 64;             \
        for (int64_t i = 0; i < n; i++) {                                                          \
            if (i + ATT_PF < n)                                                                    \
                for (int64_t l = 0; l < lines; l++)                                                \
                    _mm_prefetch((const char *)(v + (i + ATT_PF) * ldv) + 64 * l, _MM_HINT_T0);    \
            __m512 x[4];                                                                           \
            UNROLL for (int c = 0; c < NV; c++) x[c] =                                             \
                c == NV - 1 ? ldm_##T(v + i * ldv + c * VW, rem) : ld_##T(v + i * ldv + c * VW);   \
            UNROLL for (int g = 0; g < GN; g++) {                                                  \
                const __m512 pb = _mm512_set1_ps(p[g * lds + i]);                                  \
                UNROLL for (int c = 0; c < NV; c++) acc[g][c] =                                    \
                    _mm512_fmadd_ps(pb, x[c], acc[g][c]);                                          \
            }                                                                                      \
        }                                                                                          \
        UNROLL for (int g = 0; g < GN; g++) UNROLL for (int c = 0; c < NV; c++) {                  \
            if (c == NV - 1)                                                                       \
                _mm512_mask_storeu_ps(o + g * dv + c * VW, tail_mask(rem), acc[g][c]);             \
            else                                                                                   \
                _mm512_storeu_ps(o + g * dv + c * VW, acc[g][c]);                                  \
        }                                                                                          \
    }                                                                                              \
    static void attn_values_##T(const float *p, int G, int64_t lds, const WT *V, int64_t ldv,      \
                                int64_t n, int64_t dv, float *o) {                                 \
        for (int64_t j = 0; j < dv; j += 4 * VW) {                                                 \
            const int64_t w = dv - j < 4 * VW ? dv - j : 4 * VW;                                   \
            const int nv = (int)((w + VW - 1) / VW);                                               \
            const int64_t rem = w - (nv - 1) * VW;                                                 \
            for (int g = 0; g < G; g += 4) {                                                       \
                const int gn = G - g < 4 ? G - g : 4;                                              \
                const float *pg = p + g * lds;                                                     \
                float *og = o + g * dv + j;                                                        \
                switch (gn * 8 + nv) {                                                             \
                    VAL_CASES(T, 1)                                                                \
                    VAL_CASES(T, 2)                                                                \
                    VAL_CASES(T, 3)                                                                \
                    VAL_CASES(T, 4)                                                                \
                default:                                                                           \
                    break;                                                                         \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }

#define VAL_CASE(T, GN, NV)                                                                        \
    case GN * 8 + NV:                                                                              \
        val_tile_##T(GN, NV, pg, lds, V + j, ldv, n, rem, og, dv);                                 \
        break;
#define VAL_CASES(T, GN) VAL_CASE(T, GN, 1) VAL_CASE(T, GN, 2) VAL_CASE(T, GN, 3) VAL_CASE(T, GN, 4)

DEFINE_ATTN(f32, float)
DEFINE_ATTN(f16, uint16_t)
DEFINE_ATTN(bf16, uint16_t)

/* exp(x) for x <= 88: x = n ln2 + r with |r| <= ln2 / 2 (ln2 in two parts, so r is exact
 * enough), e^r by its Taylor series to r^7 (error below 1e-8 there), times 2^n by scalef
 * (which also takes very negative n to 0; x is clamped first, so -inf gives 0). */
INLINE __m512 exp_512(__m512 x) {
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.0f)), _mm512_set1_ps(-104.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504089f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 e = _mm512_set1_ps(1.0f / 5040);
    e = _mm512_fmadd_ps(e, r, _mm512_set1_ps(1.0f / 720));
    e = _mm512_fmadd_ps(e, r, _mm512_set1_ps(1.0f / 120));
    e = _mm512_fmadd_ps(e, r, _mm512_set1_ps(1.0f / 24));
    e = _mm512_fmadd_ps(e, r, _mm512_set1_ps(1.0f / 6));
    e = _mm512_fmadd_ps(e, r, _mm512_set1_ps(0.5f));
    e = _mm512_fmadd_ps(e, r, _mm512_set1_ps(1.0f));
    e = _mm512_fmadd_ps(e, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(e, n);
}

static float attn_softmax(float *s, int64_t n, float cap, float *mx) {
    if (cap > 0)
        for (int64_t i = 0; i < n; i++) s[i] = cap * tanhf(s[i] / cap);
    __m512 m = _mm512_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + VW <= n; i += VW) m = _mm512_max_ps(m, _mm512_loadu_ps(s + i));
    if (i < n) m = _mm512_mask_max_ps(m, tail_mask(n - i), m, ldm_f32(s + i, n - i));
    const float M = _mm512_reduce_max_ps(m);
    *mx = M;
    const __m512 mv = _mm512_set1_ps(M);
    __m512 acc = _mm512_setzero_ps();
    for (i = 0; i + VW <= n; i += VW) {
        const __m512 e = exp_512(_mm512_sub_ps(_mm512_loadu_ps(s + i), mv));
        _mm512_storeu_ps(s + i, e);
        acc = _mm512_add_ps(acc, e);
    }
    if (i < n) {
        const __mmask16 t = tail_mask(n - i);
        const __m512 e = exp_512(_mm512_sub_ps(ldm_f32(s + i, n - i), mv));
        _mm512_mask_storeu_ps(s + i, t, e);
        acc = _mm512_mask_add_ps(acc, t, acc, e);
    }
    return hsum(acc);
}

/* ---- conversions ---- */

static void cvt_f16_to_f32(const uint16_t *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + VW <= n; i += VW) _mm512_storeu_ps(y + i, ld_f16(x + i));
    if (i < n) _mm512_mask_storeu_ps(y + i, tail_mask(n - i), ldm_f16(x + i, n - i));
}

static void cvt_bf16_to_f32(const uint16_t *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + VW <= n; i += VW) _mm512_storeu_ps(y + i, ld_bf16(x + i));
    if (i < n) _mm512_mask_storeu_ps(y + i, tail_mask(n - i), ldm_bf16(x + i, n - i));
}

static void cvt_f32_to_f16(const float *x, uint16_t *y, int64_t n) {
    int64_t i = 0;
    for (; i + VW <= n; i += VW)
        _mm256_storeu_si256((__m256i *)(void *)(y + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    if (i < n)
        _mm256_mask_storeu_epi16(y + i, tail_mask(n - i),
                                 _mm512_cvtps_ph(ldm_f32(x + i, n - i), _MM_FROUND_TO_NEAREST_INT));
}

/* Round to nearest even on the bits; NaN keeps its sign and top payload, made quiet. */
INLINE __m256i to_bf16(__m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
    r = _mm512_srli_epi32(r, 16);
    const __m512i q = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    r = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), r, q);
    return _mm512_cvtepi32_epi16(r);
}

static void cvt_f32_to_bf16(const float *x, uint16_t *y, int64_t n) {
    int64_t i = 0;
    for (; i + VW <= n; i += VW)
        _mm256_storeu_si256((__m256i *)(void *)(y + i), to_bf16(_mm512_loadu_ps(x + i)));
    if (i < n) _mm256_mask_storeu_epi16(y + i, tail_mask(n - i), to_bf16(ldm_f32(x + i, n - i)));
}

/* The multiply-add probe (cpu_kernels.fma_loop): FMA_ACC independent chains, more than
 * the FMA units' count times their latency (2 x 4 cycles on cores with two). */
#define FMA_ACC 12
static float fma_loop(int64_t iters, float m, float c) {
    __m512 acc[FMA_ACC], vm = _mm512_set1_ps(m), vc = _mm512_set1_ps(c);
    for (int j = 0; j < FMA_ACC; j++) acc[j] = _mm512_set1_ps((float)j);
    for (int64_t i = 0; i < iters; i++) {
#pragma GCC unroll 16
        for (int j = 0; j < FMA_ACC; j++) acc[j] = _mm512_fmadd_ps(acc[j], vm, vc);
    }
    for (int j = 1; j < FMA_ACC; j++) acc[0] = _mm512_add_ps(acc[0], acc[j]);
    return cpu_hsum_512(acc[0]);
}

const cpu_kernels cpu_kernels_avx512 = {
    .name = "avx512",
    .kblock = KC,
    .matmul_f32 = matmul_f32,
    .matmul_f16 = matmul_f16,
    .matmul_bf16 = matmul_bf16,
    .dot_f32 = dot_f32,
    .dot_f16 = dot_f16,
    .dot_bf16 = dot_bf16,
    .axpy_f32 = axpy_f32,
    .attn_scores_f32 = attn_scores_f32,
    .attn_scores_f16 = attn_scores_f16,
    .attn_scores_bf16 = attn_scores_bf16,
    .attn_softmax = attn_softmax,
    .attn_values_f32 = attn_values_f32,
    .attn_values_f16 = attn_values_f16,
    .attn_values_bf16 = attn_values_bf16,
    .axpby_f32 = axpby_f32,
    .axpy_f16 = axpy_f16,
    .axpy_bf16 = axpy_bf16,
    .f16_to_f32 = cvt_f16_to_f32,
    .bf16_to_f32 = cvt_bf16_to_f32,
    .f32_to_f16 = cvt_f32_to_f16,
    .f32_to_bf16 = cvt_f32_to_bf16,
    .fma_loop = fma_loop,
    .fma_flops = 2 * FMA_ACC * VW,
};
