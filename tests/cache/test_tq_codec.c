/* The TurboQuant codec (plugins/cache-turboquant/tq_codec.h) against the spec's oracles
 * (specs/turboquant.md §11): sign streams and codebooks, the golden K and V records byte for
 * byte, record sizes, fp16 rounding, MSE distortion per bit width, and the inner-product
 * estimators' bias and variance. Statistical checks draw 10,000 unit vectors (splitmix64,
 * Box-Muller); the tolerances are the spec's (±1 % on MSE, bias within 4 standard errors,
 * variance within ±7 %). */
#include "tq_codec.h"

#include <stdio.h>
#include <stdlib.h>

static int failures;
#define CHECK(c, ...)                                                                              \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            failures++;                                                                            \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                            \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
        }                                                                                          \
    } while (0)

static uint64_t rng = 12345;
static uint64_t next64(void) {
    rng += 0x9E3779B97F4A7C15ull;
    uint64_t z = rng;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double gauss(void) {
    double u = ((next64() >> 11) + 0.5) / 9007199254740992.0,
           v = (next64() >> 11) / 9007199254740992.0;
    return sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v);
}
static void unit(double *x, int m) {
    double s = 0;
    for (int i = 0; i < m; i++) {
        x[i] = gauss();
        s += x[i] * x[i];
    }
    for (int i = 0; i < m; i++) x[i] /= sqrt(s);
}

static void test_tables(void) {
    /* §4.3.4: the first 16 signs of each stream at m = 128 */
    static const char *want[4] = {"++++-++-+++-++-+", "++++---++++++---", "+-+----+++++-+++",
                                  "-++-----+----+--"};
    tq_tables t;
    CHECK(tq_tables_for(&t, 128, 3) == 0, "tables");
    for (int s = 0; s < 4; s++)
        for (int i = 0; i < 16; i++)
            CHECK((tq_sign(&t, s, i) > 0) == (want[s][i] == '+'), "stream %d sign %d", s + 1, i);
    /* and every sign against splitmix64 itself, for both block sizes */
    for (int m = 64; m <= 128; m *= 2) {
        tq_tables_for(&t, m, 3);
        for (int s = 0; s < 4; s++) {
            uint64_t st = 0x54514B5600000000ull | ((uint64_t)(s + 1) << 16) | (uint64_t)m;
            for (int i = 0; i < m; i++) {
                st += 0x9E3779B97F4A7C15ull;
                uint64_t z = st;
                z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
                z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
                z ^= z >> 31;
                CHECK((tq_sign(&t, s, i) < 0) == (int)(z >> 63), "m %d stream %d sign %d", m, s + 1,
                      i);
            }
        }
    }
    /* §4.4 Table B and the 3-bit tables for m = 64 (positive halves) */
    static const double b3[4] = {0.0216043, 0.0665856, 0.1181398, 0.1883972};
    static const double b4[8] = {0.0113025, 0.0341516, 0.0577723, 0.0828284,
                                 0.1102884, 0.1418052, 0.1808360, 0.2376638};
    static const double b3_64[4] = {0.0304692, 0.0938323, 0.1661679, 0.2639139};
    static const float f3[8] = {-0.188397184f, -0.118139766f, -0.0665856078f, -0.0216043107f,
                                0.0216043107f, 0.0665856078f, 0.118139766f,   0.188397184f};
    tq_tables_for(&t, 128, 3);
    for (int i = 0; i < 4; i++) CHECK(fabs(t.c[4 + i] - b3[i]) < 1e-6, "3-bit centroid %d", i);
    for (int i = 0; i < 8; i++) CHECK(t.c[i] == f3[i], "3-bit f32 centroid %d", i);
    tq_tables_for(&t, 128, 4);
    for (int i = 0; i < 8; i++) CHECK(fabs(t.c[8 + i] - b4[i]) < 1e-6, "4-bit centroid %d", i);
    tq_tables_for(&t, 64, 3);
    for (int i = 0; i < 4; i++) CHECK(fabs(t.c[4 + i] - b3_64[i]) < 1e-6, "m=64 centroid %d", i);
    CHECK(tq_tables_for(&t, 96, 3) < 0 && tq_tables_for(&t, 128, 2) < 0, "other sizes refused");
}

static void test_half(void) {
    CHECK(tq_half(1.0f) == 0x3c00, "1");
    CHECK(tq_half(65504.0f) == 0x7bff && tq_half(1e9f) == 0x7bff && tq_half(-1e9f) == 0xfbff,
          "clamped");
    CHECK(tq_half(5.9604645e-8f) == 1 && tq_half(2.9802322e-8f) == 0, "least subnormal, tie to 0");
    CHECK(tq_half(1.0f + 1.0f / 2048) == 0x3c00 && tq_half(1.0f + 3.0f / 2048) == 0x3c02,
          "ties to even");
    for (uint32_t h = 0; h < 0x7c00; h++)
        CHECK(tq_half(tq_float((uint16_t)h)) == h, "round trip %x", h);
}

