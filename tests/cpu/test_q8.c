/* Fast-mode quantized products (qkernels.h, cpu_q8kernel): the activation quantizer
 * against hand-computed values; every fast path, width (2, 3, 4, 5, 6, 8 bits), group
 * (32, 64, 128) and scale dtype (f32, f16, bf16) against a double-precision reference
 * over the SAME int8 activations (tight: the integer part is exact), and against the
 * double-precision exact product (the measured error, printed per width and checked
 * against a bound); decode (n = 1) against prefill (n > 1) bit for bit, thread counts
 * and odd output splits bit for bit. */
#include "kernels.h"
#include "qkernels.h"
#include "threadpool.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;
#define CHECK(c, ...)                                                                              \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            if (failures++ < 30) {                                                                 \
                fprintf(stderr, __VA_ARGS__);                                                      \
                fputc('\n', stderr);                                                               \
            }                                                                                      \
        }                                                                                          \
    } while (0)

#define QTEST_SEED 0x9e3779b97f4a7c15ull
#include "qtest_util.h"

static void *q8mem(int64_t n, int64_t in, int32_t group) {
    size_t b = cpu_q8_bytes(n, in, group);
    return aligned_alloc(64, (b + 63) & ~(size_t)63);
}

static void test_quantize(void) {
    /* max |x| = 2: d = 2 / 127, q = round_half_even(x * 63.5) */
    float x[32] = {1.0f, -2.0f, 0.5f, 0.0f, 2.0f, -1.0f, 3.0f / 127.0f};
    const int8_t want[7] = {64, -127, 32, 0, 127, -64, 2}; /* 63.5 -> 64, 31.75 -> 32, 1.5 -> 2 */
    void *mem = q8mem(1, 32, 32);
    cpu_q8act a;
    cpu_q8_quantize(x, 1, 32, 32, mem, &a);
    int32_t sum = 0;
    for (int i = 0; i < 7; i++) {
        CHECK(a.q[i] == want[i], "quantize: q[%d] = %d, want %d", i, a.q[i], want[i]);
        sum += want[i];
    }
    for (int i = 7; i < 32; i++) CHECK(a.q[i] == 0, "quantize: q[%d] = %d, want 0", i, a.q[i]);
    CHECK(a.d[0] == 2.0f / 127.0f, "quantize: d = %g", a.d[0]);
    CHECK(a.isum[0] == sum, "quantize: isum %d, want %d", a.isum[0], sum);
    CHECK(a.xs[0] == a.d[0] * (float)sum, "quantize: xs %g", a.xs[0]);
    /* a zero group quantizes to zeros with d = 0; 2.5 * 127 / 127 ties to even (2) */
    float z[64] = {0};
    z[32] = 127.0f;
    z[33] = 2.5f;
    z[34] = -2.5f;
    z[35] = 3.5f;
    cpu_q8_quantize(z, 1, 64, 32, mem, &a);
    CHECK(a.d[0] == 0 && a.isum[0] == 0 && a.q[5] == 0, "quantize: the zero group");
    CHECK(a.q[32] == 127 && a.q[33] == 2 && a.q[34] == -2 && a.q[35] == 4,
          "quantize: half to even gives %d %d %d %d", a.q[32], a.q[33], a.q[34], a.q[35]);
    free(mem);
}

typedef struct mat {
    cpu_qmat w;
    uint32_t *q;
    void *sc, *bi;
    double *deq; /* the dequantized matrix */
} mat;

static void mat_make(mat *m, int bits, int group, int sb, int64_t in, int64_t out) {
    m->w = (cpu_qmat){.sb = sb,
                      .bits = bits,
                      .group = group,
                      .rows = out,
                      .in = in,
                      .wpr = in * bits / 32,
                      .gpr = in / group};
    size_t sbs = sb == 0 ? 4 : 2;
    /* exact-size allocations: ASan catches any read past the packed data */
    m->q = malloc((size_t)(out * m->w.wpr) * 4);
    m->sc = malloc((size_t)(out * m->w.gpr) * sbs);
    m->bi = malloc((size_t)(out * m->w.gpr) * sbs);
    m->deq = malloc((size_t)(out * in) * sizeof(double));
    uint32_t *codes = malloc((size_t)in * 4);
    for (int64_t o = 0; o < out; o++) {
        for (int64_t i = 0; i < in; i++) codes[i] = rnd() % (1u << bits);
        cpu_q_pack(codes, in, bits, m->q + o * m->w.wpr);
        for (int64_t g = 0; g < m->w.gpr; g++) {
            /* MLX-like: w = s (q - mid) + small offset, so the bias is near -s mid */
            float s = (0.5f + 0.5f * fabsf(frnd())) * 0.02f / (float)(1 << (bits - 2));
            put_sb(m->sc, sb, o * m->w.gpr + g, s);
            put_sb(m->bi, sb, o * m->w.gpr + g,
                   -s * (float)((1 << bits) - 1) / 2 + 0.002f * frnd());
        }
    }
    m->w.q = m->q;
    m->w.scales = m->sc;
    m->w.biases = m->bi;
    for (int64_t o = 0; o < out; o++)
        for (int64_t i = 0; i < in; i++) {
            int64_t g = o * m->w.gpr + i / group;
            m->deq[o * in + i] =
                (double)cpu_q_sb(&m->w, m->sc, g) * cpu_q_code(m->q + o * m->w.wpr, i, bits) +
                (double)cpu_q_sb(&m->w, m->bi, g);
        }
    free(codes);
}

