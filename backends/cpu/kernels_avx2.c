/* AVX2 + FMA + F16C inner loops (x86-64; built with -mavx2 -mfma -mf16c, picked at run
 * time by kernels_select.c).
 *
 * matmul is built from register tiles: R x rows times O weight rows, R*O accumulators of
 * 8 lanes along k, reduced horizontally at the end of a k block. Decode (n <= TR) runs
 * the tiles straight over the weights, converting f16/bf16 in registers, so the weights
 * stream once at memory speed. Prefill (n > TR) goes block by block: OC weight rows by
 * KC of k are made f32 once into an L1 buffer (or, for f32, used in place), then every
 * tile of x rows runs over that block. k beyond a multiple of 8 is done in scalar code,
 * so no load ever reads past the end of a row. */
#include "kernels.h"
#include "reduce_avx2.h"

#include <immintrin.h>
#include <math.h>
#include <stdalign.h>

#define VW 8   /* floats per vector */
#define TR 3   /* x rows per tile: 3x4 accumulators + 4 weights + 1 x = 16 ymm */
#define TO 4   /* weight rows per tile */
#define TD 8   /* weight rows per decode step: 8 accumulators */
#define OC 16  /* weight rows per prefill block */
#define KC 512 /* k per prefill block (a multiple of VW) */

#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")

INLINE __m256 ld_f32(const float *p) {
    return _mm256_loadu_ps(p);
}
INLINE __m256 ld_f16(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
}
/* bf16 is the top half of an f32: zero-extend to 32 bits and shift into place. */
INLINE __m256 ld_bf16(const uint16_t *p) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
INLINE float sc_f32(const float *p) {
    return *p;
}
INLINE float sc_f16(const uint16_t *p) {
    return cpu_f16_to_f32(*p);
}
INLINE float sc_bf16(const uint16_t *p) {
    return cpu_bf16_to_f32(*p);
}

/* The reductions every AVX2 path shares (reduce_avx2.h). */
#define hsum4 cpu_hsum4_256
#define hsum  cpu_hsum_256

