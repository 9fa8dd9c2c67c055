/* Quantized kernels in portable C, the helpers every path shares, and the choice of table. */
#include "qkernels.h"
#include "kernels.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

void cpu_q_pack(const uint32_t *codes, int64_t n, int bits, uint32_t *words) {
    memset(words, 0, (size_t)(n * bits / 32) * sizeof *words);
    for (int64_t j = 0; j < n; j++) {
        int64_t bit = j * bits;
        words[bit / 32] |= codes[j] << (bit % 32);
        if (bit % 32 + bits > 32) words[bit / 32 + 1] |= codes[j] >> (32 - bit % 32);
    }
}

float cpu_q_sb(const cpu_qmat *w, const void *p, int64_t i) {
    switch (w->sb) {
    case 0:
        return ((const float *)p)[i];
    case 1:
        return cpu_f16_to_f32(((const uint16_t *)p)[i]);
    default:
        return cpu_bf16_to_f32(((const uint16_t *)p)[i]);
    }
}

/* A group starts on a word boundary (group * bits is a multiple of 32): stream its words
 * through a 64-bit buffer. */
static void unpack_group(const uint32_t *wp, int32_t group, int bits, float *out) {
    uint64_t buf = 0;
    int have = 0;
    const uint32_t mask = (1u << bits) - 1;
    for (int32_t k = 0; k < group; k++) {
        if (have < bits) {
            buf |= (uint64_t)*wp++ << have;
            have += 32;
        }
        out[k] = (float)((uint32_t)buf & mask);
        buf >>= bits;
        have -= bits;
    }
}

static void dequant_portable(const cpu_qmat *w, int64_t row, int64_t k0, int64_t k1, float *y) {
    const int64_t gw = (int64_t)w->group * w->bits / 32;
    for (int64_t g = k0 / w->group; g < k1 / w->group; g++) {
        float *yp = y + g * w->group - k0;
        unpack_group(w->q + row * w->wpr + g * gw, w->group, w->bits, yp);
        float s = cpu_q_sb(w, w->scales, row * w->gpr + g);
        float b = cpu_q_sb(w, w->biases, row * w->gpr + g);
        for (int32_t k = 0; k < w->group; k++) yp[k] = fmaf(yp[k], s, b);
    }
}

const int8_t cpu_mx_lut2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static void dequant_mx_portable(const cpu_qmat *w, int64_t row, int64_t k0, int64_t k1, float *y) {
    const uint8_t *rb = (const uint8_t *)(w->q + row * w->wpr);
    const uint8_t *sc = (const uint8_t *)w->scales + row * w->gpr;
    for (int64_t g = k0 / 32; g < k1 / 32; g++) {
        const float hs = cpu_mx_half_scale(sc[g]);
        const uint8_t *p = rb + g * 16;
        float *yg = y + g * 32 - k0;
        for (int i = 0; i < 16; i++) {
            yg[2 * i] = (float)cpu_mx_lut2[p[i] & 15] * hs;
            yg[2 * i + 1] = (float)cpu_mx_lut2[p[i] >> 4] * hs;
        }
    }
}

const cpu_qkernels cpu_qkernels_portable = {
    .name = "portable",
    .dequant = dequant_portable,
    .matvec = NULL, /* the row-by-row path of cpu_q_matmul: the f32 kernel's dot products */
    .dequant_mx = dequant_mx_portable,
    .matvec_mx = NULL,
};

void cpu_q_matmul(const cpu_kernels *k, const cpu_qkernels *qk, const float *x, int64_t n,
                  const cpu_qmat *w, int64_t o0, int64_t o1, float *y, int64_t ldy, float *buf) {
    const int64_t in = w->in;
    void (*matvec)(const cpu_qmat *, const float *, int64_t, int64_t, float *, int64_t) =
        w->sb == CPU_Q_MX ? qk->matvec_mx : qk->matvec;
    if (n == 1 && matvec) {
        matvec(w, x, o0, o1, y, k->kblock);
        return;
    }
    if (buf) {
        for (int64_t ob = o0; ob < o1; ob += CPU_Q_ROWS) {
            const int64_t oc = o1 - ob < CPU_Q_ROWS ? o1 - ob : CPU_Q_ROWS;
            for (int64_t i = 0; i < oc; i++) cpu_q_dequant(qk, w, ob + i, 0, in, buf + i * in);
            k->matmul_f32(x, n, in, buf, 0, oc, y + ob, ldy);
        }
        return;
    }
    /* No buffer: one row at a time, block by block of k, adding the partial
     * sums in order as matmul_f32 does, which gives the same bits. */
    float part[1024], yo;
    const int64_t kb = k->kblock < 1024 ? k->kblock : 1024;
    for (int64_t r = 0; r < n; r++)
        for (int64_t o = o0; o < o1; o++) {
            for (int64_t k0 = 0; k0 < in; k0 += kb) {
                const int64_t kc = in - k0 < kb ? in - k0 : kb;
                cpu_q_dequant(qk, w, o, k0, k0 + kc, part);
                k->matmul_f32(x + r * in + k0, 1, kc, part, 0, 1, &yo, 1);
                y[r * ldy + o] = k0 > 0 ? y[r * ldy + o] + yo : yo;
            }
        }
}

