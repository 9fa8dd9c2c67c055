/* Sampler tests: greedy picks the lowest id of the largest logit, skipping NaNs (as the
 * one-comparison-a-logit loop it replaced did), and sampling keeps its contracts. */
#include "exp_nonpos.h"
#include "sampler.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fails, checks;

static void check(int ok, const char *what, int32_t n, int32_t got, int32_t want) {
    checks++;
    if (!ok) {
        if (++fails <= 10) /* the first few say enough */
            fprintf(stderr, "FAIL %s (n %d): got %d, want %d\n", what, n, got, want);
    }
}

/* the definition: the first index whose value exceeds every value before it */
static int32_t reference(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static uint64_t rng = 88172645463325252ULL;
static uint32_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}

/* values drawn from a small set, so that ties, zeros of both signs, NaNs and infinities
 * meet in every position of the eight running maxima */
static float pick(int kinds) {
    static const float v[] = {1.0f, 2.0f, -1.0f, 0.0f, -0.0f, 3.0f, -INFINITY, INFINITY, NAN};
    return v[next() % (uint32_t)kinds];
}

static int32_t greedy(float *x, int32_t n) {
    sampler_params p = sampler_defaults();
    char err[128];
    sampler *s = sampler_new(&p, n, err, sizeof err);
    if (!s) {
        fprintf(stderr, "sampler_new: %s\n", err);
        exit(1);
    }
    int32_t t = sampler_sample(s, x, NULL, 0);
    sampler_free(s);
    return t;
}

static void greedy_cases(void) {
    float x[200];
    for (int kinds = 2; kinds <= 9; kinds++)
        for (int32_t n = 1; n <= 40; n++)
            for (int rep = 0; rep < 200; rep++) {
                for (int32_t i = 0; i < n; i++) x[i] = pick(kinds);
                int32_t want = reference(x, n);
                check(greedy(x, n) == want, "mixed values", n, greedy(x, n), want);
            }
    /* named cases */
    float a[] = {NAN, 5, 7};
    check(greedy(a, 3) == 0, "NaN first", 3, greedy(a, 3), 0);
    float b[] = {1, NAN, 7, 7, NAN};
    check(greedy(b, 5) == 2, "NaN between, tie", 5, greedy(b, 5), 2);
    float c[] = {-1, -0.0f, 0.0f};
    check(greedy(c, 3) == 1, "signed zeros", 3, greedy(c, 3), 1);
    float d[] = {-INFINITY, -INFINITY};
    check(greedy(d, 2) == 0, "all -inf", 2, greedy(d, 2), 0);
    /* a real vocabulary's size, the maximum in each of the last positions */
    int32_t V = 151936;
    float *big = malloc((size_t)V * sizeof *big);
    if (!big) exit(1);
    for (int32_t at = V - 9; at < V; at++) {
        for (int32_t i = 0; i < V; i++) big[i] = (float)(next() % 1000) * 0.01f;
        big[at] = 100;
        check(greedy(big, V) == at, "vocabulary-sized", V, greedy(big, V), at);
    }
    for (int32_t i = 0; i < V; i++) big[i] = (float)(next() % 1000) * 0.01f;
    int32_t want = reference(big, V);
    check(greedy(big, V) == want, "vocabulary-sized ties", V, greedy(big, V), want);
    free(big);
}

/* top-k 1 is greedy whatever the temperature; a seed reproduces a run */
static void sampling_cases(void) {
    enum { V = 1000 };
    float x[V], y[V];
    for (int rep = 0; rep < 50; rep++) {
        for (int i = 0; i < V; i++) x[i] = (float)(next() % 10000) * 0.001f;
        memcpy(y, x, sizeof x);
        int32_t want = reference(x, V);
        sampler_params p = sampler_defaults();
        p.temperature = 1.5f;
        p.top_k = 1;
        p.seed = (uint64_t)rep;
        char err[128];
        sampler *s = sampler_new(&p, V, err, sizeof err);
        int32_t got = sampler_sample(s, y, NULL, 0);
        check(got == want, "top-k 1", V, got, want);
        sampler_free(s);
    }
    sampler_params p = sampler_defaults();
    p.temperature = 0.8f;
    p.top_p = 0.9f;
    p.seed = 7;
    int32_t runs[2][20];
    for (int r = 0; r < 2; r++) {
        char err[128];
        sampler *s = sampler_new(&p, V, err, sizeof err);
        uint64_t keep = rng;
        rng = 12345;
        for (int t = 0; t < 20; t++) {
            for (int i = 0; i < V; i++) x[i] = (float)(next() % 10000) * 0.001f;
            runs[r][t] = sampler_sample(s, x, NULL, 0);
        }
        rng = keep;
        sampler_free(s);
    }
    for (int t = 0; t < 20; t++)
        check(runs[0][t] == runs[1][t], "seeded run", V, runs[1][t], runs[0][t]);
}