static void mat_free(mat *m) {
    free(m->q);
    free(m->sc);
    free(m->bi);
    free(m->deq);
}

/* The worst errors against the exact product, per width (index bits). */
static double worst_rel[9], sum_se[9], sum_sr[9];

typedef struct parg {
    const cpu_q8kernel *k;
    const cpu_q8act *a;
    const cpu_qmat *w;
    float *y;
    int64_t ldy;
} parg;

static void prun(void *p, int64_t o0, int64_t o1, int w) {
    (void)w;
    const parg *a = p;
    cpu_q8_matmul(a->k, a->a, a->w, o0, o1, a->y, a->ldy, NULL);
}

static void test_case(const cpu_q8kernel *k, int bits, int group, int sb, int64_t in, int64_t out,
                      int64_t n, cpu_pool *pools[3]) {
    mat m;
    mat_make(&m, bits, group, sb, in, out);
    const cpu_qmat *w = &m.w;
    float *x = malloc((size_t)(n * in) * 4), *y = malloc((size_t)(n * out) * 4);
    float *y1 = malloc((size_t)out * 4), *yt = malloc((size_t)(n * out) * 4);
    for (int64_t i = 0; i < n * in; i++) {
        x[i] = frnd();
        if (rnd() % 97 == 0) x[i] *= 20; /* an outlier now and then */
    }
    void *mem = q8mem(n, in, group), *mem1 = q8mem(1, in, group);
    cpu_q8act a, a1;
    cpu_q8_quantize(x, n, in, group, mem, &a);
    for (int64_t i = 0; i < n * out; i++) y[i] = -12345.0f;
    /* an inner range: rows outside must stay untouched */
    const int64_t o0 = out > 3 ? 1 : 0, o1 = out > 3 ? out - 1 : out;
    /* with the scratch: a kernel that unpacks does so once a block (prefill); the thread
     * runs below go without, and each row alone as decode: all the same bits */
    uint8_t *scratch = malloc(cpu_q8_scratch_bytes(in));
    cpu_q8_matmul(k, &a, w, o0, o1, y, out, scratch);
    free(scratch);
    double se = 0, sr = 0;
    for (int64_t r = 0; r < n; r++)
        for (int64_t o = 0; o < out; o++) {
            float got = y[r * out + o];
            if (o < o0 || o >= o1) {
                CHECK(got == -12345.0f, "%s: wrote row %lld outside [%lld, %lld)", k->name,
                      (long long)o, (long long)o0, (long long)o1);
                continue;
            }
            /* the same int8 activations in double */
            double ref = 0, mag = 0, ex = 0, exmag = 0;
            for (int64_t g = 0; g < w->gpr; g++) {
                double isum = 0;
                for (int32_t i = 0; i < group; i++)
                    isum += (double)cpu_q_code(m.q + o * w->wpr, g * group + i, bits) *
                            a.q[r * in + g * group + i];
                double s = cpu_q_sb(w, m.sc, o * w->gpr + g), b = cpu_q_sb(w, m.bi, o * w->gpr + g);
                double d = a.d[r * w->gpr + g], xs = a.xs[r * w->gpr + g];
                ref += s * d * isum + b * xs;
                mag += fabs(s * d * isum) + fabs(b * xs);
            }
            for (int64_t i = 0; i < in; i++) {
                ex += (double)x[r * in + i] * m.deq[o * in + i];
                exmag += fabs((double)x[r * in + i] * m.deq[o * in + i]);
            }
            CHECK(fabs(got - ref) <= 4e-6 * mag + 1e-30,
                  "%s bits %d group %d sb %d in %lld n %lld: y[%lld,%lld] = %.9g, the int8 "
                  "reference %.9g (mag %g)",
                  k->name, bits, group, sb, (long long)in, (long long)n, (long long)r, (long long)o,
                  got, ref, mag);
            double rel = fabs(got - ex) / exmag;
            if (rel > worst_rel[bits]) worst_rel[bits] = rel;
            se += (got - ex) * (got - ex);
            sr += ex * ex;
        }
    sum_se[bits] += se;
    sum_sr[bits] += sr;
    /* decode: each row alone (quantized alone) gives the bits it gets in the batch */
    for (int64_t r = 0; r < n; r++) {
        cpu_q8_quantize(x + r * in, 1, in, group, mem1, &a1);
        cpu_q8_matmul(k, &a1, w, o0, o1, y1, out, NULL);
        CHECK(memcmp(y1 + o0, y + r * out + o0, (size_t)(o1 - o0) * 4) == 0,
              "%s bits %d group %d n %lld: row %lld alone differs from it in the batch", k->name,
              bits, group, (long long)n, (long long)r);
    }
    /* thread counts and splits: 1, 2, 3 workers, grains 1, 3, 5 rows */
    for (int p = 0; p < 3; p++) {
        for (int64_t i = 0; i < n * out; i++) yt[i] = -1.0f;
        parg pa = {.k = k, .a = &a, .w = w, .y = yt, .ldy = out};
        cpu_pool_run(pools[p], out, 1 + 2 * p, prun, &pa);
        for (int64_t r = 0; r < n; r++)
            CHECK(memcmp(yt + r * out + o0, y + r * out + o0, (size_t)(o1 - o0) * 4) == 0,
                  "%s bits %d group %d n %lld: %d threads differ", k->name, bits, group,
                  (long long)n, p + 1);
    }
    free(x);
    free(y);
    free(y1);
    free(yt);
    free(mem);
    free(mem1);
    mat_free(&m);
}

