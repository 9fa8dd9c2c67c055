/* Checks every kernel table this CPU runs against a double-precision reference, and the
 * tables against each other.
 *
 * Tolerance. A sum of K products accumulated in f32 in any order (lanes, blocks, tree
 * reductions, FMA or not) is off by at most gamma_(K+1) * sum|x_k * w_k|, where
 * gamma_m ~ m * 2^-24 (Higham, Accuracy and Stability, 3.1): every product and partial
 * sum is rounded at most once per addition it goes through, and no term goes through
 * more than K. The checks use that bound, (K + 2) * 2^-24 * sum|x_k * w_k|, which is
 * safe for every path; paths against each other get twice it. Because that bound is
 * loose for large K, each shape is also run with small integers, where every partial
 * sum is an integer below 2^24 and so exact in f32: there all paths must give exactly
 * the reference, which catches any element used twice, skipped or misplaced. */
#include "kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define HAVE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HAVE_ASAN 1
#endif
#endif
#ifdef HAVE_ASAN
#include <sanitizer/asan_interface.h>
#define POISON(p, n)   ASAN_POISON_MEMORY_REGION(p, n)
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define POISON(p, n)   ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

static int failures;
static int checks;

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        if (failures < 60) {                                                                       \
            printf("FAIL: ");                                                                      \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
        }                                                                                          \
        failures++;                                                                                \
    } while (0)

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* xorshift64*: reproducible data without libc's rand. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd64(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}
static uint32_t rnd32(void) {
    return (uint32_t)(rnd64() >> 32);
}
static double rnd_unit(void) {
    return (double)(rnd64() >> 11) * 0x1p-53 * 2.0 - 1.0;
}

/* ---------- reference conversions ---------- */

static double ref_f16_value(uint16_t h) { /* finite h only */
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
    return (h & 0x8000) ? -v : v;
}

