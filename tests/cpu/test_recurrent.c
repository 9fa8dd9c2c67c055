/* The CPU backend's recurrent ops (recurrent.c) against a plain double-precision model of
 * each op as ops.h states it, on every SIMD table this CPU runs: outputs and the state left
 * behind, over a few shapes (GQA heads, groups, clamped steps, with and without optional
 * operands). Also: the rows fed all at once, in parts or one by one give the same bits,
 * which is what keeps chunked prefill and decode from changing an answer. */
#include "kernels.h"
#include "lmhost/ops.h"
#include "recurrent.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_fail, g_checks;
static uint64_t g_rng = 12345;

static float rnd(void) { /* uniform in [-1, 1) */
    g_rng = g_rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((double)(g_rng >> 11) / (double)(1ULL << 53) * 2.0 - 1.0);
}

static float *vec(int64_t n, float scale) {
    float *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = rnd() * scale;
    return v;
}

static float *dup(const float *x, int64_t n) {
    float *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    memcpy(v, x, (size_t)n * sizeof *v);
    return v;
}

/* max |a - b| <= tol * max(1, max |b|) */
static void close_to(const char *what, const float *a, const double *b, int64_t n, double tol) {
    double m = 1, d = 0;
    for (int64_t i = 0; i < n; i++) {
        if (fabs(b[i]) > m) m = fabs(b[i]);
        double e = fabs((double)a[i] - b[i]);
        if (!(e <= d)) d = isnan(e) ? INFINITY : e;
    }
    g_checks++;
    if (!(d <= tol * m)) {
        fprintf(stderr, "FAIL %s: max |d| %.3g (max |ref| %.3g)\n", what, d, m);
        g_fail++;
    }
}

static void same_bits(const char *what, const float *a, const float *b, int64_t n) {
    g_checks++;
    if (memcmp(a, b, (size_t)n * sizeof *a)) {
        fprintf(stderr, "FAIL %s: not the same bits\n", what);
        g_fail++;
    }
}

static double dsoftplus(double v) {
    return v > 20 ? v : log1p(exp(v));
}

/* ---- conv1d ---- */

static void ref_conv(const float *x, int64_t n, int64_t C, int64_t K, const float *w,
                     const float *bias, double *state, double *y, int act) {
    const int64_t S = K - 1;
    double *xx = malloc((size_t)((S + n) * C) * sizeof *xx);
    for (int64_t i = 0; i < S * C; i++) xx[i] = state[i];
    for (int64_t i = 0; i < n * C; i++) xx[S * C + i] = x[i];
    for (int64_t t = 0; t < n; t++)
        for (int64_t c = 0; c < C; c++) {
            double a = bias ? bias[c] : 0;
            for (int64_t j = 0; j < K; j++) a += (double)w[c * K + j] * xx[(t + j) * C + c];
            y[t * C + c] = act == LMH_UNARY_SILU ? a / (1 + exp(-a)) : a;
        }
    for (int64_t i = 0; i < S * C; i++) state[i] = xx[n * C + i];
    free(xx);
}

static void test_conv(const cpu_kernels *k, int64_t n, int64_t C, int64_t K, int bias, int act) {
    (void)k;
    char what[160];
    snprintf(what, sizeof what, "%s conv1d n=%lld C=%lld K=%lld bias=%d act=%d", k->name,
             (long long)n, (long long)C, (long long)K, bias, act);
    float *x = vec(n * C, 1), *w = vec(C * K, 0.5f), *b = bias ? vec(C, 0.5f) : NULL;
    float *st = vec((K - 1) * C, 1), *y = vec(n * C, 0);
    double *rst = malloc((size_t)((K - 1) * C) * sizeof *rst), *ry = malloc((size_t)(n * C) * 8);
    for (int64_t i = 0; i < (K - 1) * C; i++) rst[i] = st[i];
    float *st2 = dup(st, (K - 1) * C), *y2 = vec(n * C, 0);
    cpu_conv1d(x, n, C, K, w, b, st, y, act, 0, C);
    ref_conv(x, n, C, K, w, b, rst, ry, act);
    close_to(what, y, ry, n * C, 1e-5);
    close_to(what, st, rst, (K - 1) * C, 0);
    /* row by row, channels in two parts: the same bits */
    for (int64_t t = 0; t < n; t++) {
        cpu_conv1d(x + t * C, 1, C, K, w, b, st2, y2 + t * C, act, 0, C / 2);
        cpu_conv1d(x + t * C, 1, C, K, w, b, st2, y2 + t * C, act, C / 2, C);
    }
    same_bits(what, y2, y, n * C);
    same_bits(what, st2, st, (K - 1) * C);
    free(x), free(w), free(b), free(st), free(y), free(rst), free(ry), free(st2), free(y2);
}

