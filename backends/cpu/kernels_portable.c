/* Plain C inner loops: the reference path and the fallback on CPUs without a SIMD table.
 * Also the scalar conversions every path uses for its tails. */
#include "kernels.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float cpu_f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, em = h & 0x7fff;
    if (em >= 0x7c00) /* inf, or NaN made quiet like F16C and NEON do */
        return bits_f32(sign | (em << 13) | 0x7f800000 | (em > 0x7c00 ? 0x400000u : 0));
    if (em < 0x400) /* zero or subnormal: em * 2^-24 is exact in f32 */
        return bits_f32(sign | f32_bits((float)em * 0x1p-24f));
    return bits_f32(sign | ((em << 13) + (112u << 23))); /* normal: rebias the exponent */
}

uint16_t cpu_f32_to_f16(float f) {
    const uint32_t u = f32_bits(f);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    const uint32_t a = u & 0x7fffffff;
    if (a > 0x7f800000) /* NaN: quiet, top of the payload kept (what F16C does) */
        return (uint16_t)(sign | 0x7e00 | ((a >> 13) & 0x3ff));
    /* 65520 is the midpoint between 65504 (odd mantissa) and 65536: it and everything
     * above round to inf. */
    if (a >= 0x477ff000) return (uint16_t)(sign | 0x7c00);
    if (a < 0x38800000) { /* below 2^-14: an f16 subnormal or zero */
        const uint32_t e = a >> 23;
        /* |f| < 2^-25 (also every f32 subnormal) rounds to 0; 2^-25 itself ties to 0. */
        if (e < 102) return sign;
        /* |f| = mant * 2^(e-150); the f16 subnormal mantissa is |f| * 2^24. */
        const uint32_t mant = (a & 0x7fffff) | 0x800000, sh = 126 - e; /* 14..24 */
        uint32_t r = mant >> sh;
        const uint32_t rem = mant & ((1u << sh) - 1), half = 1u << (sh - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    /* Normal: rebias the exponent, round the 13 dropped bits to nearest even. A carry
     * into the exponent is the right result. */
    uint32_t r = (a >> 13) - (112u << 10);
    const uint32_t rem = a & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
    return (uint16_t)(sign | r);
}

float cpu_bf16_to_f32(uint16_t h) {
    return bits_f32((uint32_t)h << 16);
}

uint16_t cpu_f32_to_bf16(float f) {
    const uint32_t u = f32_bits(f);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

/* ---- conversions of arrays ---- */

/* Bulk f16 goes through a table of all 65536 values (256 KiB, built once): one load per
 * element, where computing it costs a few branches that compilers do not vectorize. */
static uint32_t f16_table[65536];
static pthread_once_t f16_table_once = PTHREAD_ONCE_INIT;

static void f16_table_init(void) {
    for (uint32_t h = 0; h < 65536; h++) f16_table[h] = f32_bits(cpu_f16_to_f32((uint16_t)h));
}

static inline const uint32_t *f16_lut(void) {
    pthread_once(&f16_table_once, f16_table_init);
    return f16_table;
}

static void p_f16_to_f32(const uint16_t *x, float *y, int64_t n) {
    const uint32_t *t = f16_lut();
    for (int64_t i = 0; i < n; i++) y[i] = bits_f32(t[x[i]]);
}

static void p_bf16_to_f32(const uint16_t *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = cpu_bf16_to_f32(x[i]);
}

static void p_f32_to_f16(const float *x, uint16_t *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = cpu_f32_to_f16(x[i]);
}

static void p_f32_to_bf16(const float *x, uint16_t *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = cpu_f32_to_bf16(x[i]);
}

/* ---- dot products and axpy ---- */

/* Eight partial sums: independent chains the compiler can keep in one vector register. */
static float dot_ff(const float *a, const float *b, int64_t n) {
    float s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += a[i + j] * b[i + j];
    for (; i < n; i++) s[0] += a[i] * b[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* f16 / bf16 operands go through a small f32 buffer in blocks. */
#define CONV_BLOCK 256

static float p_dot_f32(const float *a, const float *b, int64_t n) {
    return dot_ff(a, b, n);
}

static float p_dot_f16(const float *a, const uint16_t *b, int64_t n) {
    float buf[CONV_BLOCK], s = 0;
    for (int64_t i = 0; i < n; i += CONV_BLOCK) {
        int64_t m = n - i < CONV_BLOCK ? n - i : CONV_BLOCK;
        p_f16_to_f32(b + i, buf, m);
        s += dot_ff(a + i, buf, m);
    }
    return s;
}

static float p_dot_bf16(const float *a, const uint16_t *b, int64_t n) {
    float buf[CONV_BLOCK], s = 0;
    for (int64_t i = 0; i < n; i += CONV_BLOCK) {
        int64_t m = n - i < CONV_BLOCK ? n - i : CONV_BLOCK;
        p_bf16_to_f32(b + i, buf, m);
        s += dot_ff(a + i, buf, m);
    }
    return s;
}

static void p_axpy_f32(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

static void p_axpby_f32(float *y, float a, float b, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = a * y[i] + b * x[i];
}

static void p_axpy_f16(float *y, float a, const uint16_t *x, int64_t n) {
    const uint32_t *t = f16_lut();
    for (int64_t i = 0; i < n; i++) y[i] += a * bits_f32(t[x[i]]);
}

static void p_axpy_bf16(float *y, float a, const uint16_t *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * cpu_bf16_to_f32(x[i]);
}

/* ---- matmul ---- */

/* Four weight rows at a time, block by block of k, are made f32 once (in L1) and used for
 * every x row, so the weights are read from memory once whatever n is and each block of
 * an x row is read once per four weight rows. */
#define MM_ROWS 4
#define MM_KC   1024

#define DEFINE_MATMUL(NAME, WT, CONVERT)                                                           \
    static void NAME(const float *x, int64_t n, int64_t k_dim, const WT *w, int64_t o0,            \
                     int64_t o1, float *y, int64_t ldy) {                                          \
        float buf[MM_ROWS][MM_KC];                                                                 \
        for (int64_t o = o0; o < o1; o += MM_ROWS) {                                               \
            const int rows = o1 - o < MM_ROWS ? (int)(o1 - o) : MM_ROWS;                           \
            for (int64_t r = 0; r < n; r++)                                                        \
                for (int j = 0; j < rows; j++) y[r * ldy + o + j] = 0;                             \
            for (int64_t k0 = 0; k0 < k_dim; k0 += MM_KC) {                                        \
                const int64_t kc = k_dim - k0 < MM_KC ? k_dim - k0 : MM_KC;                        \
                const float *wr[MM_ROWS];                                                          \
                for (int j = 0; j < rows; j++)                                                     \
                    wr[j] = CONVERT(w + (o + j) * k_dim + k0, buf[j], kc);                         \
                for (int64_t r = 0; r < n; r++)                                                    \
                    for (int j = 0; j < rows; j++)                                                 \
                        y[r * ldy + o + j] += dot_ff(x + r * k_dim + k0, wr[j], kc);               \
            }                                                                                      \
        }                                                                                          \
    }

static inline const float *conv_none(const float *w, float *buf, int64_t n) {
    (void)buf;
    (void)n;
    return w;
}

static inline const float *conv_f16(const uint16_t *w, float *buf, int64_t n) {
    p_f16_to_f32(w, buf, n);
    return buf;
}

static inline const float *conv_bf16(const uint16_t *w, float *buf, int64_t n) {
    p_bf16_to_f32(w, buf, n);
    return buf;
}

DEFINE_MATMUL(p_matmul_f32, float, conv_none)
DEFINE_MATMUL(p_matmul_f16, uint16_t, conv_f16)
DEFINE_MATMUL(p_matmul_bf16, uint16_t, conv_bf16)

/* ---- attention (kernels.h: attn_*) ---- */

#define DEFINE_ATTN(T, WT)                                                                         \
    static void p_attn_scores_##T(const float *q, int G, int64_t d, const WT *K, int64_t ldk,      \
                                  int64_t n, float scale, float *s, int64_t lds) {                 \
        for (int64_t i = 0; i < n; i++)                                                            \
            for (int g = 0; g < G; g++)                                                            \
                s[g * lds + i] = p_dot_##T(q + g * d, K + i * ldk, d) * scale;                     \
    }                                                                                              \
    static void p_attn_values_##T(const float *p, int G, int64_t lds, const WT *V, int64_t ldv,    \
                                  int64_t n, int64_t dv, float *o) {                               \
        for (int64_t i = 0; i < n; i++)                                                            \
            for (int g = 0; g < G; g++) p_axpy_##T(o + g * dv, p[g * lds + i], V + i * ldv, dv);   \
    }

DEFINE_ATTN(f32, float)
DEFINE_ATTN(f16, uint16_t)
DEFINE_ATTN(bf16, uint16_t)

static float p_attn_softmax(float *s, int64_t n, float cap, float *mx) {
    if (cap > 0)
        for (int64_t i = 0; i < n; i++) s[i] = cap * tanhf(s[i] / cap);
    float m = s[0];
    for (int64_t i = 1; i < n; i++) m = s[i] > m ? s[i] : m;
    *mx = m;
    float sum = 0;
    for (int64_t i = 0; i < n; i++) {
        s[i] = expf(s[i] - m);
        sum += s[i];
    }
    return sum;
}

/* The multiply-add probe (cpu_kernels.fma_loop) in plain C, as the portable products are:
 * P_ACC independent chains, which the compiler may vectorise as it does those. */
#define P_ACC 16
static float p_fma_loop(int64_t iters, float m, float c) {
    float acc[P_ACC];
    for (int j = 0; j < P_ACC; j++) acc[j] = (float)j;
    for (int64_t i = 0; i < iters; i++)
        for (int j = 0; j < P_ACC; j++) acc[j] = acc[j] * m + c;
    float s = 0;
    for (int j = 0; j < P_ACC; j++) s += acc[j];
    return s;
}

const cpu_kernels cpu_kernels_portable = {
    .name = "portable",
    .kblock = MM_KC,
    .matmul_f32 = p_matmul_f32,
    .matmul_f16 = p_matmul_f16,
    .matmul_bf16 = p_matmul_bf16,
    .dot_f32 = p_dot_f32,
    .dot_f16 = p_dot_f16,
    .dot_bf16 = p_dot_bf16,
    .axpy_f32 = p_axpy_f32,
    .attn_scores_f32 = p_attn_scores_f32,
    .attn_scores_f16 = p_attn_scores_f16,
    .attn_scores_bf16 = p_attn_scores_bf16,
    .attn_softmax = p_attn_softmax,
    .attn_values_f32 = p_attn_values_f32,
    .attn_values_f16 = p_attn_values_f16,
    .attn_values_bf16 = p_attn_values_bf16,
    .axpby_f32 = p_axpby_f32,
    .axpy_f16 = p_axpy_f16,
    .axpy_bf16 = p_axpy_bf16,
    .f16_to_f32 = p_f16_to_f32,
    .bf16_to_f32 = p_bf16_to_f32,
    .f32_to_f16 = p_f32_to_f16,
    .f32_to_bf16 = p_f32_to_bf16,
    .fma_loop = p_fma_loop,
    .fma_flops = 2 * P_ACC,
};