/* Nearest f16, ties to even, by search over the ordered positive encodings. */
static uint16_t ref_f32_to_f16(float f) {
    uint32_t u = f2u(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    if (isnan(f)) return (uint16_t)(sign | 0x7e00 | ((u >> 13) & 0x3ff));
    double a = fabs((double)f);
    if (a >= 65520.0) return sign | 0x7c00;
    unsigned lo = 0, hi = 0x7bff; /* largest h with value(h) <= a */
    while (lo < hi) {
        unsigned mid = (lo + hi + 1) / 2;
        if (ref_f16_value((uint16_t)mid) <= a)
            lo = mid;
        else
            hi = mid - 1;
    }
    double vlo = ref_f16_value((uint16_t)lo);
    double vhi = lo == 0x7bff ? 65536.0 : ref_f16_value((uint16_t)(lo + 1));
    double dlo = a - vlo, dhi = vhi - a;
    unsigned h = (dlo < dhi || (dlo == dhi && (lo & 1) == 0)) ? lo : lo + 1;
    return (uint16_t)(sign | h);
}

static uint32_t ref_f16_to_f32_bits(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    if ((h & 0x7c00) == 0x7c00) {
        uint32_t m = h & 0x3ff;
        return sign | 0x7f800000 | (m ? 0x400000 | (m << 13) : 0);
    }
    return f2u((float)ref_f16_value(h)) | sign; /* | sign keeps -0 */
}

static uint16_t ref_f32_to_bf16(float f) {
    uint32_t u = f2u(f);
    if (isnan(f)) return (uint16_t)((u >> 16) | 0x40);
    uint32_t lo = u >> 16, sign = lo & 0x8000, mag = lo & 0x7fff;
    double a = fabs((double)f);
    double vlo = fabs((double)u2f(mag << 16));
    double vhi = mag == 0x7f7f ? ldexp(1.0, 128) : fabs((double)u2f((mag + 1) << 16));
    if (mag >= 0x7f80) return (uint16_t)lo; /* inf */
    double dlo = a - vlo, dhi = vhi - a;
    uint32_t h = (dlo < dhi || (dlo == dhi && (mag & 1) == 0)) ? mag : mag + 1;
    return (uint16_t)(sign | h);
}

/* Interesting f32 inputs for conversions: every f16 value, every midpoint between
 * neighbours (ties), one f32 ulp either side, the edges, specials and random bits. */
static float *conv_inputs(size_t *count) {
    size_t cap = 65536 * 6 + 400000, n = 0;
    float *v = malloc(cap * sizeof *v);
    for (uint32_t h = 0; h < 0x7c00; h++) {
        float a = (float)ref_f16_value((uint16_t)h);
        float b = h == 0x7bff ? 65536.0f : (float)ref_f16_value((uint16_t)(h + 1));
        float mid = (float)(((double)a + (double)b) / 2); /* exact: needs 12 bits */
        v[n++] = a;
        v[n++] = -mid;
        v[n++] = mid;
        v[n++] = nextafterf(mid, 0);
        v[n++] = -nextafterf(mid, INFINITY);
        v[n++] = nextafterf(a, INFINITY);
    }
    const uint32_t special[] = {0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000,
                                0xffc00000, 0x7f800001, 0xff800001, 0x7fa5a5a5, 0x7fffffff,
                                0x00000001, 0x807fffff, 0x7f7fffff, 0xff7fffff, 0x33000000,
                                0x33000001, 0x32ffffff, 0x33800000, 0x477ff000, 0x477fefff,
                                0x477fffff, 0x47800000, 0x3f808000, 0x3f818000, 0x3f808001,
                                0x7f7f8000, 0x7f7f7fff, 0x00008000, 0x00018000};
    for (size_t i = 0; i < sizeof special / sizeof *special; i++) v[n++] = u2f(special[i]);
    while (n < cap) v[n++] = u2f(rnd32());
    *count = n;
    return v;
}

static void test_scalar_conversions(const float *in, size_t nin) {
    for (uint32_t h = 0; h < 65536; h++) {
        uint32_t got = f2u(cpu_f16_to_f32((uint16_t)h)), want = ref_f16_to_f32_bits((uint16_t)h);
        checks++;
        if (got != want) FAIL("cpu_f16_to_f32(%04x) = %08x, want %08x", h, got, want);
        got = f2u(cpu_bf16_to_f32((uint16_t)h));
        checks++;
        if (got != h << 16) FAIL("cpu_bf16_to_f32(%04x) = %08x", h, got);
    }
    for (size_t i = 0; i < nin; i++) {
        uint16_t got = cpu_f32_to_f16(in[i]), want = ref_f32_to_f16(in[i]);
        checks++;
        if (got != want)
            FAIL("cpu_f32_to_f16(%08x = %g) = %04x, want %04x", f2u(in[i]), in[i], got, want);
        got = cpu_f32_to_bf16(in[i]);
        want = ref_f32_to_bf16(in[i]);
        checks++;
        if (got != want)
            FAIL("cpu_f32_to_bf16(%08x = %g) = %04x, want %04x", f2u(in[i]), in[i], got, want);
    }
    /* A few by hand, so the reference itself is checked too. */
    struct {
        float f;
        uint16_t h;
    } known[] = {{1.0f, 0x3c00},
                 {-2.0f, 0xc000},
                 {65504.0f, 0x7bff},
                 {65519.0f, 0x7bff},
                 {65520.0f, 0x7c00},
                 {0x1p-24f, 0x0001},
                 {0x1p-25f, 0x0000},
                 {0x1.8p-24f, 0x0002},
                 {0x1.000002p-25f, 0x0001},
                 {1.0f + 0x1p-11f, 0x3c00},
                 {1.0f + 0x3p-11f, 0x3c02},
                 {0x1p-14f, 0x0400},
                 {0x1.ff8p-15f, 0x03ff},
                 {0x1.ffcp-15f, 0x0400},
                 {0x1.ff4p-15f, 0x03fe}};
    for (size_t i = 0; i < sizeof known / sizeof *known; i++) {
        checks++;
        if (cpu_f32_to_f16(known[i].f) != known[i].h)
            FAIL("cpu_f32_to_f16(%a) = %04x, want %04x", known[i].f, cpu_f32_to_f16(known[i].f),
                 known[i].h);
    }
    checks += 3;
    if (cpu_f32_to_bf16(1.0f + 0x1p-8f) != 0x3f80) FAIL("bf16 tie to even (down)");
    if (cpu_f32_to_bf16(1.0f + 0x3p-8f) != 0x3f82) FAIL("bf16 tie to even (up)");
    if (cpu_f32_to_bf16(u2f(0x7f800001)) != 0x7fc0) FAIL("bf16 of a signalling NaN stays NaN");
}

/* Vector conversions must equal the scalar ones bit for bit, for every length (tails)
 * and offset (unaligned starts). */
static void test_vector_conversions(const cpu_kernels *k, const float *in, size_t nin) {
    const int64_t lens[] = {0,  1,  2,  3,  5,  7,  8,  9,   15,   16,
                            17, 31, 32, 33, 63, 64, 65, 100, 1000, 4097};
    for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
        for (int off = 0; off < 3; off++) {
            int64_t n = lens[li];
            size_t base = (size_t)(rnd64() % (nin - 5000));
            /* Exactly sized heap arrays, so ASan sees any read or write past the end. */
            float *f = malloc((size_t)n * 4 + 4), *g = malloc((size_t)n * 4 + 4);
            uint16_t *h = malloc((size_t)n * 2 + 2), *hs = malloc((size_t)n * 2 + 2);
            uint16_t *h2 = malloc((size_t)n * 2 + 2);
            for (int64_t i = 0; i < n; i++) {
                f[i] = in[base + (size_t)i];
                h2[i] = (uint16_t)rnd32();
            }
            k->f32_to_f16(f, h, n);
            for (int64_t i = 0; i < n; i++) {
                checks++;
                if (h[i] != cpu_f32_to_f16(f[i]))
                    FAIL("%s f32_to_f16 n=%lld [%lld] %08x -> %04x, want %04x", k->name,
                         (long long)n, (long long)i, f2u(f[i]), h[i], cpu_f32_to_f16(f[i]));
            }
            k->f32_to_bf16(f, hs, n);
            for (int64_t i = 0; i < n; i++) {
                checks++;
                if (hs[i] != cpu_f32_to_bf16(f[i]))
                    FAIL("%s f32_to_bf16 n=%lld [%lld] %08x -> %04x, want %04x", k->name,
                         (long long)n, (long long)i, f2u(f[i]), hs[i], cpu_f32_to_bf16(f[i]));
            }
            k->f16_to_f32(h2, g, n);
            for (int64_t i = 0; i < n; i++) {
                checks++;
                if (f2u(g[i]) != f2u(cpu_f16_to_f32(h2[i])))
                    FAIL("%s f16_to_f32 n=%lld [%lld] %04x -> %08x, want %08x", k->name,
                         (long long)n, (long long)i, h2[i], f2u(g[i]), f2u(cpu_f16_to_f32(h2[i])));
            }
            k->bf16_to_f32(h2, g, n);
            for (int64_t i = 0; i < n; i++) {
                checks++;
                if (f2u(g[i]) != (uint32_t)h2[i] << 16)
                    FAIL("%s bf16_to_f32 n=%lld [%lld] %04x -> %08x", k->name, (long long)n,
                         (long long)i, h2[i], f2u(g[i]));
            }
            free(f);
            free(g);
            free(h);
            free(hs);
            free(h2);
        }
    }
    /* All 65536 f16 and bf16 patterns in one go. */
    uint16_t *all = malloc(65536 * 2);
    float *out = malloc(65536 * 4);
    for (uint32_t i = 0; i < 65536; i++) all[i] = (uint16_t)i;
    k->f16_to_f32(all, out, 65536);
    for (uint32_t i = 0; i < 65536; i++) {
        checks++;
        if (f2u(out[i]) != ref_f16_to_f32_bits((uint16_t)i))
            FAIL("%s f16_to_f32(%04x) = %08x, want %08x", k->name, i, f2u(out[i]),
                 ref_f16_to_f32_bits((uint16_t)i));
    }
    free(all);
    free(out);
    /* The whole input set through the array conversions. */
    uint16_t *h = malloc(nin * 2);
    k->f32_to_f16(in, h, (int64_t)nin);
    for (size_t i = 0; i < nin; i++) {
        checks++;
        if (h[i] != ref_f32_to_f16(in[i]))
            FAIL("%s f32_to_f16(%08x) = %04x, want %04x", k->name, f2u(in[i]), h[i],
                 ref_f32_to_f16(in[i]));
    }
    k->f32_to_bf16(in, h, (int64_t)nin);
    for (size_t i = 0; i < nin; i++) {
        checks++;
        if (h[i] != ref_f32_to_bf16(in[i]))
            FAIL("%s f32_to_bf16(%08x) = %04x, want %04x", k->name, f2u(in[i]), h[i],
                 ref_f32_to_bf16(in[i]));
    }
    free(h);
}