/* ---- fast mode: int8 activations ---------------------------------------------------- */

static size_t up64(size_t b) {
    return (b + 63) & ~(size_t)63;
}

size_t cpu_q8_bytes(int64_t n, int64_t in, int32_t group) {
    const size_t ng = (size_t)(n * (in / group));
    return up64((size_t)(n * in)) + 3 * up64(ng * 4);
}

void cpu_q8_quantize(const float *x, int64_t n, int64_t in, int32_t group, void *mem,
                     cpu_q8act *a) {
    const int64_t gpr = in / group, ng = n * gpr;
    uint8_t *m = mem;
    a->n = n;
    a->in = in;
    a->group = group;
    a->q = (int8_t *)m;
    a->d = (float *)(m + up64((size_t)(n * in)));
    a->xs = (float *)((uint8_t *)a->d + up64((size_t)ng * 4));
    a->isum = (int32_t *)((uint8_t *)a->xs + up64((size_t)ng * 4));
    for (int64_t g = 0; g < ng; g++) {
        const float *xg = x + g * group;
        int8_t *qg = a->q + g * group;
        float amax = 0;
        for (int32_t i = 0; i < group; i++) {
            const float v = fabsf(xg[i]);
            amax = v > amax ? v : amax; /* a NaN never wins: its group quantizes finite */
        }
        const float d = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
        int32_t sum = 0;
        for (int32_t i = 0; i < group; i++) {
            /* round half to even: adding and taking away 1.5 * 2^23 leaves |v| <= 127.x
             * rounded to an integer in the default rounding mode */
            float v = xg[i] * id;
            v = (v + 12582912.0f) - 12582912.0f;
            int32_t qi = v > 127.0f ? 127 : v < -127.0f ? -127 : (int32_t)v;
            qg[i] = (int8_t)qi;
            sum += qi;
        }
        a->d[g] = d;
        a->isum[g] = sum;
        a->xs[g] = d * (float)sum;
    }
}

void cpu_q8_matmul(const cpu_q8kernel *k, const cpu_q8act *a, const cpu_qmat *w, int64_t o0,
                   int64_t o1, float *y, int64_t ldy, uint8_t *scratch) {
    const int64_t in = a->in, gpr = in / a->group;
    if (w->sb == CPU_Q_MX) { /* one row function for decode and prefill alike */
        cpu_q8_rows_fn rows = k->rows_mx ? k->rows_mx : cpu_q8_mx_rows_portable;
        for (int64_t r = 0; r < a->n; r++)
            rows(w, a->q + r * in, a->d + r * gpr, a->xs + r * gpr, a->isum + r * gpr, o0, o1,
                 y + r * ldy);
        return;
    }
    if (a->n == 1) {
        k->rows(w, a->q, a->d, a->xs, a->isum, o0, o1, y);
        return;
    }
    /* a block of weight rows stays in cache while every activation row uses it; each
     * (row, activation row) pair goes through the same row function as decode */
    const int64_t stride = (in + 63) & ~(int64_t)63;
    for (int64_t ob = o0; ob < o1; ob += CPU_Q8_ROWS) {
        const int64_t oe = o1 - ob < CPU_Q8_ROWS ? o1 : ob + CPU_Q8_ROWS;
        if (scratch && k->unpack && k->rows_u8) {
            k->unpack(w, ob, oe, scratch, stride);
            for (int64_t r = 0; r < a->n; r++)
                k->rows_u8(w, scratch, ob, stride, a->q + r * in, a->d + r * gpr, a->xs + r * gpr,
                           a->isum + r * gpr, ob, oe, y + r * ldy);
            continue;
        }
        for (int64_t r = 0; r < a->n; r++)
            k->rows(w, a->q + r * in, a->d + r * gpr, a->xs + r * gpr, a->isum + r * gpr, ob, oe,
                    y + r * ldy);
    }
}

/* Microscaled rows, portable: per block the exact integer sum of the codes' integers
 * (cpu_mx_lut2) times the int8 activations, then acc += (2^(s - 128) d) isum in block
 * order. */
void cpu_q8_mx_rows_portable(const cpu_qmat *w, const int8_t *xq, const float *xd, const float *xs,
                             const int32_t *xi, int64_t o0, int64_t o1, float *y) {
    (void)xs;
    (void)xi;
    for (int64_t o = o0; o < o1; o++) {
        const uint8_t *rb = (const uint8_t *)(w->q + o * w->wpr);
        const uint8_t *sc = (const uint8_t *)w->scales + o * w->gpr;
        float acc = 0;
        for (int64_t g = 0; g < w->gpr; g++) {
            const uint8_t *p = rb + g * 16;
            const int8_t *x = xq + g * 32;
            int32_t isum = 0;
            for (int i = 0; i < 16; i++)
                isum += cpu_mx_lut2[p[i] & 15] * x[2 * i] + cpu_mx_lut2[p[i] >> 4] * x[2 * i + 1];
            acc += cpu_mx_half_scale(sc[g]) * xd[g] * (float)isum;
        }
        y[o] = acc;
    }
}

