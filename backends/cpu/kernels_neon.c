/* NEON inner loops (aarch64, where Advanced SIMD and the f16 <-> f32 vector conversions
 * are part of the base architecture, so this table needs no run-time check).
 *
 * Same plan as the AVX2 file, 4 lanes wide: R x O register tiles of accumulators along
 * k, decode straight over the weights (f16 through FCVTL, bf16 by a widening shift),
 * prefill over f32 blocks of weight rows. k past the last full vector is done in scalar
 * code, so no load reads past the end of a row. */
#include "kernels.h"
#include "reduce_neon.h"

#include <arm_neon.h>
#include <math.h>
#include <stdalign.h>

#define VW 4   /* floats per vector */
#define TR 4   /* x rows per tile: 4x4 accumulators + 4 weights + 1 x of 32 registers */
#define TO 4   /* weight rows per tile */
#define TD 8   /* weight rows per decode step: 8 accumulators */
#define OC 16  /* weight rows per prefill block */
#define KC 512 /* k per prefill block (a multiple of VW) */

#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")

INLINE float32x4_t ld_f32(const float *p) {
    return vld1q_f32(p);
}
INLINE float32x4_t ld_f16(const uint16_t *p) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
}
/* bf16 is the top half of an f32: widen with a shift by 16. */
INLINE float32x4_t ld_bf16(const uint16_t *p) {
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16));
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

/* The reductions every NEON path shares (reduce_neon.h). */
#define hsum4 cpu_hsum4_neon
#define hsum  cpu_hsum_neon