/* ---------- data in the three weight types ---------- */

enum { DT_F32, DT_F16, DT_BF16 };
static const char *dt_name[] = {"f32", "f16", "bf16"};

/* Weights in dtype `dt`, plus their exact values as double. `integers`: small integers
 * (exact in every dtype); else uniform in [-1, 1) rounded to the dtype. */
typedef struct wbuf {
    void *raw;
    double *val;
} wbuf;

static wbuf make_weights(int dt, size_t count, int integers) {
    wbuf b;
    b.raw = malloc(count * (dt == DT_F32 ? 4 : 2) + 4);
    b.val = malloc(count * sizeof(double) + 8);
    for (size_t i = 0; i < count; i++) {
        float f = integers ? (float)((int)(rnd32() % 17) - 8) : (float)rnd_unit();
        if (dt == DT_F32) {
            ((float *)b.raw)[i] = f;
            b.val[i] = f;
        } else if (dt == DT_F16) {
            uint16_t h = cpu_f32_to_f16(f);
            ((uint16_t *)b.raw)[i] = h;
            b.val[i] = ref_f16_value(h);
        } else {
            uint16_t h = cpu_f32_to_bf16(f);
            ((uint16_t *)b.raw)[i] = h;
            b.val[i] = u2f((uint32_t)h << 16);
        }
    }
    return b;
}