/* y[r * ldy + o] (+)= horizontal sums of acc[r][o]. */
INLINE void tile_store(int R, int O, __m256 acc[TR][TO], float *y, int64_t ldy, int add) {
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

/* One R x O tile over k in [0, kc), kc a multiple of VW. R and O are constants after
 * inlining, so acc lives in registers. */
#define DEFINE_TILE(T, WT)                                                                         \
    INLINE void tile_##T(int R, int O, const float *x, int64_t ldx, const WT *w, int64_t ldw,      \
                         int64_t kc, float *y, int64_t ldy, int add) {                             \
        __m256 acc[TR][TO];                                                                        \
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int o = 0; o < O; o++) acc[r][o] =          \
            _mm256_setzero_ps();                                                                   \
        for (int64_t k = 0; k < kc; k += VW) {                                                     \
            __m256 wv[TO];                                                                         \
            UNROLL for (int o = 0; o < O; o++) wv[o] = ld_##T(w + o * ldw + k);                    \
            UNROLL for (int r = 0; r < R; r++) {                                                   \
                const __m256 xv = _mm256_loadu_ps(x + r * ldx + k);                                \
                UNROLL for (int o = 0; o < O; o++) acc[r][o] =                                     \
                    _mm256_fmadd_ps(xv, wv[o], acc[r][o]);                                         \
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
        default:                                                                                   \
            break;                                                                                 \
        }                                                                                          \
    }                                                                                              \
    /* y[r, o] += the products for k in [k0, k_dim) (the part past the last full vector). */       \
    static void ktail_##T(const float *x, int64_t n, int64_t k_dim, const WT *w, int64_t o0,       \
                          int64_t o1, float *y, int64_t ldy, int64_t k0) {                         \
        for (int64_t r = 0; r < n; r++)                                                            \
            for (int64_t o = o0; o < o1; o++) {                                                    \
                float s = 0;                                                                       \
                for (int64_t k = k0; k < k_dim; k++)                                               \
                    s += x[r * k_dim + k] * sc_##T(w + o * k_dim + k);                             \
                y[r * ldy + o] += s;                                                               \
            }                                                                                      \
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
 * decoded alone or computed in a batch: batch invariance. k past the last full vector is
 * left to ktail, as in every path. */
#define DEFINE_MV(T, WT)                                                                           \
    INLINE void mv_##T(int O, const float *x, const WT *w, int64_t k_dim, float *y) {              \
        const int64_t kv = k_dim / VW * VW;                                                        \
        for (int64_t kb = 0; kb == 0 || kb < kv; kb += KC) {                                       \
            const int64_t ke = kv - kb < KC ? kv : kb + KC;                                        \
            __m256 a[TD];                                                                          \
            UNROLL for (int o = 0; o < O; o++) a[o] = _mm256_setzero_ps();                         \
            for (int64_t k = kb; k < ke; k += VW) {                                                \
                const __m256 xv = _mm256_loadu_ps(x + k);                                          \
                UNROLL for (int o = 0; o < O; o++) a[o] =                                          \
                    _mm256_fmadd_ps(xv, ld_##T(w + o * k_dim + k), a[o]);                          \
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

/* A block of `rows` weight rows by kc (a multiple of VW) of k made f32 into buf, KC
 * apart, for the prefill loop. f32 is copied too: rows of a large matrix are a multiple
 * of 4 KiB apart and would fight over the same L1 sets. */
#define DEFINE_BLOCK(T, WT)                                                                        \
    static void block_##T(const WT *w, int64_t k_dim, int64_t rows, int64_t kc, float *buf) {      \
        for (int64_t i = 0; i < rows; i++)                                                         \
            for (int64_t k = 0; k < kc; k += VW)                                                   \
                _mm256_store_ps(buf + i * KC + k, ld_##T(w + i * k_dim + k));                      \
    }

DEFINE_BLOCK(f32, float)
DEFINE_BLOCK(f16, uint16_t)
DEFINE_BLOCK(bf16, uint16_t)

#define DEFINE_MATMUL(T, WT)                                                                       \
    static void matmul_##T(const float *x, int64_t n, int64_t k_dim, const WT *w, int64_t o0,      \
                           int64_t o1, float *y, int64_t ldy) {                                    \
        const int64_t kv = k_dim / VW * VW;                                                        \
        if (n <= 0 || o1 <= o0) return;                                                            \
        if (n == 1) {                                                                              \
            matvec_##T(x, k_dim, w, o0, o1, y);                                                    \
        } else if (n <= TR) {                                                                      \
            /* A few rows: each weight is used n times only, convert it in registers (k in         \
             * blocks of KC, as everywhere, for batch invariance). */                              \
            for (int64_t kb = 0; kb == 0 || kb < kv; kb += KC) {                                   \
                const int64_t kc = kv - kb < KC ? kv - kb : KC;                                    \
                for (int64_t o = o0; o < o1; o += TO)                                              \
                    tile_any_##T((int)n, o1 - o < TO ? (int)(o1 - o) : TO, x + kb, k_dim,          \
                                 w + o * k_dim + kb, k_dim, kc, y + o, ldy, kb > 0);               \
            }                                                                                      \
        } else {                                                                                   \
            alignas(64) float buf[OC * KC];                                                        \
            for (int64_t ob = o0; ob < o1; ob += OC) {                                             \
                const int64_t oc = o1 - ob < OC ? o1 - ob : OC;                                    \
                /* At least one pass, so that y is written even when kv is 0. */                   \
                for (int64_t kb = 0; kb == 0 || kb < kv; kb += KC) {                               \
                    const int64_t kc = kv - kb < KC ? kv - kb : KC;                                \
                    block_##T(w + ob * k_dim + kb, k_dim, oc, kc, buf);                            \
                    for (int64_t r = 0; r < n; r += TR) {                                          \
                        const int rn = n - r < TR ? (int)(n - r) : TR;                             \
                        for (int64_t o = 0; o < oc; o += TO)                                       \
                            tile_any_f32(rn, oc - o < TO ? (int)(oc - o) : TO, x + r * k_dim + kb, \
                                         k_dim, buf + o * KC, KC, kc, y + r * ldy + ob + o, ldy,   \
                                         kb > 0);                                                  \
                    }                                                                              \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        if (kv < k_dim) ktail_##T(x, n, k_dim, w, o0, o1, y, ldy, kv);                             \
    }

DEFINE_MATMUL(f32, float)
DEFINE_MATMUL(f16, uint16_t)
DEFINE_MATMUL(bf16, uint16_t)

/* ---- dot, axpy ---- */

#define DEFINE_DOT(T, WT)                                                                          \
    static float dot_##T(const float *a, const WT *b, int64_t n) {                                 \
        __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;                                \
        int64_t i = 0;                                                                             \
        for (; i + 4 * VW <= n; i += 4 * VW) {                                                     \
            s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), ld_##T(b + i), s0);                       \
            s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + VW), ld_##T(b + i + VW), s1);             \
            s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 2 * VW), ld_##T(b + i + 2 * VW), s2);     \
            s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 3 * VW), ld_##T(b + i + 3 * VW), s3);     \
        }                                                                                          \
        for (; i + VW <= n; i += VW)                                                               \
            s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), ld_##T(b + i), s0);                       \
        float s = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));               \
        for (; i < n; i++) s += a[i] * sc_##T(b + i);                                              \
        return s;                                                                                  \
    }                                                                                              \
    static void axpy_##T(float *y, float a, const WT *x, int64_t n) {                              \
        const __m256 av = _mm256_set1_ps(a);                                                       \
        int64_t i = 0;                                                                             \
        for (; i + 2 * VW <= n; i += 2 * VW) {                                                     \
            _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, ld_##T(x + i), _mm256_loadu_ps(y + i)));   \
            _mm256_storeu_ps(                                                                      \
                y + i + VW, _mm256_fmadd_ps(av, ld_##T(x + i + VW), _mm256_loadu_ps(y + i + VW))); \
        }                                                                                          \
        for (; i + VW <= n; i += VW)                                                               \
            _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, ld_##T(x + i), _mm256_loadu_ps(y + i)));   \
        for (; i < n; i++) y[i] += a * sc_##T(x + i);                                              \
    }

DEFINE_DOT(f32, float)
DEFINE_DOT(f16, uint16_t)

static void axpby_f32(float *y, float a, float b, const float *x, int64_t n) {
    const __m256 av = _mm256_set1_ps(a), bv = _mm256_set1_ps(b);
    int64_t i = 0;
    for (; i + VW <= n; i += VW)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(bv, _mm256_loadu_ps(x + i),
                                                _mm256_mul_ps(av, _mm256_loadu_ps(y + i))));
    for (; i < n; i++) y[i] = fmaf(b, x[i], a * y[i]);
}
DEFINE_DOT(bf16, uint16_t)