static void record(uint8_t *out, const uint32_t *codes, int cw, const uint32_t *signs, int sw,
                   uint32_t norms, int nb) {
    memcpy(out, codes, (size_t)cw * 4);
    if (sw) memcpy(out + cw * 4, signs, (size_t)sw * 4);
    memcpy(out + (cw + sw) * 4, &norms, (size_t)nb);
}

static void test_golden(void) {
    static const char *k_hex = "45cb946fd70825a18f6345b5ced9095aab6e1ae7710d199d7598ac2ca36da914ab"
                               "ea42a2a3658f7d5b6ade5a47a135e6448079b273d65dbf258deb299a13e3e97d5"
                               "09831";
    static const char *v_hex = "45cb946fd70825a18f6345b5ced9095aab6e1ae7710d199d7598ac2ca36da914ab"
                               "ea42a2a3658f7d5b6ade5a47a135e68f50";
    tq_tables t;
    tq_tables_for(&t, 128, 3);
    float x[128];
    for (int i = 0; i < 128; i++) x[i] = (float)((1 + i % 7) * sin(0.37 * i + 0.1));
    uint32_t c[12], s[4], cv[12];
    uint32_t nk = tq_encode(&t, x, 1, c, s), nv = tq_encode(&t, x, 0, cv, NULL);
    uint8_t kr[68], vr[50];
    record(kr, c, 12, s, 4, nk, 4);
    record(vr, cv, 12, NULL, 0, nv, 2);
    char hex[200];
    for (int i = 0; i < 68; i++) sprintf(hex + 2 * i, "%02x", kr[i]);
    CHECK(strcmp(hex, k_hex) == 0, "golden K record\n  got  %s\n  want %s", hex, k_hex);
    for (int i = 0; i < 50; i++) sprintf(hex + 2 * i, "%02x", vr[i]);
    CHECK(strcmp(hex, v_hex) == 0, "golden V record\n  got  %s\n  want %s", hex, v_hex);
    CHECK(tq_float((uint16_t)nk) == 35.90625f && tq_float((uint16_t)(nk >> 16)) == 0.1748046875f &&
              tq_float((uint16_t)nv) == 36.46875f,
          "golden norms");
    static const int first[16] = {5, 0, 5, 5, 4, 1, 5, 4, 7, 5, 5, 3, 5, 1, 2, 0};
    for (int i = 0; i < 16; i++) CHECK(tq_get(c, 3, i) == (uint32_t)first[i], "code %d", i);
    float k[128];
    tq_decode(&t, c, s, nk, 1, k);
    double ip = 0;
    for (int i = 0; i < 128; i++) ip += cos(0.11 * i) * k[i];
    CHECK(fabs(ip - 12.682647) < 1e-4, "<q, k~> = %.6f, want 12.682647", ip);
    /* a zero vector: an all-zero record that decodes to zero */
    float z[128] = {0};
    uint32_t n0 = tq_encode(&t, z, 1, c, s), any = n0;
    for (int i = 0; i < 12; i++) any |= c[i];
    for (int i = 0; i < 4; i++) any |= s[i];
    CHECK(any == 0, "zero record");
    tq_decode(&t, c, s, n0, 1, k);
    for (int i = 0; i < 128; i++) CHECK(k[i] == 0.0f, "zero decodes to zero");
    /* packing round trip at 3 and 4 bits */
    for (int bits = 3; bits <= 4; bits++) {
        uint32_t w[16] = {0};
        for (int i = 0; i < 128; i++)
            tq_put(w, bits, i, (uint32_t)(i * 7 + 3) & ((1u << bits) - 1u));
        for (int i = 0; i < 128; i++)
            CHECK(tq_get(w, bits, i) == ((uint32_t)(i * 7 + 3) & ((1u << bits) - 1u)), "pack %d",
                  bits);
    }
}

#define N 10000

/* Mean |x - x~|^2 over N random unit vectors of m values: the MSE stage with the plain
 * norm (nc 0) or the corrected one (nc 1). */
static double mse(int m, int bits, int nc) {
    tq_tables t;
    tq_tables_for(&t, m, bits);
    double sum = 0, xd[128];
    for (int v = 0; v < N; v++) {
        unit(xd, m);
        float x[128], y[128];
        for (int i = 0; i < m; i++) x[i] = (float)xd[i];
        uint32_t c[16], s[4], norms;
        if (nc)
            norms = tq_encode(&t, x, 0, c, s);
        else
            norms = tq_encode(&t, x, 1, c, s) & 0xffffu; /* |x| alone, no QJL term */
        tq_decode(&t, c, s, norms, 0, y);
        for (int i = 0; i < m; i++) sum += (x[i] - y[i]) * (double)(x[i] - y[i]);
    }
    return sum / N;
}