/* ---- Mamba-1 selective scan ---- */

static void test_ssm(const cpu_kernels *k, int64_t n, int64_t D, int64_t N, int opt) {
    char what[160];
    snprintf(what, sizeof what, "%s ssm_scan n=%lld D=%lld N=%lld opt=%d", k->name, (long long)n,
             (long long)D, (long long)N, opt);
    float *x = vec(n * D, 1), *dt = vec(n * D, 2), *A = vec(D * N, 1), *B = vec(n * N, 1);
    float *C = vec(n * N, 1), *Dk = opt ? vec(D, 1) : NULL, *bias = opt ? vec(D, 1) : NULL;
    for (int64_t i = 0; i < D * N; i++) A[i] = -expf(A[i]); /* the op takes -exp(A_log) */
    float *st = vec(D * N, 1), *y = vec(n * D, 0), *st2 = dup(st, D * N), *y2 = vec(n * D, 0);
    double *h = malloc((size_t)(D * N) * 8), *ry = malloc((size_t)(n * D) * 8);
    for (int64_t i = 0; i < D * N; i++) h[i] = st[i];
    for (int64_t t = 0; t < n; t++)
        for (int64_t c = 0; c < D; c++) {
            double d = dsoftplus((double)dt[t * D + c] + (bias ? bias[c] : 0)), acc = 0;
            for (int64_t s = 0; s < N; s++) {
                double *hs = &h[c * N + s];
                *hs = exp(d * A[c * N + s]) * *hs + d * B[t * N + s] * x[t * D + c];
                acc += *hs * C[t * N + s];
            }
            ry[t * D + c] = acc + (Dk ? Dk[c] * (double)x[t * D + c] : 0);
        }
    cpu_ssm_scan(k, x, dt, n, D, N, A, B, C, Dk, bias, st, y, 0, D);
    close_to(what, y, ry, n * D, 1e-5);
    close_to(what, st, h, D * N, 1e-5);
    for (int64_t t = 0; t < n; t++)
        cpu_ssm_scan(k, x + t * D, dt + t * D, 1, D, N, A, B + t * N, C + t * N, Dk, bias, st2,
                     y2 + t * D, 0, D);
    same_bits(what, y2, y, n * D);
    same_bits(what, st2, st, D * N);
    free(x), free(dt), free(A), free(B), free(C), free(Dk), free(bias), free(st), free(y);
    free(st2), free(y2), free(h), free(ry);
}

/* ---- Mamba-2 SSD scan ---- */