/* ---- attention (kernels.h: attn_*) ---- */

/* Keys this far ahead of the one being scored are asked for early: a block's K rows are a
 * kv head's slice of each cache row, kv_heads slices apart, which the hardware stream
 * prefetchers follow poorly. */
#define ATT_PF 8
#define ATT_G  2 /* heads per register tile: 2 x 4 accumulators + 4 keys + 1 query */

/* GN heads x KN keys of scores, d past the last full vector in scalar code. Each score has
 * an accumulator of its own and the same reduction, so it does not depend on GN, KN or its
 * place in a block. */
#define DEFINE_ATTN(T, WT)                                                                         \
    INLINE void sc_tile_##T(int GN, int KN, const float *q, int64_t d, const WT *k, int64_t ldk,   \
                            float scale, float *s, int64_t lds) {                                  \
        __m256 acc[ATT_G][4];                                                                      \
        UNROLL for (int g = 0; g < ATT_G; g++) UNROLL for (int j = 0; j < 4; j++) acc[g][j] =      \
            _mm256_setzero_ps();                                                                   \
        int64_t kk = 0;                                                                            \
        for (; kk + VW <= d; kk += VW) {                                                           \
            __m256 kv[4];                                                                          \
            UNROLL for (int j = 0; j < KN; j++) kv[j] = ld_##T(k + j * ldk + kk);                  \
            UNROLL for (int g = 0; g < GN; g++) {                                                  \
                const __m256 qv = _mm256_loadu_ps(q + g * d + kk);                                 \
                UNROLL for (int j = 0; j < KN; j++) acc[g][j] =                                    \
                    _mm256_fmadd_ps(qv, kv[j], acc[g][j]);                                         \
            }                                                                                      \
        }                                                                                          \
        UNROLL for (int g = 0; g < GN; g++) {                                                      \
            float t[4];                                                                            \
            _mm_storeu_ps(t, hsum4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]));                   \
            UNROLL for (int j = 0; j < KN; j++) {                                                  \
                float v = t[j];                                                                    \
                for (int64_t e = kk; e < d; e++)                                                   \
                    v = fmaf(q[g * d + e], sc_##T(k + j * ldk + e), v);                            \
                s[g * lds + j] = v * scale;                                                        \
            }                                                                                      \
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
            int g = 0;                                                                             \
            for (; g + 2 <= G; g += 2)                                                             \
                sc_tile_##T(2, 4, q + g * d, d, K + i * ldk, ldk, scale, s + g * lds + i, lds);    \
            if (g < G)                                                                             \
                sc_tile_##T(1, 4, q + g * d, d, K + i * ldk, ldk, scale, s + g * lds + i, lds);    \
        }                                                                                          \
        for (; i < n; i++)                                                                         \
            for (int g = 0; g < G; g++)                                                            \
                sc_tile_##T(1, 1, q + g * d, d, K + i * ldk, ldk, scale, s + g * lds + i, lds);    \
    }                                                                                              \
    /* GN heads x NV whole vectors of dv over n keys, o kept in registers from the first key       \
     * to the last. */                                                                             \
    INLINE void val_tile_##T(int GN, int NV, const float *p, int64_t lds, const WT *v,             \
                             int64_t ldv, int64_t n, float *o, int64_t dv) {                       \
        __m256 acc[ATT_G][4];                                                                      \
        UNROLL for (int g = 0; g < GN; g++) UNROLL for (int c = 0; c < NV; c++) acc[g][c] =        \
            _mm256_loadu_ps(o + g * dv + c * VW);                                                  \
        const int64_t lines = ((int64_t)sizeof(WT) * NV * VW + 63) / 64;                           \
        for (int64_t i = 0; i < n; i++) {                                                          \
            if (i + ATT_PF < n)                                                                    \
                for (int64_t l = 0; l < lines; l++)                                                \
                    _mm_prefetch((const char *)(v + (i + ATT_PF) * ldv) + 64 * l, _MM_HINT_T0);    \
            __m256 x[4];                                                                           \
            UNROLL for (int c = 0; c < NV; c++) x[c] = ld_##T(v + i * ldv + c * VW);               \
            UNROLL for (int g = 0; g < GN; g++) {                                                  \
                const __m256 pb = _mm256_broadcast_ss(p + g * lds + i);                            \
                UNROLL for (int c = 0; c < NV; c++) acc[g][c] =                                    \
                    _mm256_fmadd_ps(pb, x[c], acc[g][c]);                                          \
            }                                                                                      \
        }                                                                                          \
        UNROLL for (int g = 0; g < GN; g++) UNROLL for (int c = 0; c < NV; c++)                    \
            _mm256_storeu_ps(o + g * dv + c * VW, acc[g][c]);                                      \
    }                                                                                              \
    static void attn_values_##T(const float *p, int G, int64_t lds, const WT *V, int64_t ldv,      \
                                int64_t n, int64_t dv, float *o) {                                 \
        const int64_t dvv = dv / VW * VW;                                                          \
        for (int64_t j = 0; j < dvv; j += 4 * VW) {                                                \
            const int nv = dvv - j < 4 * VW ? (int)((dvv - j) / VW) : 4;                           \
            for (int g = 0; g < G; g += ATT_G) {                                                   \
                const int gn = G - g < ATT_G ? G - g : ATT_G;                                      \
                const float *pg = p + g * lds;                                                     \
                float *og = o + g * dv + j;                                                        \
                switch (gn * 8 + nv) {                                                             \
                    VAL_CASES(T, 1)                                                                \
                    VAL_CASES(T, 2)                                                                \
                default:                                                                           \
                    break;                                                                         \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        if (dvv < dv)                                                                              \
            for (int g = 0; g < G; g++)                                                            \
                for (int64_t i = 0; i < n; i++)                                                    \
                    for (int64_t e = dvv; e < dv; e++)                                             \
                        o[g * dv + e] =                                                            \
                            fmaf(p[g * lds + i], sc_##T(V + i * ldv + e), o[g * dv + e]);          \
    }

#define VAL_CASE(T, GN, NV)                                                                        \
    case GN * 8 + NV:                                                                              \
        val_tile_##T(GN, NV, pg, lds, V + j, ldv, n, og, dv);                                      \
        break;
#define VAL_CASES(T, GN) VAL_CASE(T, GN, 1) VAL_CASE(T, GN, 2) VAL_CASE(T, GN, 3) VAL_CASE(T, GN, 4)

DEFINE_ATTN(f32, float)
DEFINE_ATTN(f16, uint16_t)
DEFINE_ATTN(bf16, uint16_t)

/* exp(x): x = n ln2 + r with |r| <= ln2 / 2 (ln2 in two parts, so r is exact enough), e^r
 * by its Taylor series to r^7 (error below 1e-8 there), times 2^n made in the exponent
 * bits; x below -87 (where 2^n would leave the normal range) gives 0, as -inf does. */
INLINE __m256 exp_256(__m256 x) {
    const __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GE_OQ);
    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.0f)), _mm256_set1_ps(-87.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504089f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 e = _mm256_set1_ps(1.0f / 5040);
    e = _mm256_fmadd_ps(e, r, _mm256_set1_ps(1.0f / 720));
    e = _mm256_fmadd_ps(e, r, _mm256_set1_ps(1.0f / 120));
    e = _mm256_fmadd_ps(e, r, _mm256_set1_ps(1.0f / 24));
    e = _mm256_fmadd_ps(e, r, _mm256_set1_ps(1.0f / 6));
    e = _mm256_fmadd_ps(e, r, _mm256_set1_ps(0.5f));
    e = _mm256_fmadd_ps(e, r, _mm256_set1_ps(1.0f));
    e = _mm256_fmadd_ps(e, r, _mm256_set1_ps(1.0f));
    const __m256i b =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(e, _mm256_castsi256_ps(b)), keep);
}

static float attn_softmax(float *s, int64_t n, float cap, float *mx) {
    if (cap > 0)
        for (int64_t i = 0; i < n; i++) s[i] = cap * tanhf(s[i] / cap);
    /* the part past the last full vector goes through a padded copy, so every value is made
     * by the same vector code */
    const int64_t nv = n / VW * VW;
    float t[VW];
    for (int64_t i = 0; i < VW; i++) t[i] = nv + i < n ? s[nv + i] : -INFINITY;
    __m256 m = _mm256_loadu_ps(t);
    for (int64_t i = 0; i < nv; i += VW) m = _mm256_max_ps(m, _mm256_loadu_ps(s + i));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    const float M = _mm_cvtss_f32(m4);
    *mx = M;
    const __m256 mv = _mm256_set1_ps(M);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nv; i += VW) {
        const __m256 e = exp_256(_mm256_sub_ps(_mm256_loadu_ps(s + i), mv));
        _mm256_storeu_ps(s + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    if (nv < n) {
        const __m256 e = exp_256(_mm256_sub_ps(_mm256_loadu_ps(t), mv));
        _mm256_storeu_ps(t, e);
        acc = _mm256_add_ps(acc, e);
        for (int64_t i = nv; i < n; i++) s[i] = t[i - nv];
    }
    return hsum(acc);
}

/* ---- conversions ---- */

static void cvt_f16_to_f32(const uint16_t *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + VW <= n; i += VW) _mm256_storeu_ps(y + i, ld_f16(x + i));
    for (; i < n; i++) y[i] = cpu_f16_to_f32(x[i]);
}

static void cvt_bf16_to_f32(const uint16_t *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + VW <= n; i += VW) _mm256_storeu_ps(y + i, ld_bf16(x + i));
    for (; i < n; i++) y[i] = cpu_bf16_to_f32(x[i]);
}