static float *make_x(size_t count, int integers, double *val) {
    float *x = malloc(count * 4 + 4);
    for (size_t i = 0; i < count; i++) {
        x[i] = integers ? (float)((int)(rnd32() % 17) - 8) : (float)rnd_unit();
        val[i] = x[i];
    }
    return x;
}

static const double U = 0x1p-24;

/* ---------- dot, axpy and axpby ---------- */

static void test_dot_axpy(const cpu_kernels *const *tabs) {
    const int64_t lens[] = {0,  1,  2,  3,  5,  7,  8,  9,   15,   16,
                            17, 31, 32, 33, 63, 64, 65, 100, 1000, 4097};
    for (int integers = 0; integers < 2; integers++)
        for (int dt = 0; dt < 3; dt++)
            for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
                int64_t n = lens[li];
                double *av = malloc((size_t)n * 8 + 8);
                float *a = make_x((size_t)n, integers, av);
                wbuf b = make_weights(dt, (size_t)n, integers);
                double ref = 0, mag = 0;
                for (int64_t i = 0; i < n; i++) {
                    ref += av[i] * b.val[i];
                    mag += fabs(av[i] * b.val[i]);
                }
                const double tol = integers ? 0 : (double)(n + 2) * U * mag;
                float first = 0;
                for (const cpu_kernels *const *t = tabs; *t; t++) {
                    const cpu_kernels *k = *t;
                    float got = dt == DT_F32   ? k->dot_f32(a, b.raw, n)
                                : dt == DT_F16 ? k->dot_f16(a, b.raw, n)
                                               : k->dot_bf16(a, b.raw, n);
                    checks++;
                    if (!(fabs(got - ref) <= tol))
                        FAIL("%s dot_%s n=%lld%s: %.9g, want %.9g (tol %.3g)", k->name, dt_name[dt],
                             (long long)n, integers ? " (integers)" : "", got, ref, tol);
                    if (t == tabs) first = got;
                    checks++;
                    if (!(fabs(got - first) <= 2 * tol))
                        FAIL("%s dot_%s n=%lld: %.9g vs %s %.9g", k->name, dt_name[dt],
                             (long long)n, got, tabs[0]->name, first);

                    /* axpy: y = y0 + a * x, one rounding (or two without FMA) per element. */
                    const float alpha = integers ? 3.0f : 0.73f;
                    float *y = malloc((size_t)n * 4 + 4);
                    for (int64_t i = 0; i < n; i++) y[i] = (float)av[i];
                    if (dt == DT_F32)
                        k->axpy_f32(y, alpha, b.raw, n);
                    else if (dt == DT_F16)
                        k->axpy_f16(y, alpha, b.raw, n);
                    else
                        k->axpy_bf16(y, alpha, b.raw, n);
                    for (int64_t i = 0; i < n; i++) {
                        double want = av[i] + (double)alpha * b.val[i];
                        double t2 = integers ? 0 : 2 * U * (fabs(av[i]) + fabs(alpha * b.val[i]));
                        checks++;
                        if (!(fabs(y[i] - want) <= t2))
                            FAIL("%s axpy_%s n=%lld [%lld]: %.9g, want %.9g", k->name, dt_name[dt],
                                 (long long)n, (long long)i, y[i], want);
                    }
                    /* axpby (f32 only): y = a y0 + b x, two roundings or three */
                    if (dt == DT_F32) {
                        const float beta = integers ? -2.0f : 1.37f;
                        for (int64_t i = 0; i < n; i++) y[i] = (float)av[i];
                        k->axpby_f32(y, alpha, beta, b.raw, n);
                        for (int64_t i = 0; i < n; i++) {
                            double want = (double)alpha * av[i] + (double)beta * b.val[i];
                            double t2 = integers
                                            ? 0
                                            : 3 * U * (fabs(alpha * av[i]) + fabs(beta * b.val[i]));
                            checks++;
                            if (!(fabs(y[i] - want) <= t2))
                                FAIL("%s axpby_f32 n=%lld [%lld]: %.9g, want %.9g", k->name,
                                     (long long)n, (long long)i, y[i], want);
                        }
                    }
                    free(y);
                }
                free(av);
                free(a);
                free(b.raw);
                free(b.val);
            }
}