static void test_ssd(const cpu_kernels *k, int64_t n, int64_t H, int64_t P, int64_t G, int64_t N,
                     int opt, float lo, float hi) {
    char what[160];
    snprintf(what, sizeof what,
             "%s ssd_scan n=%lld H=%lld P=%lld G=%lld N=%lld opt=%d clamp=[%g,%g]", k->name,
             (long long)n, (long long)H, (long long)P, (long long)G, (long long)N, opt, lo, hi);
    const int64_t HP = H * P, GN = G * N;
    float *x = vec(n * HP, 1), *dt = vec(n * H, 2), *A = vec(H, 1), *B = vec(n * GN, 1);
    float *C = vec(n * GN, 1), *Dk = opt ? vec(H, 1) : NULL, *bias = opt ? vec(H, 1) : NULL;
    for (int64_t i = 0; i < H; i++) A[i] = -expf(A[i]);
    float *st = vec(HP * N, 1), *y = vec(n * HP, 0), *st2 = dup(st, HP * N), *y2 = vec(n * HP, 0);
    double *h = malloc((size_t)(HP * N) * 8), *ry = malloc((size_t)(n * HP) * 8);
    for (int64_t i = 0; i < HP * N; i++) h[i] = st[i];
    const double top = hi > 0 ? hi : INFINITY;
    for (int64_t t = 0; t < n; t++)
        for (int64_t hh = 0; hh < H; hh++) {
            const int64_t g = hh / (H / G);
            double d = dsoftplus((double)dt[t * H + hh] + (bias ? bias[hh] : 0));
            d = d < lo ? lo : d > top ? top : d;
            const double a = exp(A[hh] * d);
            for (int64_t p = 0; p < P; p++) {
                const double xv = x[t * HP + hh * P + p];
                double acc = 0;
                for (int64_t s = 0; s < N; s++) {
                    double *hs = &h[(hh * P + p) * N + s];
                    *hs = a * *hs + d * xv * B[(t * G + g) * N + s];
                    acc += *hs * C[(t * G + g) * N + s];
                }
                ry[t * HP + hh * P + p] = acc + (Dk ? Dk[hh] * xv : 0);
            }
        }
    cpu_ssd_scan(k, x, dt, n, H, P, G, N, A, B, C, Dk, bias, lo, hi > 0 ? hi : INFINITY, st, y, 0,
                 HP);
    close_to(what, y, ry, n * HP, 1e-5);
    close_to(what, st, h, HP * N, 1e-5);
    for (int64_t t = 0; t < n; t++) { /* one row at a time, the state rows in three parts */
        int64_t cut1 = HP / 3, cut2 = 2 * HP / 3;
        const int64_t cut[4] = {0, cut1, cut2, HP};
        for (int q = 0; q < 3; q++)
            cpu_ssd_scan(k, x + t * HP, dt + t * H, 1, H, P, G, N, A, B + t * GN, C + t * GN, Dk,
                         bias, lo, hi > 0 ? hi : INFINITY, st2, y2 + t * HP, cut[q], cut[q + 1]);
    }
    same_bits(what, y2, y, n * HP);
    same_bits(what, st2, st, HP * N);
    free(x), free(dt), free(A), free(B), free(C), free(Dk), free(bias), free(st), free(y);
    free(st2), free(y2), free(h), free(ry);
}

/* ---- gated delta rule ---- */