static void cvt_f32_to_f16(const float *x, uint16_t *y, int64_t n) {
    int64_t i = 0;
    for (; i + VW <= n; i += VW)
        _mm_storeu_si128((__m128i *)(void *)(y + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) y[i] = cpu_f32_to_f16(x[i]);
}

/* Round to nearest even on the bits; NaN keeps its sign and top payload, made quiet.
 * Gives 8 results in the low 16 bits of each 32-bit lane. */
INLINE __m256i to_bf16_lanes(__m256 v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd));
    r = _mm256_srli_epi32(r, 16);
    const __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    return _mm256_blendv_epi8(r, q, _mm256_castps_si256(nan));
}

static void cvt_f32_to_bf16(const float *x, uint16_t *y, int64_t n) {
    int64_t i = 0;
    for (; i + 2 * VW <= n; i += 2 * VW) {
        __m256i a = to_bf16_lanes(_mm256_loadu_ps(x + i));
        __m256i b = to_bf16_lanes(_mm256_loadu_ps(x + i + VW));
        /* packus works within 128-bit halves; the permute puts the quads back in order. */
        __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
        _mm256_storeu_si256((__m256i *)(void *)(y + i), p);
    }
    for (; i < n; i++) y[i] = cpu_f32_to_bf16(x[i]);
}

/* The multiply-add probe (cpu_kernels.fma_loop): FMA_ACC independent chains, more than
 * the FMA units' count times their latency (2 x 4-5 cycles on current x86 cores). */
#define FMA_ACC 12
static float fma_loop(int64_t iters, float m, float c) {
    __m256 acc[FMA_ACC], vm = _mm256_set1_ps(m), vc = _mm256_set1_ps(c);
    for (int j = 0; j < FMA_ACC; j++) acc[j] = _mm256_set1_ps((float)j);
    for (int64_t i = 0; i < iters; i++) {
#pragma GCC unroll 16
        for (int j = 0; j < FMA_ACC; j++) acc[j] = _mm256_fmadd_ps(acc[j], vm, vc);
    }
    for (int j = 1; j < FMA_ACC; j++) acc[0] = _mm256_add_ps(acc[0], acc[j]);
    return cpu_hsum_256(acc[0]);
}

const cpu_kernels cpu_kernels_avx2 = {
    .name = "avx2",
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
