/* Quantized CPU kernels: the packing format against hand-computed bit streams; every
 * SIMD path's dequant against a double-precision reference; cpu_q_matmul against that
 * reference, bit for bit against the path's f32 product over the dequantized matrix, and
 * batch-invariant (rows together give the bits of each row alone). Widths cover every
 * bits value and group size, k past one and two k blocks, output counts that are not a
 * multiple of any block, and 1..9 rows of x. */
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

static const int all_bits[] = {2, 3, 4, 5, 6, 8};

/* Codes (5 i + 3) mod 2^bits, i = 0..31, packed LSB first. For 4 bits: 3, 8, 13, 2, 7, 12,
 * 1, 6 -> nibbles 6 1 c 7 2 d 8 3 from the top: 0x61c72d83; for 2 bits 3, 0, 1, 2 ->
 * 0b10010011 = 0x93 per byte. */
static const uint32_t expect_words[6][8] = {
    {0x93939393u, 0x93939393u},
    {0x43c67543u, 0x7543c675u, 0xc67543c6u},
    {0x61c72d83u, 0xe94fa50bu, 0x61c72d83u, 0xe94fa50bu},
    {0x79793503u, 0xfd560b30u, 0x77137249u, 0x1bb45871u, 0xf668f514u},
    {0x1748d203u, 0x5c2b9a17u, 0x38913febu, 0x2789d613u, 0x503bdb1bu, 0x79950f28u},
    {0x120d0803u, 0x26211c17u, 0x3a35302bu, 0x4e49443fu, 0x625d5853u, 0x76716c67u, 0x8a85807bu,
     0x9e99948fu},
};

static void test_pack(void) {
    for (int bi = 0; bi < 6; bi++) {
        int bits = all_bits[bi];
        uint32_t codes[32], words[8] = {0};
        for (int i = 0; i < 32; i++) codes[i] = (uint32_t)(i * 5 + 3) % (1u << bits);
        cpu_q_pack(codes, 32, bits, words);
        for (int k = 0; k < bits; k++)
            CHECK(words[k] == expect_words[bi][k], "pack %d bits: word %d is 0x%08x, want 0x%08x",
                  bits, k, words[k], expect_words[bi][k]);
        for (int i = 0; i < 32; i++)
            CHECK(cpu_q_code(expect_words[bi], i, bits) == codes[i],
                  "unpack %d bits: code %d is %u, want %u", bits, i,
                  cpu_q_code(expect_words[bi], i, bits), codes[i]);
    }
}

#define QTEST_SEED 88172645463325252ull
#include "qtest_util.h"

