/* Microscaled 4-bit (MXFP4) CPU kernels: the layout against a hand-written block; every
 * SIMD path's dequant_mx against a naive dequantization (nibbles through the e2m1 table,
 * ldexp by s - 127) bit for bit; cpu_q_matmul against the double product over that
 * reference, bit for bit against the path's f32 product over the dequantized matrix, and
 * batch-invariant; the fast mode's int8 kernels against a double reference over the same
 * int8 activations, decode against prefill bit for bit. Scales cover the subnormal ones
 * (s = 0, 1), k past one and two k blocks and output counts that are not a multiple of
 * any block. */
#include "kernels.h"
#include "qkernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;
#define CHECK(c, ...)                                                                              \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            failures++;                                                                            \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

#define QTEST_SEED 0x9E3779B97F4A7C15ull
#include "qtest_util.h"

/* The OCP e2m1 values, sign bit 8. */
static const double e2m1[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0, -0.5, -1, -1.5, -2, -3, -4, -6};

/* Value i of a row, from the blocks and scales as the checkpoint stores them. */
static double naive(const uint8_t *blocks, const uint8_t *scales, int64_t in, int64_t o,
                    int64_t i) {
    uint8_t byte = blocks[o * in / 2 + i / 2];
    int code = i % 2 ? byte >> 4 : byte & 15;
    return ldexp(e2m1[code], (int)scales[o * (in / 32) + i / 32] - 127);
}

static void test_layout(const cpu_qkernels *qk) {
    /* byte j holds values 2j (low nibble) and 2j + 1 (high): 0x21 -> 0.5, 1; 0xf9 -> -0.5,
     * -6; scale 128 doubles them */
    uint32_t words[4] = {0};
    uint8_t *b = (uint8_t *)words, sc = 128;
    b[0] = 0x21;
    b[1] = 0xf9;
    b[15] = 0x70;
    cpu_qmat w = {.q = words,
                  .scales = &sc,
                  .sb = CPU_Q_MX,
                  .bits = 4,
                  .group = 32,
                  .rows = 1,
                  .in = 32,
                  .wpr = 4,
                  .gpr = 1};
    float y[32];
    qk->dequant_mx(&w, 0, 0, 32, y);
    const float want[4] = {1.0f, 2.0f, -1.0f, -12.0f};
    for (int i = 0; i < 4; i++)
        CHECK(y[i] == want[i], "%s layout: value %d is %g, want %g", qk->name, i, y[i], want[i]);
    CHECK(y[30] == 0.0f && y[31] == 12.0f, "%s layout: values 30, 31 are %g %g, want 0 12",
          qk->name, y[30], y[31]);
}

static void fill(uint8_t *blocks, uint8_t *scales, int64_t out, int64_t in) {
    for (int64_t i = 0; i < out * in / 2; i++) blocks[i] = (uint8_t)rnd();
    for (int64_t g = 0; g < out * in / 32; g++) {
        uint32_t r = rnd() % 64;
        /* mostly near 1, some subnormal and some large powers */
        scales[g] = (uint8_t)(r == 0 ? 0 : r == 1 ? 1 : r == 2 ? 2 : r == 3 ? 140 : 118 + r % 12);
    }
}

