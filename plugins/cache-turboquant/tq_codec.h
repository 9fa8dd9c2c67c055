/* The TurboQuant codec for one block of m = 64 or 128 values (specs/turboquant.md §4-§6),
 * in float32, in the order the spec gives (its golden records depend on it): the
 * randomized Hadamard rotation R = D2 Hn D1, the QJL map P = D4 Hn D3, Lloyd-Max codes,
 * fp16 norms. Header only: the plugin's kernels and its tests include it.
 *
 * A block's stored fields (the plugin lays them out in planes, tq_layout below):
 *   codes: m codes of `bits` bits, an LSB-first bit stream (code i in bits [b*i, b*i+b)),
 *          read as little-endian 32-bit words;
 *   signs: (tq3 keys) m QJL sign bits, bit i set where (P r)_i >= 0;
 *   norms: two fp16 numbers: tq3 keys n = |k| and gamma = |residual|; values and tq4
 *          keys the corrected norm s = |x| / |C[code]| and 0. */
#ifndef LMHOST_TQ_CODEC_H
#define LMHOST_TQ_CODEC_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "tables.h"

#define TQ_MAX_M 128

/* ---- fp16: round to nearest even, subnormals kept, clamped to +-65504 (§4.5) ---- */
static inline uint16_t tq_half(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7bffu); /* rounds past 65504: clamp */
    if (a < 0x38800000u) {                                   /* subnormal or zero in half */
        if (a < 0x33000000u) return (uint16_t)sign;          /* below half of the least */
        uint32_t e = a >> 23, mant = (a & 0x7fffffu) | 0x800000u, sh = 126 - e; /* 14..24 */
        uint32_t h = mant >> sh, rem = mant & ((1u << sh) - 1u), half = 1u << (sh - 1);
        if (rem > half || (rem == half && (h & 1u))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((a - 0x38000000u) >> 13), rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

static inline float tq_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 0x3ffu, x;
    if (e == 0) {
        float f = ldexpf((float)m, -24);
        return sign ? -f : f;
    }
    if (e == 31)
        x = sign | 0x7f800000u | (m << 13);
    else
        x = sign | ((e + 112u) << 23) | (m << 13);
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* ---- tables ---- */

typedef struct tq_tables {
    int m, bits, levels;
    const uint32_t *signs; /* 4 streams of m bits: D1, D2, D3, D4 */
    const float *c;        /* codebook, ascending, `levels` entries */
    float bnd[15];         /* boundaries: midpoints of adjacent centroids */
    float rs;              /* 1 / sqrt(m) */
    float kappa;           /* sqrt(pi / 2) / sqrt(m): the QJL scale for an orthonormal P */
} tq_tables;

/* Fills t for blocks of m and codes of `bits` bits; -1 (and t for 128 and 3) for others */
static inline int tq_tables_for(tq_tables *t, int m, int bits) {
    int bad = (m != 64 && m != 128) || (bits != 3 && bits != 4);
    if (bad) m = 128, bits = 3;
    t->m = m;
    t->bits = bits;
    t->levels = 1 << bits;
    t->signs = m == 64 ? TQ_SIGNS64 : TQ_SIGNS128;
    t->c = m == 64 ? (bits == 3 ? TQ_CB64_3 : TQ_CB64_4) : (bits == 3 ? TQ_CB128_3 : TQ_CB128_4);
    for (int i = 0; i + 1 < t->levels; i++) t->bnd[i] = 0.5f * (t->c[i] + t->c[i + 1]);
    t->rs = (float)(1.0 / sqrt((double)m));
    t->kappa = (float)(sqrt(M_PI / 2.0) / sqrt((double)m));
    return bad ? -1 : 0;
}

/* Sign of stream s (0: D1 .. 3: D4) at i, as +-1 */
static inline float tq_sign(const tq_tables *t, int s, int i) {
    const uint32_t *w = t->signs + s * (t->m / 32);
    return (w[i >> 5] >> (i & 31)) & 1u ? -1.0f : 1.0f;
}

/* In-place Walsh-Hadamard transform, natural order, then * 1/sqrt(m) (§4.2) */
static inline void tq_fwht(float *x, int m, float rs) {
    for (int h = 1; h < m; h *= 2)
        for (int i = 0; i < m; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
    for (int i = 0; i < m; i++) x[i] *= rs;
}

/* x <- Da Hn Db x (forward R: a = D2, b = D1; inverse R^T: a = D1, b = D2; P: D4, D3) */
static inline void tq_map(const tq_tables *t, float *x, int sa, int sb) {
    for (int i = 0; i < t->m; i++) x[i] *= tq_sign(t, sb, i);
    tq_fwht(x, t->m, t->rs);
    for (int i = 0; i < t->m; i++) x[i] *= tq_sign(t, sa, i);
}
#define TQ_R_FWD(t, x) tq_map(t, x, 1, 0)
#define TQ_R_INV(t, x) tq_map(t, x, 0, 1)
#define TQ_P_FWD(t, x) tq_map(t, x, 3, 2)
#define TQ_P_INV(t, x) tq_map(t, x, 2, 3)

/* The code of y: how many boundaries are <= y (a value on a boundary goes up) */
static inline uint32_t tq_code(const tq_tables *t, float y) {
    uint32_t c = 0;
    for (int i = 0; i + 1 < t->levels; i++) c += y >= t->bnd[i];
    return c;
}

static inline uint32_t tq_get(const uint32_t *w, int bits, int i) {
    uint32_t bit = (uint32_t)(i * bits), word = bit >> 5, off = bit & 31u;
    uint32_t v = w[word] >> off;
    if (off + (uint32_t)bits > 32) v |= w[word + 1] << (32 - off);
    return v & ((1u << bits) - 1u);
}

static inline void tq_put(uint32_t *w, int bits, int i, uint32_t v) {
    uint32_t bit = (uint32_t)(i * bits), word = bit >> 5, off = bit & 31u;
    w[word] |= v << off;
    if (off + (uint32_t)bits > 32) w[word + 1] |= v >> (32 - off);
}

/* Encodes the m values x. codes: bits*m/32 words, signs: m/32 words (qjl only), both
 * written whole; returns the two fp16 norms as lo | hi << 16. qjl: the key path of tq3
 * (plain norm, residual signs); otherwise the corrected norm. */
static inline uint32_t tq_encode(const tq_tables *t, const float *x, int qjl, uint32_t *codes,
                                 uint32_t *signs) {
    const int m = t->m;
    float u[TQ_MAX_M], y[TQ_MAX_M];
    memset(codes, 0, (size_t)(t->bits * m / 32) * 4);
    if (qjl) memset(signs, 0, (size_t)(m / 32) * 4);
    float ss = 0.0f;
    for (int i = 0; i < m; i++) ss += x[i] * x[i];
    float n = sqrtf(ss);
    if (!(n > 0.0f)) return 0; /* a zero block: all zero, decodes to zero */
    for (int i = 0; i < m; i++) u[i] = x[i] / n;
    memcpy(y, u, (size_t)m * 4);
    TQ_R_FWD(t, y);
    float rho = 0.0f;
    for (int i = 0; i < m; i++) {
        uint32_t c = tq_code(t, y[i]);
        tq_put(codes, t->bits, i, c);
        y[i] = t->c[c];
        rho += y[i] * y[i];
    }
    if (!qjl) return tq_half(n / sqrtf(rho));
    TQ_R_INV(t, y); /* the unit vector's reconstruction, original basis */
    float g2 = 0.0f;
    for (int i = 0; i < m; i++) {
        y[i] = u[i] - y[i];
        g2 += y[i] * y[i];
    }
    TQ_P_FWD(t, y);
    for (int i = 0; i < m; i++)
        if (y[i] >= 0.0f) signs[i >> 5] |= 1u << (i & 31);
    return (uint32_t)tq_half(n) | (uint32_t)tq_half(sqrtf(g2)) << 16;
}

/* The m values a block decodes to (what attention over its codes computes with). */
static inline void tq_decode(const tq_tables *t, const uint32_t *codes, const uint32_t *signs,
                             uint32_t norms, int qjl, float *out) {
    const int m = t->m;
    float s = tq_float((uint16_t)(norms & 0xffffu));
    for (int i = 0; i < m; i++) out[i] = t->c[tq_get(codes, t->bits, i)];
    TQ_R_INV(t, out);
    if (qjl) {
        float z[TQ_MAX_M], g = tq_float((uint16_t)(norms >> 16)) * t->kappa;
        for (int i = 0; i < m; i++) z[i] = (signs[i >> 5] >> (i & 31)) & 1u ? 1.0f : -1.0f;
        TQ_P_INV(t, z);
        for (int i = 0; i < m; i++) out[i] += g * z[i];
    }
    for (int i = 0; i < m; i++) out[i] *= s;
}

#endif