/* ---------- matmul ---------- */

#define SENTINEL 0x7fbadbadu /* a NaN no kernel produces: marks y entries not to touch */

static void run_matmul(const cpu_kernels *k, int dt, const float *x, int64_t n, int64_t kd,
                       const void *w, int64_t o0, int64_t o1, float *y, int64_t ldy) {
    if (dt == DT_F32)
        k->matmul_f32(x, n, kd, w, o0, o1, y, ldy);
    else if (dt == DT_F16)
        k->matmul_f16(x, n, kd, w, o0, o1, y, ldy);
    else
        k->matmul_bf16(x, n, kd, w, o0, o1, y, ldy);
}

static void test_matmul(const cpu_kernels *const *tabs) {
    const int64_t ks[] = {1, 3, 7, 8, 15, 16, 17, 31, 33, 63, 65, 100, 1000, 4097};
    const int64_t ns[] = {1, 2, 3, 5, 8, 13};
    /* [o0, o1) within `out` rows: whole, inside, single rows, not starting at 0, crossing
     * block edges. */
    const int64_t out = 37;
    const int64_t ranges[][2] = {{0, 37}, {5, 29}, {3, 4}, {16, 37}, {1, 34}, {36, 37}, {7, 23}};
    for (int integers = 1; integers >= 0; integers--)
        for (int dt = 0; dt < 3; dt++)
            for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++)
                for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
                    const int64_t kd = ks[ki], n = ns[ni], ldy = out + 3;
                    double *xv = malloc((size_t)(n * kd) * 8);
                    float *x = make_x((size_t)(n * kd), integers, xv);
                    wbuf wb = make_weights(dt, (size_t)(out * kd), integers);
                    const size_t esz = dt == DT_F32 ? 4 : 2;
                    double *ref = malloc((size_t)(n * out) * 8),
                           *mag = malloc((size_t)(n * out) * 8);
                    for (int64_t r = 0; r < n; r++)
                        for (int64_t o = 0; o < out; o++) {
                            double s = 0, m = 0;
                            for (int64_t i = 0; i < kd; i++) {
                                double p = xv[r * kd + i] * wb.val[o * kd + i];
                                s += p;
                                m += fabs(p);
                            }
                            ref[r * out + o] = s;
                            mag[r * out + o] = m;
                        }
                    float *first = malloc((size_t)(n * ldy) * 4);
                    for (size_t ri = 0; ri < sizeof ranges / sizeof *ranges; ri++) {
                        const int64_t o0 = ranges[ri][0], o1 = ranges[ri][1];
                        /* Rows o1.. are cut off and rows ..o0 poisoned: reading either is
                         * an ASan error. */
                        char *wr = malloc((size_t)(o1 * kd) * esz);
                        memcpy(wr, wb.raw, (size_t)(o1 * kd) * esz);
                        POISON(wr, (size_t)(o0 * kd) * esz);
                        for (const cpu_kernels *const *t = tabs; *t; t++) {
                            const cpu_kernels *k = *t;
                            float *y = malloc((size_t)(n * ldy) * 4);
                            for (int64_t i = 0; i < n * ldy; i++) y[i] = u2f(SENTINEL);
                            run_matmul(k, dt, x, n, kd, wr, o0, o1, y, ldy);
                            int bad = 0;
                            for (int64_t r = 0; r < n && bad < 3; r++)
                                for (int64_t o = 0; o < ldy && bad < 3; o++) {
                                    float got = y[r * ldy + o];
                                    checks++;
                                    if (o < o0 || o >= o1) {
                                        if (f2u(got) != SENTINEL) {
                                            FAIL("%s matmul_%s k=%lld n=%lld o=[%lld,%lld): wrote "
                                                 "y[%lld][%lld]",
                                                 k->name, dt_name[dt], (long long)kd, (long long)n,
                                                 (long long)o0, (long long)o1, (long long)r,
                                                 (long long)o);
                                            bad++;
                                        }
                                        continue;
                                    }
                                    const double want = ref[r * out + o];
                                    const double tol =
                                        integers ? 0 : (double)(kd + 2) * U * mag[r * out + o];
                                    if (!(fabs(got - want) <= tol)) {
                                        FAIL("%s matmul_%s k=%lld n=%lld o=[%lld,%lld)%s "
                                             "y[%lld][%lld] = %.9g, want %.9g (tol %.3g)",
                                             k->name, dt_name[dt], (long long)kd, (long long)n,
                                             (long long)o0, (long long)o1,
                                             integers ? " integers" : "", (long long)r,
                                             (long long)o, got, want, tol);
                                        bad++;
                                    }
                                    if (t == tabs) {
                                        first[r * ldy + o] = got;
                                    } else if (!(fabs(got - first[r * ldy + o]) <= 2 * tol)) {
                                        FAIL("%s matmul_%s k=%lld n=%lld y[%lld][%lld] = %.9g, %s "
                                             "gives %.9g",
                                             k->name, dt_name[dt], (long long)kd, (long long)n,
                                             (long long)r, (long long)o, got, tabs[0]->name,
                                             first[r * ldy + o]);
                                        bad++;
                                    }
                                }
                            free(y);
                        }
                        UNPOISON(wr, (size_t)(o0 * kd) * esz);
                        free(wr);
                    }
                    free(first);
                    free(ref);
                    free(mag);
                    free(xv);
                    free(x);
                    free(wb.raw);
                    free(wb.val);
                }
}