/* draws n tokens; fails on any outside allowed[], and on any allowed one never drawn */
static void draws(const char *what, const float *x, int32_t V, sampler_params p,
                  const char *allowed, int n) {
    char err[128];
    sampler *s = sampler_new(&p, V, err, sizeof err);
    float *y = malloc((size_t)V * sizeof *y);
    char *seen = calloc((size_t)V, 1);
    if (!s || !y || !seen) exit(1);
    for (int d = 0; d < n; d++) {
        memcpy(y, x, (size_t)V * sizeof *y);
        int32_t t = sampler_sample(s, y, NULL, 0);
        if (t < 0 || t >= V || !allowed[t]) {
            check(0, what, V, t, -1);
            break;
        }
        seen[t] = 1;
    }
    for (int32_t i = 0; i < V; i++)
        if (allowed[i] && !seen[i]) {
            check(0, what, V, -1, i);
            break;
        }
    checks++;
    free(seen);
    free(y);
    sampler_free(s);
}

/* the filters keep exactly the candidates they should, whatever their positions */
static void filter_cases(void) {
    int32_t V = 151936;
    float *x = malloc((size_t)V * sizeof *x);
    char *ok = calloc((size_t)V, 1);
    if (!x || !ok) exit(1);
    /* top-k 40 over distinct random logits, drawn almost flat (temperature 1e4): exactly
     * the 40 largest come out, each of them */
    for (int32_t i = 0; i < V; i++) x[i] = (float)(next() % 1000000) * 1e-3f;
    for (int rep = 0; rep < 3; rep++) {
        float *sorted = malloc((size_t)V * sizeof *sorted);
        memcpy(sorted, x, (size_t)V * sizeof *x);
        /* the 40th largest value by selection on a copy */
        float cut = -INFINITY;
        for (int k = 0; k < 40; k++) {
            int32_t bi = 0;
            for (int32_t i = 1; i < V; i++)
                if (sorted[i] > sorted[bi]) bi = i;
            cut = sorted[bi];
            sorted[bi] = -INFINITY;
        }
        free(sorted);
        int32_t kept = 0;
        for (int32_t i = 0; i < V; i++) kept += ok[i] = x[i] >= cut;
        if (kept != 40) { /* a tie at the cut: draw again */
            for (int32_t i = 0; i < V; i++) x[i] = (float)(next() % 1000000) * 1e-3f;
            continue;
        }
        sampler_params p = sampler_defaults();
        p.temperature = 1e4f;
        p.top_k = 40;
        p.seed = (uint64_t)rep;
        draws("top-k 40 of a vocabulary", x, V, p, ok, 2000);
        break;
    }
    /* top-p: four candidates of mass 0.5, 0.3, 0.15, 0.05 placed anywhere, the rest
     * negligible; 0.75 keeps the first two, 0.9 three */
    memset(ok, 0, (size_t)V);
    for (int32_t i = 0; i < V; i++) x[i] = -40;
    int32_t at[4] = {151000, 17, 99999, 5};
    float mass[4] = {0.5f, 0.3f, 0.15f, 0.05f};
    for (int k = 0; k < 4; k++) x[at[k]] = logf(mass[k]);
    sampler_params p = sampler_defaults();
    p.temperature = 1;
    p.top_p = 0.75f;
    ok[at[0]] = ok[at[1]] = 1;
    draws("top-p 0.75", x, V, p, ok, 500);
    p.top_p = 0.9f;
    ok[at[2]] = 1;
    draws("top-p 0.9", x, V, p, ok, 500);
    /* top-p 0.9985 over 1000 nearly equal candidates: the prefix grows to all but one of
     * them; the lowest is cut and never drawn, every other one is */
    int32_t n = 1000;
    memset(ok, 0, (size_t)V);
    for (int32_t i = 0; i < n; i++) {
        x[i] = -(float)((i * 7919) % n) * 1e-6f; /* order unrelated to position */
        ok[i] = (i * 7919) % n < n - 1;
    }
    p.top_p = 0.9985f;
    draws("top-p 0.9985 of 1000", x, n, p, ok, 20000);
    free(ok);
    free(x);
}

/* the softmax's exp against the C library's in double: relative error, NaN, the floor */
static void exp_cases(void) {
    double worst = 0;
    for (int32_t i = 0; i <= 4000000; i += 4) {
        f32x4 x = {-87.0f * (float)i / 4000000, -87.0f * (float)(i + 1) / 4000000,
                   -87.0f * (float)(i + 2) / 4000000, -(float)(next() % 87000) * 1e-3f};
        f32x4 y = exp_nonpos4(x);
        for (int j = 0; j < 4; j++) {
            if (x[j] < -87.0f) continue; /* 0 there: checked below */
            double want = exp((double)x[j]), err = fabs(y[j] - want) / want;
            if (err > worst) worst = err;
        }
    }
    printf("exp_nonpos4: worst relative error %.3g over [-87, 0]\n", worst);
    check(worst < 4e-7, "exp relative error below 4e-7", 0, (int)(worst * 1e9), 400);
    f32x4 odd = exp_nonpos4((f32x4){NAN, -88.0f, -INFINITY, 0.0f});
    check(odd[0] == 1 && odd[1] == 0 && odd[2] == 0 && odd[3] == 1, "exp of NaN, -88, -inf, 0", 4,
          (int)(odd[0] * 10 + odd[1] * 100 + odd[2] * 1000), 10 + 0);
}