/* Two paths over the same inputs agree to float rounding (the integer parts are equal). */
static void test_cross(const cpu_q8kernel *k, const cpu_q8kernel *ref) {
    mat m;
    mat_make(&m, 5, 64, 2, 640, 37);
    float x[640], y[37], yr[37];
    for (int i = 0; i < 640; i++) x[i] = frnd();
    void *mem = q8mem(1, 640, 64);
    cpu_q8act a;
    cpu_q8_quantize(x, 1, 640, 64, mem, &a);
    cpu_q8_matmul(k, &a, &m.w, 0, 37, y, 37, NULL);
    cpu_q8_matmul(ref, &a, &m.w, 0, 37, yr, 37, NULL);
    float top = 0;
    for (int o = 0; o < 37; o++) top = fabsf(yr[o]) > top ? fabsf(yr[o]) : top;
    for (int o = 0; o < 37; o++)
        CHECK(fabsf(y[o] - yr[o]) <= 1e-5f * top, "%s vs %s: row %d %.9g %.9g", k->name, ref->name,
              o, y[o], yr[o]);
    free(mem);
    mat_free(&m);
}

int main(void) {
    test_quantize();
    static const int all_bits[] = {2, 3, 4, 5, 6, 8};
    static const int groups[] = {32, 64, 128};
    static const int64_t outs[] = {1, 5, 17, 33, 70};
    static const int64_t ns[] = {1, 2, 3, 5, 9};
    cpu_pool *pools[3] = {cpu_pool_new(1), cpu_pool_new(2), cpu_pool_new(3)};
    int paths = 0;
    const cpu_q8kernel *const *all = cpu_q8kernels_available();
    for (const cpu_q8kernel *const *k = all; *k; k++) {
        paths++;
        int c = 0;
        for (int bi = 0; bi < 6; bi++)
            for (int gi = 0; gi < 3; gi++)
                for (int sb = 0; sb < 3; sb++) {
                    /* 1, 3 and 5 groups a row (odd: the avx512 pairs of 32-groups), past 16
                     * groups (the avx512 blocks of scales) */
                    int64_t mult = (int64_t[]){1, 3, 5, 19}[c % 4];
                    test_case(*k, all_bits[bi], groups[gi], sb, groups[gi] * mult, outs[c % 5],
                              ns[c % 5], pools);
                    c++;
                }
        /* a 4096-wide row of each width (the decode shape's k) */
        for (int bi = 0; bi < 6; bi++) test_case(*k, all_bits[bi], 64, 2, 4096, 9, 3, pools);
        test_case(*k, 4, 32, 1, 4096 + 32, 6, 2, pools);
        if (*k != all[0]) test_cross(*k, all[0]);
        printf("%s: checked\n", (*k)->name);
    }
    printf("error against the exact f32 product (x with outliers; worst |y - y_exact| / sum |w x| "
           "of a row, and rms(y - y_exact) / rms(y_exact) over all rows):\n");
    for (int bi = 0; bi < 6; bi++) {
        int b = all_bits[bi];
        double rms = sqrt(sum_se[b] / sum_sr[b]);
        printf("  %d-bit: worst %.2e, rms %.2e\n", b, worst_rel[b], rms);
        /* bounds about twice what the runs measure (see the printout) */
        CHECK(worst_rel[b] < 0.05 && rms < 0.03, "%d-bit: error against exact too large", b);
    }
    for (int p = 0; p < 3; p++) cpu_pool_free(pools[p]);
    printf("%d paths, %d failures\n", paths, failures);
    return failures || !paths ? 1 : 0;
}