static void test_matmul(const cpu_kernels *k, const cpu_qkernels *qk, int bits, int group, int sb,
                        int64_t in, int64_t out, int64_t n) {
    cpu_qmat w = {.sb = sb,
                  .bits = bits,
                  .group = group,
                  .rows = out,
                  .in = in,
                  .wpr = in * bits / 32,
                  .gpr = in / group};
    size_t sbs = sb == 0 ? 4 : 2;
    /* exact-size allocations: ASan catches any read past the packed data */
    uint32_t *q = malloc((size_t)(out * w.wpr) * 4), *codes = malloc((size_t)in * 4);
    void *sc = malloc((size_t)(out * w.gpr) * sbs), *bi = malloc((size_t)(out * w.gpr) * sbs);
    float *x = malloc((size_t)(n * in) * 4), *y = malloc((size_t)(n * out) * 4);
    float *yf = malloc((size_t)(n * out) * 4), *wf = malloc((size_t)(out * in) * 4);
    double *deq = malloc((size_t)(out * in) * sizeof(double));
    float *qbuf = malloc((size_t)(CPU_Q_ROWS * in) * sizeof(float));
    for (int64_t o = 0; o < out; o++) {
        for (int64_t i = 0; i < in; i++) codes[i] = rnd() % (1u << bits);
        cpu_q_pack(codes, in, bits, q + o * w.wpr);
        for (int64_t g = 0; g < w.gpr; g++) {
            put_sb(sc, sb, o * w.gpr + g, frnd() * 0.1f);
            put_sb(bi, sb, o * w.gpr + g, frnd());
        }
    }
    w.q = q;
    w.scales = sc;
    w.biases = bi;
    for (int64_t o = 0; o < out; o++)
        for (int64_t i = 0; i < in; i++) {
            int64_t g = o * w.gpr + i / group;
            deq[o * in + i] = (double)cpu_q_sb(&w, sc, g) * cpu_q_code(q + o * w.wpr, i, bits) +
                              (double)cpu_q_sb(&w, bi, g);
        }
    for (int64_t i = 0; i < n * in; i++) x[i] = frnd();
    /* dequant: whole rows, then a range of groups at the end of each row */
    for (int64_t o = 0; o < out; o++) {
        qk->dequant(&w, o, 0, in, wf + o * in);
        for (int64_t i = 0; i < in; i++)
            CHECK(fabs(wf[o * in + i] - deq[o * in + i]) <= 1e-6 * (1 + fabs(deq[o * in + i])),
                  "%s dequant bits %d group %d: [%lld,%lld] = %g, want %g", qk->name, bits, group,
                  (long long)o, (long long)i, wf[o * in + i], deq[o * in + i]);
        float part[1024];
        int64_t k0 = in - group < 1024 ? in - group : in - 1024 / group * group;
        qk->dequant(&w, o, k0, in, part);
        CHECK(memcmp(part, wf + o * in + k0, (size_t)(in - k0) * 4) == 0,
              "%s dequant bits %d group %d: range [%lld, %lld) differs from the whole row",
              qk->name, bits, group, (long long)k0, (long long)in);
    }
    /* the f32 product over the dequantized matrix: what cpu_q_matmul must give exactly */
    k->matmul_f32(x, n, in, wf, 0, out, yf, out);
    /* two ranges: the whole matrix and an inner slice (what one worker gets), the second
     * without a buffer (the row-by-row fallback) */
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
                    ref += (double)x[r * in + i] * deq[o * in + i];
                    mag += fabs((double)x[r * in + i] * deq[o * in + i]);
                }
                CHECK(fabs(got - ref) <= 1e-5 * mag + 1e-6,
                      "%s matmul bits %d group %d sb %d in %lld out %lld n %lld: y[%lld,%lld] = "
                      "%.7g, want %.7g",
                      qk->name, bits, group, sb, (long long)in, (long long)out, (long long)n,
                      (long long)r, (long long)o, got, ref);
                CHECK(memcmp(&got, &yf[r * out + o], 4) == 0,
                      "%s matmul bits %d in %lld n %lld: y[%lld,%lld] = %.9g, the f32 product "
                      "over the dequantized matrix gives %.9g",
                      qk->name, bits, (long long)in, (long long)n, (long long)r, (long long)o, got,
                      yf[r * out + o]);
            }
    }
    /* batch invariance: each row of x alone gives the same bits */
    for (int64_t r = 0; r < n; r++) {
        float solo[64];
        cpu_q_matmul(k, qk, x + r * in, 1, &w, 0, out, solo, out, qbuf);
        CHECK(memcmp(solo, yf + r * out, (size_t)out * 4) == 0,
              "%s matmul bits %d in %lld: row %lld alone differs from it among %lld rows", qk->name,
              bits, (long long)in, (long long)r, (long long)n);
    }
    free(q);
    free(codes);
    free(sc);
    free(bi);
    free(x);
    free(y);
    free(yf);
    free(wf);
    free(deq);
    free(qbuf);
}

int main(void) {
    test_pack();
    static const int groups[] = {32, 64, 128};
    static const int64_t outs[] = {1, 5, 17, 33};
    static const int64_t ns[] = {1, 2, 3, 4, 5, 9};
    /* outs above stay <= 64: the invariance check's row buffer */
    int paths = 0;
    for (const cpu_kernels *const *k = cpu_kernels_available(); *k; k++) {
        const cpu_qkernels *qk = cpu_qkernels_for((*k)->name);
        if (strcmp(qk->name, (*k)->name) != 0) continue; /* no quantized table of its own */
        paths++;
        for (int bi = 0; bi < 6; bi++)
            for (int gi = 0; gi < 3; gi++)
                for (int m = 1; m <= 3; m += 2) /* one group and three groups per row */
                    test_matmul(*k, qk, all_bits[bi], groups[gi], (bi + gi) % 3, groups[gi] * m,
                                outs[(bi + gi + m) % 4], ns[(bi * 3 + gi + m) % 6]);
        for (int64_t ni = 0; ni < 6; ni++) test_matmul(*k, qk, 3, 32, 2, 96, 19, ns[ni]);
        for (int64_t oi = 0; oi < 4; oi++) test_matmul(*k, qk, 5, 64, 1, 320, outs[oi], 4);
        /* k over one and two k blocks (512 / 1024), not a multiple of either */
        for (int bi = 0; bi < 6; bi++)
            test_matmul(*k, qk, all_bits[bi], 64, bi % 3, 1600, 17, 1 + bi);
        test_matmul(*k, qk, 4, 128, 2, 2176, 33, 9);
        printf("%s: checked\n", qk->name);
    }
    printf("%d paths, %d failures\n", paths, failures);
    return failures || !paths ? 1 : 0;
}