/* the drawn frequencies follow the softmax (each count within 5 sigma), the top-p cut falls
 * on the right side of a 1e-4 margin, and +inf logits take all the mass */
static void distribution_cases(void) {
    enum { V = 4, N = 40000 };
    float x[V], y[V];
    for (int i = 0; i < V; i++) x[i] = logf((float)(i + 1)); /* 0.1 0.2 0.3 0.4 */
    sampler_params p = sampler_defaults();
    p.temperature = 1;
    p.seed = 3;
    char err[128];
    sampler *s = sampler_new(&p, V, err, sizeof err);
    int count[V] = {0};
    for (int d = 0; d < N; d++) {
        memcpy(y, x, sizeof x);
        count[sampler_sample(s, y, NULL, 0)]++;
    }
    sampler_free(s);
    for (int i = 0; i < V; i++) {
        double q = (i + 1) / 10.0, mean = N * q, sd = sqrt(N * q * (1 - q));
        check(fabs(count[i] - mean) < 5 * sd, "softmax frequencies", V, count[i], (int)mean);
    }
    /* 0.4 + 0.3 = 0.7: top-p 0.6999 keeps two, 0.7001 three; scaled by a temperature */
    char ok[V] = {0, 0, 1, 1};
    for (int i = 0; i < V; i++) x[i] = 2.5f * logf((float)(i + 1));
    p.temperature = 2.5f;
    p.top_p = 0.6999f;
    draws("top-p just under a sum", x, V, p, ok, 400);
    ok[1] = 1;
    p.top_p = 0.7001f;
    draws("top-p just over a sum", x, V, p, ok, 400);
    /* NaN and -inf logits are never drawn, with or without a filter (the plain path and
     * the candidates'); 1001 logits, so that the vectors' tail is used */
    enum { W = 1001 };
    static float z[W];
    static char valid[W];
    for (int i = 0; i < W; i++) {
        z[i] = i % 3 == 0 ? NAN : i % 3 == 1 ? -INFINITY : 0.001f * (float)(i % 7);
        valid[i] = i % 3 == 2;
    }
    z[W - 1] = 0.5f, valid[W - 1] = 1; /* in the tail */
    p = sampler_defaults();
    p.temperature = 1;
    draws("NaN and -inf never drawn", z, W, p, valid, 20000);
    p.min_p = 1e-3f;
    draws("NaN and -inf never drawn, min-p", z, W, p, valid, 20000);
    /* top-k 10 of 1000 equal logits: the ten lowest ids (ties go by id) */
    static float flat[1000];
    static char first10[1000];
    for (int i = 0; i < 1000; i++) first10[i] = i < 10;
    p = sampler_defaults();
    p.temperature = 1;
    p.top_k = 10;
    draws("top-k 10 of 1000 ties", flat, 1000, p, first10, 2000);
    /* +inf logits share the mass; finite ones beside them get none */
    float inf[V] = {1, INFINITY, 3, INFINITY};
    char only_inf[V] = {0, 1, 0, 1};
    p = sampler_defaults();
    p.temperature = 0.7f;
    draws("+inf logits", inf, V, p, only_inf, 200);
}

/* which parameters leave a sampler a plain argmax (the engine then brings back ids alone) */
static void greedy_flag_cases(void) {
    struct {
        const char *what;
        sampler_params p;
        int greedy;
    } c[6];
    for (int i = 0; i < 6; i++) c[i].p = sampler_defaults();
    c[0].what = "defaults", c[0].greedy = 1;
    c[1].what = "top-k with temperature 0", c[1].p.top_k = 5, c[1].greedy = 1;
    c[2].what = "temperature 0.7", c[2].p.temperature = 0.7f, c[2].greedy = 0;
    c[3].what = "repetition penalty", c[3].p.repetition_penalty = 1.1f, c[3].greedy = 0;
    c[4].what = "presence penalty", c[4].p.presence_penalty = 0.5f, c[4].greedy = 0;
    c[5].what = "frequency penalty", c[5].p.frequency_penalty = 0.5f, c[5].greedy = 0;
    for (int i = 0; i < 6; i++) {
        char err[128];
        sampler *s = sampler_new(&c[i].p, 16, err, sizeof err);
        int g = s ? sampler_is_greedy(s) : -1;
        check(g == c[i].greedy, c[i].what, 16, g, c[i].greedy);
        sampler_free(s);
    }
    float x[5] = {NAN, 3, 1, 3, 2}, y[5] = {1, 3, NAN, 3, 2};
    check(sampler_argmax(x, 5) == 0, "sampler_argmax, a NaN first", 5, sampler_argmax(x, 5), 0);
    check(sampler_argmax(y, 5) == 1, "sampler_argmax, ties", 5, sampler_argmax(y, 5), 1);
}

int main(void) {
    greedy_flag_cases();
    exp_cases();
    distribution_cases();
    greedy_cases();
    sampling_cases();
    filter_cases();
    printf("%d checks, %d failed\n", checks, fails);
    return fails != 0;
}