static void test_matmul(const cpu_kernels *k, const cpu_qkernels *qk, int64_t in, int64_t out,
                        int64_t n) {
    const int64_t gpr = in / 32;
    /* exact-size allocations: ASan catches any read past the blocks */
    uint8_t *blocks = malloc((size_t)(out * in / 2)), *scales = malloc((size_t)(out * gpr));
    float *x = malloc((size_t)(n * in) * 4), *y = malloc((size_t)(n * out) * 4);
    float *yf = malloc((size_t)(n * out) * 4), *wf = malloc((size_t)(out * in) * 4);
    float *qbuf = malloc((size_t)(CPU_Q_ROWS * in) * sizeof(float));
    fill(blocks, scales, out, in);
    cpu_qmat w = {.q = (const uint32_t *)(const void *)blocks,
                  .scales = scales,
                  .sb = CPU_Q_MX,
                  .bits = 4,
                  .group = 32,
                  .rows = out,
                  .in = in,
                  .wpr = in / 8,
                  .gpr = gpr};
    for (int64_t i = 0; i < n * in; i++) x[i] = frnd();
    for (int64_t o = 0; o < out; o++) {
        cpu_q_dequant(qk, &w, o, 0, in, wf + o * in);
        for (int64_t i = 0; i < in; i++) {
            float want = (float)naive(blocks, scales, in, o, i);
            CHECK(wf[o * in + i] == want, "%s dequant_mx in %lld: [%lld,%lld] = %g, want %g",
                  qk->name, (long long)in, (long long)o, (long long)i, wf[o * in + i], want);
        }
        float part[1024];
        int64_t k0 = in - 32 < 1024 ? in - 32 : in - 1024;
        cpu_q_dequant(qk, &w, o, k0, in, part);
        CHECK(memcmp(part, wf + o * in + k0, (size_t)(in - k0) * 4) == 0,
              "%s dequant_mx: range [%lld, %lld) differs from the whole row", qk->name,
              (long long)k0, (long long)in);
    }
    k->matmul_f32(x, n, in, wf, 0, out, yf, out);
    for (int part = 0; part < 2; part++) {
        int64_t o0 = part ? out / 3 : 0, o1 = part ? out - out / 4 : out;
        for (int64_t i = 0; i < n * out; i++) y[i] = -12345.0f;
        cpu_q_matmul(k, qk, x, n, &w, o0, o1, y, out, part ? NULL : qbuf);
        for (int64_t r = 0; r < n; r++)
            for (int64_t o = 0; o < out; o++) {
                float got = y[r * out + o];
                if (o < o0 || o >= o1) {
                    CHECK(got == -12345.0f, "%s: wrote outside [%lld, %lld)", qk->name,
                          (long long)o0, (long long)o1);
                    continue;
                }
                double ref = 0, mag = 0;
                for (int64_t i = 0; i < in; i++) {
                    double p = (double)x[r * in + i] * naive(blocks, scales, in, o, i);
                    ref += p;
                    mag += fabs(p);
                }
                CHECK(fabs(got - ref) <= 1e-5 * mag + 1e-30,
                      "%s mx matmul in %lld out %lld n %lld: y[%lld,%lld] = %.7g, want %.7g",
                      qk->name, (long long)in, (long long)out, (long long)n, (long long)r,
                      (long long)o, got, ref);
                CHECK(memcmp(&got, &yf[r * out + o], 4) == 0,
                      "%s mx matmul in %lld n %lld: y[%lld,%lld] = %.9g, the f32 product over "
                      "the dequantized matrix gives %.9g",
                      qk->name, (long long)in, (long long)n, (long long)r, (long long)o, got,
                      yf[r * out + o]);
            }
    }
    for (int64_t r = 0; r < n; r++) {
        float solo[64];
        cpu_q_matmul(k, qk, x + r * in, 1, &w, 0, out, solo, out, qbuf);
        CHECK(memcmp(solo, yf + r * out, (size_t)out * 4) == 0,
              "%s mx matmul in %lld: row %lld alone differs from it among %lld rows", qk->name,
              (long long)in, (long long)r, (long long)n);
    }
    /* fast mode: every int8 kernel against the double product of the dequantized weights
     * with the dequantized activations; all rows at once against each row alone */
    void *mem = aligned_alloc(64, (cpu_q8_bytes(n, in, 32) + 63) & ~(size_t)63);
    cpu_q8act a;
    cpu_q8_quantize(x, n, in, 32, mem, &a);
    for (const cpu_q8kernel *const *q8 = cpu_q8kernels_available(); *q8; q8++) {
        cpu_q8_matmul(*q8, &a, &w, 0, out, y, out, NULL);
        for (int64_t r = 0; r < n; r++)
            for (int64_t o = 0; o < out; o++) {
                double ref = 0, mag = 0;
                for (int64_t i = 0; i < in; i++) {
                    double p = (double)a.q[r * in + i] * a.d[r * gpr + i / 32] *
                               naive(blocks, scales, in, o, i);
                    ref += p;
                    mag += fabs(p);
                }
                CHECK(fabs(y[r * out + o] - ref) <= 1e-5 * mag + 1e-30,
                      "%s mx in %lld n %lld: y[%lld,%lld] = %.7g, want %.7g", (*q8)->name,
                      (long long)in, (long long)n, (long long)r, (long long)o, y[r * out + o], ref);
            }
        for (int64_t r = 0; r < n; r++) {
            float solo[64];
            cpu_q8act one = a;
            one.n = 1;
            one.q += r * in;
            one.d += r * gpr;
            one.xs += r * gpr;
            one.isum += r * gpr;
            cpu_q8_matmul(*q8, &one, &w, 0, out, solo, out, NULL);
            CHECK(memcmp(solo, y + r * out, (size_t)out * 4) == 0,
                  "%s mx in %lld: row %lld alone differs from it among %lld rows", (*q8)->name,
                  (long long)in, (long long)r, (long long)n);
        }
    }
    free(mem);
    free(blocks);
    free(scales);
    free(x);
    free(y);
    free(yf);
    free(wf);
    free(qbuf);
}

int main(void) {
    static const int64_t ins[] = {32, 96, 1600, 2880};
    static const int64_t outs[] = {1, 5, 17, 33, 64};
    static const int64_t ns[] = {1, 2, 3, 5, 9};
    int paths = 0;
    for (const cpu_kernels *const *k = cpu_kernels_available(); *k; k++) {
        const cpu_qkernels *qk = cpu_qkernels_for((*k)->name);
        if (strcmp(qk->name, (*k)->name) != 0) continue; /* no quantized table of its own */
        paths++;
        test_layout(qk);
        for (int ii = 0; ii < 4; ii++)
            for (int oi = 0; oi < 5; oi++)
                test_matmul(*k, qk, ins[ii], outs[oi], ns[(ii + oi) % 5]);
        printf("%s: checked\n", qk->name);
    }
    printf("%d paths, %d failures\n", paths, failures);
    return failures || !paths ? 1 : 0;
}