/* y[r * ldy + o] (+)= horizontal sums of acc[r][o]. */
INLINE void tile_store(int R, int O, float32x4_t acc[TR][TO], float *y, int64_t ldy, int add) {
    UNROLL for (int r = 0; r < R; r++) {
        float *yr = y + r * ldy;
        if (O == 4) {
            float32x4_t s = hsum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
            if (add) s = vaddq_f32(s, vld1q_f32(yr));
            vst1q_f32(yr, s);
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
        float32x4_t acc[TR][TO];                                                                   \
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int o = 0; o < O; o++) acc[r][o] =          \
            vdupq_n_f32(0);                                                                        \
        for (int64_t k = 0; k < kc; k += VW) {                                                     \
            float32x4_t wv[TO];                                                                    \
            UNROLL for (int o = 0; o < O; o++) wv[o] = ld_##T(w + o * ldw + k);                    \
            UNROLL for (int r = 0; r < R; r++) {                                                   \
                const float32x4_t xv = vld1q_f32(x + r * ldx + k);                                 \
                UNROLL for (int o = 0; o < O; o++) acc[r][o] = vfmaq_f32(acc[r][o], xv, wv[o]);    \
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
 * flight. k is summed in blocks of KC exactly as the prefill tiles sum it (lane-wise along
 * k, one horizontal sum per block, blocks added in order), so a row's result is the same
 * bits whether it was decoded alone or computed in a batch: batch invariance. k past the
 * last full vector is left to ktail, as in every path. */
#define DEFINE_MV(T, WT)                                                                           \
    INLINE void mv_##T(int O, const float *x, const WT *w, int64_t k_dim, float *y) {              \
        const int64_t kv = k_dim / VW * VW;                                                        \
        for (int64_t kb = 0; kb == 0 || kb < kv; kb += KC) {                                       \
            const int64_t ke = kv - kb < KC ? kv : kb + KC;                                        \
            float32x4_t a[TD];                                                                     \
            UNROLL for (int o = 0; o < O; o++) a[o] = vdupq_n_f32(0);                              \
            for (int64_t k = kb; k < ke; k += VW) {                                                \
                const float32x4_t xv = vld1q_f32(x + k);                                           \
                UNROLL for (int o = 0; o < O; o++) a[o] =                                          \
                    vfmaq_f32(a[o], xv, ld_##T(w + o * k_dim + k));                                \
            }                                                                                      \
            int o = 0;                                                                             \
            UNROLL for (; o + 4 <= O; o += 4) {                                                    \
                float32x4_t s = hsum4(a[o], a[o + 1], a[o + 2], a[o + 3]);                         \
                if (kb > 0) s = vaddq_f32(s, vld1q_f32(y + o));                                    \
                vst1q_f32(y + o, s);                                                               \
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
                vst1q_f32(buf + i * KC + k, ld_##T(w + i * k_dim + k));                            \
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
        float32x4_t s0 = vdupq_n_f32(0), s1 = s0, s2 = s0, s3 = s0;                                \
        int64_t i = 0;                                                                             \
        for (; i + 4 * VW <= n; i += 4 * VW) {                                                     \
            s0 = vfmaq_f32(s0, vld1q_f32(a + i), ld_##T(b + i));                                   \
            s1 = vfmaq_f32(s1, vld1q_f32(a + i + VW), ld_##T(b + i + VW));                         \
            s2 = vfmaq_f32(s2, vld1q_f32(a + i + 2 * VW), ld_##T(b + i + 2 * VW));                 \
            s3 = vfmaq_f32(s3, vld1q_f32(a + i + 3 * VW), ld_##T(b + i + 3 * VW));                 \
        }                                                                                          \
        for (; i + VW <= n; i += VW) s0 = vfmaq_f32(s0, vld1q_f32(a + i), ld_##T(b + i));          \
        float s = hsum(vaddq_f32(vaddq_f32(s0, s1), vaddq_f32(s2, s3)));                           \
        for (; i < n; i++) s += a[i] * sc_##T(b + i);                                              \
        return s;                                                                                  \
    }                                                                                              \
    static void axpy_##T(float *y, float a, const WT *x, int64_t n) {                              \
        int64_t i = 0;                                                                             \
        for (; i + 2 * VW <= n; i += 2 * VW) {                                                     \
            vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), ld_##T(x + i), a));                     \
            vst1q_f32(y + i + VW, vfmaq_n_f32(vld1q_f32(y + i + VW), ld_##T(x + i + VW), a));      \
        }                                                                                          \
        for (; i + VW <= n; i += VW)                                                               \
            vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), ld_##T(x + i), a));                     \
        for (; i < n; i++) y[i] += a * sc_##T(x + i);                                              \
    }

DEFINE_DOT(f32, float)
DEFINE_DOT(f16, uint16_t)
DEFINE_DOT(bf16, uint16_t)

static void axpby_f32(float *y, float a, float b, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + VW <= n; i += VW)
        vst1q_f32(y + i, vfmaq_n_f32(vmulq_n_f32(vld1q_f32(y + i), a), vld1q_f32(x + i), b));
    for (; i < n; i++) y[i] = fmaf(b, x[i], a * y[i]);
}

/* ---- attention (kernels.h: attn_*) ---- */

/* GN heads x KN keys of scores, d past the last full vector in scalar code. Each score has
 * an accumulator of its own and the same reduction, so it does not depend on GN, KN or its
 * place in a block. */
#define DEFINE_ATTN(T, WT)                                                                         \
    INLINE void sc_tile_##T(int GN, int KN, const float *q, int64_t d, const WT *k, int64_t ldk,   \
                            float scale, float *s, int64_t lds) {                                  \
        float32x4_t acc[4][4];                                                                     \
        UNROLL for (int g = 0; g < 4; g++) UNROLL for (int j = 0; j < 4; j++) acc[g][j] =          \
            vdupq_n_f32(0);                                                                        \
        int64_t kk = 0;                                                                            \
        for (; kk + VW <= d; kk += VW) {                                                           \
            float32x4_t kv[4];                                                                     \
            UNROLL for (int j = 0; j < KN; j++) kv[j] = ld_##T(k + j * ldk + kk);                  \
            UNROLL for (int g = 0; g < GN; g++) {                                                  \
                const float32x4_t qv = vld1q_f32(q + g * d + kk);                                  \
                UNROLL for (int j = 0; j < KN; j++) acc[g][j] = vfmaq_f32(acc[g][j], qv, kv[j]);   \
            }                                                                                      \
        }                                                                                          \
        UNROLL for (int g = 0; g < GN; g++) {                                                      \
            float t[4];                                                                            \
            vst1q_f32(t, hsum4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]));                       \
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
        int64_t i = 0;                                                                             \
        for (; i + 4 <= n; i += 4) {                                                               \
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
    /* GN heads x NV whole vectors of dv over n keys, o kept in registers from the first key       \
     * to the last. */                                                                             \
    INLINE void val_tile_##T(int GN, int NV, const float *p, int64_t lds, const WT *v,             \
                             int64_t ldv, int64_t n, float *o, int64_t dv) {                       \
        float32x4_t acc[4][4];                                                                     \
        UNROLL for (int g = 0; g < GN; g++) UNROLL for (int c = 0; c < NV; c++) acc[g][c] =        \
            vld1q_f32(o + g * dv + c * VW);                                                        \
        for (int64_t i = 0; i < n; i++) {                                                          \
            float32x4_t x[4];                                                                      \
            UNROLL for (int c = 0; c < NV; c++) x[c] = ld_##T(v + i * ldv + c * VW);               \
            UNROLL for (int g = 0; g < GN; g++) {                                                  \
                const float pb = p[g * lds + i];                                                   \
                UNROLL for (int c = 0; c < NV; c++) acc[g][c] = vfmaq_n_f32(acc[g][c], x[c], pb);  \
            }                                                                                      \
        }                                                                                          \
        UNROLL for (int g = 0; g < GN; g++) UNROLL for (int c = 0; c < NV; c++)                    \
            vst1q_f32(o + g * dv + c * VW, acc[g][c]);                                             \
    }                                                                                              \
    static void attn_values_##T(const float *p, int G, int64_t lds, const WT *V, int64_t ldv,      \
                                int64_t n, int64_t dv, float *o) {                                 \
        const int64_t dvv = dv / VW * VW;                                                          \
        for (int64_t j = 0; j < dvv; j += 4 * VW) {                                                \
            const int nv = dvv - j < 4 * VW ? (int)((dvv - j) / VW) : 4;                           \
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
INLINE float32x4_t exp_neon(float32x4_t x) {
    const uint32x4_t keep = vcgeq_f32(x, vdupq_n_f32(-87.0f));
    x = vmaxq_f32(vminq_f32(x, vdupq_n_f32(88.0f)), vdupq_n_f32(-87.0f));
    const int32x4_t ni = vcvtnq_s32_f32(vmulq_n_f32(x, 1.44269504089f));
    const float32x4_t n = vcvtq_f32_s32(ni);
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
    r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
    float32x4_t e = vdupq_n_f32(1.0f / 5040);
    e = vfmaq_f32(vdupq_n_f32(1.0f / 720), e, r);
    e = vfmaq_f32(vdupq_n_f32(1.0f / 120), e, r);
    e = vfmaq_f32(vdupq_n_f32(1.0f / 24), e, r);
    e = vfmaq_f32(vdupq_n_f32(1.0f / 6), e, r);
    e = vfmaq_f32(vdupq_n_f32(0.5f), e, r);
    e = vfmaq_f32(vdupq_n_f32(1.0f), e, r);
    e = vfmaq_f32(vdupq_n_f32(1.0f), e, r);
    const int32x4_t b = vshlq_n_s32(vaddq_s32(ni, vdupq_n_s32(127)), 23);
    const float32x4_t y = vmulq_f32(e, vreinterpretq_f32_s32(b));
    return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(y), keep));
}

static float attn_softmax(float *s, int64_t n, float cap, float *mx) {
    if (cap > 0)
        for (int64_t i = 0; i < n; i++) s[i] = cap * tanhf(s[i] / cap);
    /* the part past the last full vector goes through a padded copy, so every value is made
     * by the same vector code */
    const int64_t nv = n / VW * VW;
    float t[VW];
    for (int64_t i = 0; i < VW; i++) t[i] = nv + i < n ? s[nv + i] : -INFINITY;
    float32x4_t m = vld1q_f32(t);
    for (int64_t i = 0; i < nv; i += VW) m = vmaxq_f32(m, vld1q_f32(s + i));
    const float M = vmaxvq_f32(m);
    *mx = M;
    const float32x4_t mv = vdupq_n_f32(M);
    float32x4_t acc = vdupq_n_f32(0);
    for (int64_t i = 0; i < nv; i += VW) {
        const float32x4_t e = exp_neon(vsubq_f32(vld1q_f32(s + i), mv));
        vst1q_f32(s + i, e);
        acc = vaddq_f32(acc, e);
    }
    if (nv < n) {
        const float32x4_t e = exp_neon(vsubq_f32(vld1q_f32(t), mv));
        vst1q_f32(t, e);
        acc = vaddq_f32(acc, e);
        for (int64_t i = nv; i < n; i++) s[i] = t[i - nv];
    }
    return hsum(acc);
}

/* ---- conversions ---- */

static void cvt_f16_to_f32(const uint16_t *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + VW <= n; i += VW) vst1q_f32(y + i, ld_f16(x + i));
    for (; i < n; i++) y[i] = cpu_f16_to_f32(x[i]);
}

static void cvt_bf16_to_f32(const uint16_t *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + VW <= n; i += VW) vst1q_f32(y + i, ld_bf16(x + i));
    for (; i < n; i++) y[i] = cpu_bf16_to_f32(x[i]);
}

/* FCVTN rounds by FPCR (nearest even unless someone changed it) and quiets NaN. */
static void cvt_f32_to_f16(const float *x, uint16_t *y, int64_t n) {
    int64_t i = 0;
    for (; i + VW <= n; i += VW)
        vst1_u16(y + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
    for (; i < n; i++) y[i] = cpu_f32_to_f16(x[i]);
}

/* Round to nearest even on the bits; NaN keeps its sign and top payload, made quiet. */
INLINE uint16x4_t to_bf16(float32x4_t v) {
    const uint32x4_t u = vreinterpretq_u32_f32(v);
    const uint32x4_t odd = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
    const uint32x4_t r = vshrq_n_u32(vaddq_u32(u, vaddq_u32(vdupq_n_u32(0x7fff), odd)), 16);
    const uint32x4_t q = vorrq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(0x40));
    return vmovn_u32(vbslq_u32(vceqq_f32(v, v), r, q));
}

static void cvt_f32_to_bf16(const float *x, uint16_t *y, int64_t n) {
    int64_t i = 0;
    for (; i + VW <= n; i += VW) vst1_u16(y + i, to_bf16(vld1q_f32(x + i)));
    for (; i < n; i++) y[i] = cpu_f32_to_bf16(x[i]);
}

/* The multiply-add probe (cpu_kernels.fma_loop): FMA_ACC independent chains, more than
 * the FMA units' count times their latency (up to 4 x 4 cycles on current cores). */
#define FMA_ACC 16
static float fma_loop(int64_t iters, float m, float c) {
    float32x4_t acc[FMA_ACC], vm = vdupq_n_f32(m), vc = vdupq_n_f32(c);
    for (int j = 0; j < FMA_ACC; j++) acc[j] = vdupq_n_f32((float)j);
    for (int64_t i = 0; i < iters; i++) {
#pragma GCC unroll 16
        for (int j = 0; j < FMA_ACC; j++) acc[j] = vfmaq_f32(vc, acc[j], vm);
    }
    for (int j = 1; j < FMA_ACC; j++) acc[0] = vaddq_f32(acc[0], acc[j]);
    return cpu_hsum_neon(acc[0]);
}

const cpu_kernels cpu_kernels_neon = {
    .name = "neon",
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