/* Larger prefill shapes: several blocks of rows, k and x tiles. */
static void test_matmul_large(const cpu_kernels *const *tabs) {
    const int64_t kd = 1100, out = 70, n = 29;
    for (int dt = 0; dt < 3; dt++) {
        double *xv = malloc((size_t)(n * kd) * 8);
        float *x = make_x((size_t)(n * kd), 1, xv);
        wbuf wb = make_weights(dt, (size_t)(out * kd), 1);
        for (const cpu_kernels *const *t = tabs; *t; t++) {
            float *y = malloc((size_t)(n * out) * 4);
            run_matmul(*t, dt, x, n, kd, wb.raw, 0, out, y, out);
            int bad = 0;
            for (int64_t r = 0; r < n; r++)
                for (int64_t o = 0; o < out; o++) {
                    double s = 0;
                    for (int64_t i = 0; i < kd; i++) s += xv[r * kd + i] * wb.val[o * kd + i];
                    checks++;
                    if (y[r * out + o] != s && bad++ < 3)
                        FAIL("%s matmul_%s %lldx%lld n=%lld y[%lld][%lld] = %.9g, want %.9g",
                             (*t)->name, dt_name[dt], (long long)out, (long long)kd, (long long)n,
                             (long long)r, (long long)o, y[r * out + o], s);
                }
            free(y);
        }
        free(xv);
        free(x);
        free(wb.raw);
        free(wb.val);
    }
}

/* Batch invariance: a row of x gives the same bits whatever else is in the batch and
 * however the output rows are split, so continuous batching, chunked prefill and the
 * number of threads never change a result. Every n (decode, small tiles, prefill blocks),
 * k past one and two KC blocks and not a multiple of any vector, and random non-integer
 * values (where summation order shows). */