/* Portable: per group the exact integer sum, then acc += (s d) isum and accb += b xs in
 * group order; y = acc + accb. */
static void q8_rows_portable(const cpu_qmat *w, const int8_t *xq, const float *xd, const float *xs,
                             const int32_t *xi, int64_t o0, int64_t o1, float *y) {
    (void)xi;
    const int32_t G = w->group, bits = w->bits;
    const uint32_t mask = (1u << bits) - 1;
    const int64_t gw = (int64_t)G * bits / 32;
    for (int64_t o = o0; o < o1; o++) {
        float acc = 0, accb = 0;
        for (int64_t g = 0; g < w->gpr; g++) {
            const uint32_t *p = w->q + o * w->wpr + g * gw;
            const int8_t *x = xq + g * G;
            uint64_t buf = 0;
            int have = 0;
            int32_t isum = 0;
            for (int32_t k = 0; k < G; k++) {
                if (have < bits) {
                    buf |= (uint64_t)*p++ << have;
                    have += 32;
                }
                isum += (int32_t)((uint32_t)buf & mask) * x[k];
                buf >>= bits;
                have -= bits;
            }
            const float s = cpu_q_sb(w, w->scales, o * w->gpr + g);
            const float b = cpu_q_sb(w, w->biases, o * w->gpr + g);
            const float sd = s * xd[g], bx = b * xs[g];
            acc += sd * (float)isum;
            accb += bx;
        }
        y[o] = acc + accb;
    }
}

static const cpu_q8kernel q8_portable = {.name = "portable-i8", .rows = q8_rows_portable};

#if defined(__x86_64__)
#include <cpuid.h>
extern const cpu_q8kernel cpu_q8kernel_avx2, cpu_q8kernel_avx512;
/* AVX512-VBMI (leaf 7 ecx bit 1) and AVX512-VNNI (ecx bit 11); the avx512 table's own
 * checks (F, BW, VL, the OS saving the registers) come first. */
static int has_vnni_vbmi(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    return (c & (1u << 1)) && (c & (1u << 11));
}
#elif defined(__aarch64__)
extern const cpu_q8kernel cpu_q8kernel_neon;
#if defined(__ARM_FEATURE_DOTPROD)
extern const cpu_q8kernel cpu_q8kernel_neon_dot;
#endif
#endif

static int has_table(const char *name) {
    for (const cpu_kernels *const *k = cpu_kernels_available(); *k; k++)
        if (strcmp((*k)->name, name) == 0) return 1;
    return 0;
}

const cpu_q8kernel *cpu_q8kernel_for(const cpu_qkernels *qk) {
    const char *name = qk ? qk->name : "";
#if defined(__x86_64__)
    if (strcmp(name, "avx512") == 0)
        return has_vnni_vbmi() ? &cpu_q8kernel_avx512 : &cpu_q8kernel_avx2;
    if (strcmp(name, "avx2") == 0) return &cpu_q8kernel_avx2;
#elif defined(__aarch64__)
    if (strcmp(name, "neon") == 0) {
#if defined(__ARM_FEATURE_DOTPROD)
        return &cpu_q8kernel_neon_dot;
#else
        return &cpu_q8kernel_neon;
#endif
    }
#endif
    return &q8_portable;
}

static const cpu_q8kernel *q8_list[5];
static pthread_once_t q8_once = PTHREAD_ONCE_INIT;
static void fill_q8_list(void) {
    const cpu_q8kernel **list = q8_list;
    {
        int i = 0;
#if defined(__x86_64__)
        if (has_table("avx512") && has_vnni_vbmi()) list[i++] = &cpu_q8kernel_avx512;
        if (has_table("avx2")) list[i++] = &cpu_q8kernel_avx2;
#elif defined(__aarch64__)
#if defined(__ARM_FEATURE_DOTPROD)
        list[i++] = &cpu_q8kernel_neon_dot;
#endif
        list[i++] = &cpu_q8kernel_neon;
#endif
        (void)has_table;
        list[i++] = &q8_portable;
        list[i] = NULL;
    }
}

const cpu_q8kernel *const *cpu_q8kernels_available(void) {
    pthread_once(&q8_once, fill_q8_list);
    return q8_list;
}

#if defined(__x86_64__)
extern const cpu_qkernels cpu_qkernels_avx2, cpu_qkernels_avx512;
#elif defined(__aarch64__)
extern const cpu_qkernels cpu_qkernels_neon;
#endif

const cpu_qkernels *cpu_qkernels_for(const char *name) {
    static const cpu_qkernels *const all[] = {
#if defined(__x86_64__)
        &cpu_qkernels_avx2,
        &cpu_qkernels_avx512,
#elif defined(__aarch64__)
        &cpu_qkernels_neon,
#endif
        &cpu_qkernels_portable
    };
    for (size_t i = 0; name && i < sizeof all / sizeof all[0]; i++)
        if (strcmp(all[i]->name, name) == 0) return all[i];
    return &cpu_qkernels_portable;
}