static void test_delta(const cpu_kernels *k, int64_t n, int64_t Hk, int64_t Hv, int64_t dk,
                       int64_t dv, int l2, int bias) {
    char what[160];
    snprintf(what, sizeof what, "%s delta_rule n=%lld Hk=%lld Hv=%lld dk=%lld dv=%lld l2=%d",
             k->name, (long long)n, (long long)Hk, (long long)Hv, (long long)dk, (long long)dv, l2);
    float *q = vec(n * Hk * dk, 1), *kk = vec(n * Hk * dk, 1), *v = vec(n * Hv * dv, 1);
    float *a = vec(n * Hv, 2), *b = vec(n * Hv, 2), *A = vec(Hv, 1),
          *dtb = bias ? vec(Hv, 1) : NULL;
    if (!l2) /* unnormalised keys: keep the state bounded */
        for (int64_t i = 0; i < n * Hk * dk; i++) kk[i] /= sqrtf((float)dk);
    for (int64_t i = 0; i < Hv; i++) A[i] = -expf(A[i]);
    const int64_t SZ = Hv * dk * dv;
    float *st = vec(SZ, 0.5f), *o = vec(n * Hv * dv, 0), *st2 = dup(st, SZ),
          *o2 = vec(n * Hv * dv, 0);
    double *S = malloc((size_t)SZ * 8), *ro = malloc((size_t)(n * Hv * dv) * 8);
    for (int64_t i = 0; i < SZ; i++) S[i] = st[i];
    const float qs = 1.0f / sqrtf((float)dk), eps = 1e-6f;
    double *qn = malloc((size_t)dk * 8), *kn = malloc((size_t)dk * 8),
           *mem = malloc((size_t)dv * 8);
    for (int64_t t = 0; t < n; t++)
        for (int64_t h = 0; h < Hv; h++) {
            const int64_t hk = h / (Hv / Hk);
            const float *qt = q + (t * Hk + hk) * dk, *kt = kk + (t * Hk + hk) * dk;
            double sq = 0, sk = 0;
            for (int64_t i = 0; i < dk; i++)
                sq += (double)qt[i] * qt[i], sk += (double)kt[i] * kt[i];
            for (int64_t i = 0; i < dk; i++) {
                qn[i] = l2 ? qt[i] / sqrt(sq + eps) * qs : (double)qt[i] * qs;
                kn[i] = l2 ? kt[i] / sqrt(sk + eps) : kt[i];
            }
            double g = A[h] * dsoftplus((double)a[t * Hv + h] + (dtb ? dtb[h] : 0));
            double beta = 1 / (1 + exp(-(double)b[t * Hv + h]));
            double *Sh = S + h * dk * dv;
            for (int64_t i = 0; i < dk * dv; i++) Sh[i] *= exp(g);
            for (int64_t j = 0; j < dv; j++) {
                double m = 0;
                for (int64_t i = 0; i < dk; i++) m += Sh[i * dv + j] * kn[i];
                mem[j] = beta * (v[(t * Hv + h) * dv + j] - m);
            }
            for (int64_t i = 0; i < dk; i++)
                for (int64_t j = 0; j < dv; j++) Sh[i * dv + j] += kn[i] * mem[j];
            for (int64_t j = 0; j < dv; j++) {
                double acc = 0;
                for (int64_t i = 0; i < dk; i++) acc += Sh[i * dv + j] * qn[i];
                ro[(t * Hv + h) * dv + j] = acc;
            }
        }
    const int64_t parts = Hv * ((dv + DELTA_COLS - 1) / DELTA_COLS);
    cpu_delta_rule(k, q, kk, v, a, b, n, Hk, Hv, dk, dv, A, dtb, l2, eps, qs, st, o, 0, parts);
    close_to(what, o, ro, n * Hv * dv, 2e-5);
    close_to(what, st, S, SZ, 2e-5);
    for (int64_t t = 0; t < n; t++)
        for (int64_t p = 0; p < parts; p++)
            cpu_delta_rule(k, q + t * Hk * dk, kk + t * Hk * dk, v + t * Hv * dv, a + t * Hv,
                           b + t * Hv, 1, Hk, Hv, dk, dv, A, dtb, l2, eps, qs, st2,
                           o2 + t * Hv * dv, p, p + 1);
    same_bits(what, o2, o, n * Hv * dv);
    same_bits(what, st2, st, SZ);
    free(q), free(kk), free(v), free(a), free(b), free(A), free(dtb), free(st), free(o);
    free(st2), free(o2), free(S), free(ro), free(qn), free(kn), free(mem);
}

int main(void) {
    for (const cpu_kernels *const *kp = cpu_kernels_available(); *kp; kp++) {
        const cpu_kernels *k = *kp;
        test_conv(k, 9, 70, 4, 1, LMH_UNARY_SILU);
        test_conv(k, 1, 33, 2, 0, LMH_UNARY_NONE);
        test_conv(k, 5, 130, 3, 1, LMH_UNARY_SILU); /* past one block of channels */
        test_ssm(k, 11, 24, 16, 1);
        test_ssm(k, 3, 7, 5, 0);
        test_ssd(k, 13, 4, 8, 1, 16, 1, 0, 0);
        test_ssd(k, 6, 6, 5, 3, 7, 0, 0.01f, 0.5f); /* groups, clamped steps */
        test_delta(k, 9, 2, 4, 16, 8, 1, 1);
        test_delta(k, 4, 1, 1, 32, 80, 1, 0); /* columns past one block */
        test_delta(k, 5, 2, 2, 8, 8, 0, 1);   /* no L2 norm */
    }
    printf("recurrent ops: %d checks, %d failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