static void test_batch_invariance(const cpu_kernels *const *tabs) {
    static const int64_t kds[] = {5, 37, 512, 1100};
    const int64_t out = 21, nmax = 13;
    for (int dt = 0; dt < 3; dt++)
        for (int ki = 0; ki < 4; ki++) {
            const int64_t kd = kds[ki];
            double *xv = malloc((size_t)(nmax * kd) * 8);
            float *x = make_x((size_t)(nmax * kd), 0, xv);
            wbuf wb = make_weights(dt, (size_t)(out * kd), 0);
            for (const cpu_kernels *const *t = tabs; *t; t++) {
                float *solo = malloc((size_t)(nmax * out) * 4),
                      *y = malloc((size_t)(nmax * out) * 4);
                for (int64_t r = 0; r < nmax; r++) /* each row alone, all output rows */
                    run_matmul(*t, dt, x + r * kd, 1, kd, wb.raw, 0, out, solo + r * out, out);
                for (int64_t n = 2; n <= nmax; n++) {
                    /* output rows in two uneven parts, as two workers would split them */
                    run_matmul(*t, dt, x, n, kd, wb.raw, 0, 7, y, out);
                    run_matmul(*t, dt, x, n, kd, wb.raw, 7, out, y, out);
                    checks++;
                    if (memcmp(y, solo, (size_t)(n * out) * 4) != 0)
                        FAIL("%s matmul_%s k=%lld: %lld rows together differ from each alone",
                             (*t)->name, dt_name[dt], (long long)kd, (long long)n);
                }
                free(solo);
                free(y);
            }
            free(xv);
            free(x);
            free(wb.raw);
            free(wb.val);
        }
}

/* The compute peak probe (fma_loop) runs every chain it counts in fma_flops: with m = 0 a
 * round sets each chain to c, so the sum is c times the chains; with m = 0.5 the chains
 * halve their distance to 2c a round, from their start values (0, 1, ..., each in every
 * lane), and after 64 rounds they are all 2c to f32 precision. A chain left out, or not
 * counted, makes either sum wrong. */
static void test_fma_probe(const cpu_kernels *const *tabs) {
    for (const cpu_kernels *const *t = tabs; *t; t++) {
        const cpu_kernels *k = *t;
        checks++;
        if (!k->fma_loop || k->fma_flops < 2 || k->fma_flops % 2) {
            FAIL("%s: fma_loop %p, fma_flops %d", k->name, (void *)k->fma_loop, k->fma_flops);
            continue;
        }
        double chains = k->fma_flops / 2;
        float one = k->fma_loop(1, 0.0f, 3.0f), conv = k->fma_loop(64, 0.5f, 1.5f);
        checks += 2;
        if (one != (float)(3.0 * chains))
            FAIL("%s: one round of m = 0, c = 3 gives %g, want %g", k->name, one, 3.0 * chains);
        if (fabs(conv - 3.0 * chains) > 1e-5 * 3.0 * chains)
            FAIL("%s: 64 rounds towards 3 give %g, want %g", k->name, conv, 3.0 * chains);
    }
}

int main(void) {
    const cpu_kernels *const *tabs = cpu_kernels_available();
    /* The reference path first, so the cross-path comparison is against portable. */
    const cpu_kernels *order[8];
    int nt = 0;
    order[nt++] = cpu_kernels_select("portable");
    for (const cpu_kernels *const *t = tabs; *t; t++)
        if (*t != order[0]) order[nt++] = *t;
    order[nt] = NULL;
    printf("tables:");
    for (int i = 0; i < nt; i++) printf(" %s", order[i]->name);
    printf(" (default %s)\n", cpu_kernels_select(NULL)->name);

    if (!order[0] || cpu_kernels_select("no-such-path") != NULL) FAIL("cpu_kernels_select");
    for (int i = 0; i < nt; i++)
        if (cpu_kernels_select(order[i]->name) != order[i]) FAIL("select(%s)", order[i]->name);

    size_t nin;
    float *in = conv_inputs(&nin);
    test_scalar_conversions(in, nin);
    for (int i = 0; i < nt; i++) test_vector_conversions(order[i], in, nin);
    free(in);
    test_dot_axpy(order);
    test_matmul(order);
    test_matmul_large(order);
    test_batch_invariance(order);
    test_fma_probe(order);

    printf("%d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