/* The estimate <y, x~> for N pairs with <x, y> = 0.5: bias and variance of its error.
 * path 0: keys of tq3 (QJL), 1: the same records without the QJL term, 2: values. */
static void ip(int path, double *bias, double *var) {
    tq_tables t;
    tq_tables_for(&t, 128, 3);
    double s1 = 0, s2 = 0, xd[128], w[128];
    for (int v = 0; v < N; v++) {
        unit(xd, 128);
        for (int i = 0; i < 128; i++) w[i] = gauss();
        double d = 0, n = 0;
        for (int i = 0; i < 128; i++) d += w[i] * xd[i];
        for (int i = 0; i < 128; i++) {
            w[i] -= d * xd[i];
            n += w[i] * w[i];
        }
        float x[128], k[128];
        double y[128];
        for (int i = 0; i < 128; i++) {
            x[i] = (float)xd[i];
            y[i] = 0.5 * xd[i] + sqrt(0.75) * w[i] / sqrt(n);
        }
        uint32_t c[12], s[4];
        uint32_t norms = tq_encode(&t, x, path < 2, c, s);
        tq_decode(&t, c, s, norms, path == 0, k);
        double e = -0.5;
        for (int i = 0; i < 128; i++) e += y[i] * k[i];
        s1 += e;
        s2 += e * e;
    }
    *bias = s1 / N;
    *var = s2 / N - *bias * *bias;
}

static void test_statistics(void) {
    /* §11.3, measured with SRHT (±1 %) */
    static const double want[2][2] = {{0.03401, 0.00932}, {0.03385, 0.00918}};
    for (int nc = 0; nc < 2; nc++)
        for (int bits = 3; bits <= 4; bits++) {
            double got = mse(128, bits, nc), w = want[nc][bits - 3];
            printf("mse m=128 %d-bit%s: %.5f (spec %.5f)\n", bits, nc ? " corrected" : "", got, w);
            CHECK(fabs(got - w) < 0.01 * w, "mse %d-bit nc %d: %.5f vs %.5f", bits, nc, got, w);
        }
    double m64 = mse(64, 3, 0); /* §4.4: expected 0.033391 at m = 64 */
    printf("mse m=64 3-bit: %.5f (expected 0.03339)\n", m64);
    CHECK(fabs(m64 - 0.033391) < 0.015 * 0.033391, "mse m=64: %.5f", m64);
    /* §11.4: the K path unbiased, variance 1.50e-4; without QJL -3.4 %, 3.36e-4; values -1.7 % */
    static const double wb[3] = {0.00007, -0.01702, -0.00847}, wv[3] = {1.50e-4, 3.36e-4, 1.95e-4};
    static const char *name[3] = {"keys (QJL)", "keys, qjl=off", "values"};
    for (int p = 0; p < 3; p++) {
        double b, v;
        ip(p, &b, &v);
        double se = sqrt(v / N);
        printf("inner product, %s: bias %+.5f, variance %.3e (spec %+.5f, %.3e)\n", name[p], b, v,
               wb[p], wv[p]);
        CHECK(fabs(b - wb[p]) < 4 * se, "%s bias %+.5f", name[p], b);
        CHECK(fabs(v - wv[p]) < 0.07 * wv[p], "%s variance %.3e", name[p], v);
    }
    /* §11.3: one-hot inputs, 3 bits: 0.0608 plain, exactly 0 with the corrected norm */
    tq_tables t;
    tq_tables_for(&t, 128, 3);
    double oh = 0, ohc = 0;
    for (int j = 0; j < 128; j++) {
        float x[128] = {0}, y[128];
        x[j] = 1.0f;
        uint32_t c[12], s[4];
        tq_decode(&t, c, s, tq_encode(&t, x, 1, c, s) & 0xffffu, 0, y);
        for (int i = 0; i < 128; i++) oh += (x[i] - y[i]) * (double)(x[i] - y[i]);
        tq_decode(&t, c, s, tq_encode(&t, x, 0, c, s), 0, y);
        for (int i = 0; i < 128; i++) ohc += (x[i] - y[i]) * (double)(x[i] - y[i]);
    }
    printf("one-hot 3-bit: %.4f plain, %.2e corrected\n", oh / 128, ohc / 128);
    CHECK(fabs(oh / 128 - 0.0608) < 0.001, "one-hot mse %.4f", oh / 128);
    CHECK(ohc / 128 < 1e-6, "one-hot corrected %.2e (fp16 norm only)", ohc / 128);
}

int main(void) {
    test_tables();
    test_half();
    test_golden();
    test_statistics();
    printf("%s\n", failures ? "FAILED" : "ok");
    return failures != 0;
}
