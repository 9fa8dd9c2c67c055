#include "sampler.h"
#include "exp_nonpos.h"
#include "log.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct cand {
    float logit;
    int32_t id;
} cand;

struct sampler {
    sampler_params p;
    int32_t vocab;
    uint64_t rng[4];
    cand *c, *tmp;   /* tmp: the radix sort's other half */
    float *e;        /* the candidates' probabilities (unnormalised), in their order */
    int32_t *counts; /* occurrences of each token in the history, for the penalties */
};

sampler_params sampler_defaults(void) {
    return (sampler_params){
        .temperature = 0, .top_k = 0, .top_p = 1, .min_p = 0, .repetition_penalty = 1, .seed = 0};
}

/* xoshiro256** seeded through splitmix64: small, fast, and the same on every machine. */
static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}
static uint64_t next_u64(uint64_t *s) {
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}
static double uniform(uint64_t *s) {
    return (double)(next_u64(s) >> 11) * 0x1.0p-53;
}

sampler *sampler_new(const sampler_params *p, int32_t vocab, char *err, size_t err_len) {
    if (!(p->temperature >= 0) || !isfinite(p->temperature)) {
        errf(err, err_len, "temperature must be >= 0 (got %g)", p->temperature);
        return NULL;
    }
    if (p->top_k < 0) {
        errf(err, err_len, "top_k must be >= 0 (got %d)", p->top_k);
        return NULL;
    }
    if (!(p->top_p > 0 && p->top_p <= 1)) {
        errf(err, err_len, "top_p must be in (0, 1] (got %g)", p->top_p);
        return NULL;
    }
    if (!(p->min_p >= 0 && p->min_p <= 1)) {
        errf(err, err_len, "min_p must be in [0, 1] (got %g)", p->min_p);
        return NULL;
    }
    if (!(p->repetition_penalty > 0) || !isfinite(p->repetition_penalty)) {
        errf(err, err_len, "repetition_penalty must be > 0 (got %g)", p->repetition_penalty);
        return NULL;
    }
    if (!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty)) {
        errf(err, err_len, "presence/frequency penalties must be finite numbers");
        return NULL;
    }
    sampler *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->p = *p;
    s->vocab = vocab;
    s->c = malloc((size_t)vocab * sizeof *s->c);
    s->tmp = malloc((size_t)vocab * sizeof *s->tmp);
    s->e = malloc((size_t)vocab * sizeof *s->e);
    s->counts = calloc((size_t)vocab, sizeof *s->counts);
    if (!s->c || !s->tmp || !s->e || !s->counts) {
        sampler_free(s);
        errf(err, err_len, "out of memory");
        return NULL;
    }
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix(&x);
    return s;
}

void sampler_free(sampler *s) {
    if (!s) return;
    free(s->c);
    free(s->tmp);
    free(s->e);
    free(s->counts);
    free(s);
}

/* The largest of start and x[0..n), NaNs skipped (start not NaN), in eight running maxima,
 * which the CPU keeps apart and the compiler makes vector maxima (one would wait on each
 * comparison). */
static float max_of(const float *x, int32_t n, float start) {
    float m[8];
    for (int j = 0; j < 8; j++) m[j] = start;
    int32_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
    for (; i < n; i++) m[0] = x[i] > m[0] ? x[i] : m[0];
    for (int j = 1; j < 8; j++) m[0] = m[j] > m[0] ? m[j] : m[0];
    return m[0];
}

/* The lowest index of the largest value (NaNs skipped; a NaN first is returned as is): the
 * maximum, then its first index, sixteen values at a time up to the block that holds it. The loop
 * that tracked the index in its running comparison took 0.8 ms over a 151936-entry vocabulary, in
 * the path of every decoded token; this takes about 0.02 ms. */
int32_t sampler_argmax(const float *x, int32_t n) {
    if (n <= 0 || x[0] != x[0]) return 0;
    float best = max_of(x, n, x[0]);
    int32_t i;
    for (i = 0; i + 16 <= n; i += 16) { /* the first block holding it, sixteen at a time */
        int hit = 0;
        for (int j = 0; j < 16; j++) hit |= x[i + j] == best;
        if (hit) break;
    }
    for (; i < n; i++)
        if (x[i] == best) return i;
    return 0;
}

/* e[i] = exp(c[i].logit - mx) for i < n, where no logit exceeds mx */
static void exp_shifted(float *e, const cand *c, int32_t n, float mx) {
    int32_t i = 0;
    for (; i + 4 <= n; i += 4) {
        f32x4 x = {c[i].logit, c[i + 1].logit, c[i + 2].logit, c[i + 3].logit};
        f32x4 y = exp_nonpos4(x - mx);
        memcpy(e + i, &y, sizeof y);
    }
    if (i < n) {
        f32x4 x = {0, 0, 0, 0};
        for (int32_t j = 0; i + j < n; j++) x[j] = c[i + j].logit - mx;
        f32x4 y = exp_nonpos4(x);
        for (int32_t j = 0; i + j < n; j++) e[i + j] = y[j];
    }
}

/* the largest of c[0..n).logit, none NaN, in eight running maxima (one would wait on each
 * comparison) */
static float max_logit(const cand *c, int32_t n) {
    float m[8];
    for (int j = 0; j < 8; j++) m[j] = -INFINITY;
    int32_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) m[j] = c[i + j].logit > m[j] ? c[i + j].logit : m[j];
    for (; i < n; i++) m[0] = c[i].logit > m[0] ? c[i].logit : m[0];
    for (int j = 1; j < 8; j++) m[0] = m[j] > m[0] ? m[j] : m[0];
    return m[0];
}

/* sum of e[0..n) in double, in four running sums (one would wait on each add) */
static double sum_of(const float *e, int32_t n) {
    double s[4] = {0, 0, 0, 0};
    int32_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++) s[j] += e[i + j];
    for (; i < n; i++) s[0] += e[i];
    return (s[0] + s[1]) + (s[2] + s[3]);
}

static int by_logit_desc(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit < y->logit ? 1 : -1;
    return x->id - y->id;
}

/* whether any penalty changes the logits (sampler_is_greedy relies on this being all) */
static int has_penalties(const sampler_params *p) {
    return p->repetition_penalty != 1 || p->presence_penalty != 0 || p->frequency_penalty != 0;
}

static void penalties(sampler *s, float *lg, const int32_t *hist, int32_t n) {
    const sampler_params *p = &s->p;
    if (!has_penalties(p)) return;
    for (int32_t i = 0; i < n; i++)
        if (hist[i] >= 0 && hist[i] < s->vocab) s->counts[hist[i]]++;
    for (int32_t i = 0; i < n; i++) {
        int32_t t = hist[i];
        if (t < 0 || t >= s->vocab || s->counts[t] == 0) continue;
        float v = lg[t];
        if (p->repetition_penalty != 1)
            v = v > 0 ? v / p->repetition_penalty : v * p->repetition_penalty;
        v -= p->presence_penalty + p->frequency_penalty * (float)s->counts[t];
        lg[t] = v;
        s->counts[t] = 0; /* once per distinct token; also leaves counts zeroed */
    }
}

/* whether candidate a comes before b: higher logit, then lower id (a total order) */
static int before(const cand *a, const cand *b) {
    return a->logit != b->logit ? a->logit > b->logit : a->id < b->id;
}

static void swap_cand(cand *a, cand *b) {
    cand t = *a;
    *a = *b;
    *b = t;
}

/* Puts the k first candidates of c[0..n) in order at its front and returns k: quickselect
 * (median-of-three pivots), then a sort of those k; a whole sort where the partitions keep
 * coming out lopsided. */
static int32_t sort_first(cand *c, int32_t n, int32_t k) {
    int32_t lo = 0, hi = n - 1, rounds = 0;
    while (k < n && lo < hi) {
        if (++rounds > 64) {
            qsort(c + lo, (size_t)(hi - lo + 1), sizeof *c, by_logit_desc);
            break;
        }
        int32_t mid = lo + (hi - lo) / 2;
        if (before(&c[mid], &c[lo])) swap_cand(&c[mid], &c[lo]);
        if (before(&c[hi], &c[lo])) swap_cand(&c[hi], &c[lo]);
        if (before(&c[mid], &c[hi])) swap_cand(&c[mid], &c[hi]); /* the median to c[hi] */
        cand piv = c[hi];
        int32_t at = lo;
        for (int32_t i = lo; i < hi; i++)
            if (before(&c[i], &piv)) swap_cand(&c[i], &c[at++]);
        swap_cand(&c[at], &c[hi]);
        if (at == k - 1 || at == k) break;
        if (at > k)
            hi = at - 1;
        else
            lo = at + 1;
    }
    qsort(c, (size_t)k, sizeof *c, by_logit_desc);
    return k;
}

/* the candidates: finite logits (and +inf ones) over the temperature, in id order */
static int32_t candidates(cand *c, const float *lg, int32_t V, float temperature) {
    int32_t n = 0;
    for (int32_t i = 0; i < V; i++)
        if (isfinite(lg[i]) || lg[i] > 0) c[n++] = (cand){lg[i] / temperature, i};
    return n;
}

/* a float's bits as an unsigned key that orders the values from the largest down (not NaN;
 * -0 ties with +0, as the comparator has it) */
static uint32_t desc_key(float v) {
    uint32_t k;
    memcpy(&k, &v, sizeof k);
    k = k == 0x80000000u ? 0 : k;
    return k & 0x80000000u ? k : ~k & 0x7fffffffu;
}

/* c[0..n), in id order, into by_logit_desc order: a stable radix sort (three passes of 11
 * bits) on desc_key, so that ties keep their ascending ids. For most of a vocabulary, where
 * qsort's calls to the comparator took 25 ms at 151936 candidates. */
static void radix_sort(cand *c, cand *tmp, int32_t n) {
    cand *from = c, *to = tmp;
    for (int shift = 0; shift < 33; shift += 11) {
        int32_t at[2048] = {0};
        for (int32_t i = 0; i < n; i++) at[(desc_key(from[i].logit) >> shift) & 2047]++;
        for (int32_t b = 0, sum = 0; b < 2048; b++) {
            int32_t k = at[b];
            at[b] = sum;
            sum += k;
        }
        for (int32_t i = 0; i < n; i++)
            to[at[(desc_key(from[i].logit) >> shift) & 2047]++] = from[i];
        cand *t = from;
        from = to;
        to = t;
    }
    memcpy(c, from, (size_t)n * sizeof *c); /* three passes: the result is in tmp */
}

/* The top k of c[0..n) in order at its front; returns k. One pass counts the candidates by
 * the top 11 bits of desc_key, and those in the buckets up to the one that holds the k-th
 * go to the front: sort_first then selects among those few (1.1 -> 0.3 ms for the top 40 of
 * 151936). Exact: a candidate of a later bucket has a smaller logit than all of that one. */
static int32_t top_k(cand *c, int32_t n, int32_t k) {
    int32_t count[2048] = {0};
    for (int32_t i = 0; i < n; i++) count[desc_key(c[i].logit) >> 21]++;
    int32_t b = 0;
    for (int32_t above = 0; above + count[b] < k; b++) above += count[b];
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++)
        if ((int32_t)(desc_key(c[i].logit) >> 21) <= b) swap_cand(&c[i], &c[m++]);
    return sort_first(c, m, k);
}

/* The draw's place in e[0..n) (unnormalised probabilities) for a uniform u: whole blocks'
 * sums first, then the block's elements. -1 only if rounding left the draw past the end. */
static int32_t draw(const float *e, int32_t n, double u) {
    double r = u * sum_of(e, n), acc = 0;
    int32_t i = 0;
    for (double b; i + 256 <= n && r >= acc + (b = sum_of(e + i, 256)); i += 256) acc += b;
    for (; i < n; i++) {
        acc += e[i];
        if (r < acc) return i;
    }
    return -1;
}

/* Temperature alone: the probabilities straight from the logits, in id order (the
 * candidates' order), without building candidates (0.41 -> 0.32 ms a token over 151936
 * logits). Returns -1 where the general path decides: no finite logit, or an infinite one. */
static int32_t sample_plain(sampler *s, const float *lg, int32_t V, float temperature) {
    float top = max_of(lg, V, -INFINITY);
    if (!isfinite(top)) return -1;
    float mx = top / temperature; /* the largest quotient: dividing keeps the order */
    float *e = s->e;
    for (int32_t i = 0; i < V; i += 4) {
        f32x4 x = {0, 0, 0, 0};
        if (i + 4 <= V)
            memcpy(&x, lg + i, sizeof x);
        else
            for (int j = 0; i + j < V; j++) x[j] = lg[i + j];
        i32x4 nan = x != x; /* NaN logits are no candidates: weight 0 */
        f32x4 y = (f32x4)((i32x4)exp_nonpos4(x / temperature - mx) & ~nan);
        if (i + 4 <= V)
            memcpy(e + i, &y, sizeof y);
        else
            for (int j = 0; i + j < V; j++) e[i + j] = y[j];
    }
    int32_t t = draw(e, V, uniform(s->rng));
    if (t >= 0) return t;
    t = V - 1; /* rounding left the draw past the end: the last candidate, as below */
    while (t > 0 && e[t] == 0) t--;
    return t;
}

int sampler_is_greedy(const sampler *s) {
    const sampler_params *p = &s->p;
    return p->temperature == 0 && !has_penalties(p);
}

int32_t sampler_sample(sampler *s, float *lg, const int32_t *hist, int32_t n_hist) {
    const sampler_params *p = &s->p;
    const int32_t V = s->vocab;
    penalties(s, lg, hist, n_hist);
    if (p->temperature == 0) return sampler_argmax(lg, V);
    if ((p->top_k == 0 || p->top_k >= V) && p->top_p >= 1 && p->min_p <= 0) {
        int32_t t = sample_plain(s, lg, V, p->temperature);
        if (t >= 0) return t;
    }
    cand *c = s->c;
    int32_t n = candidates(c, lg, V, p->temperature);
    if (n == 0) return 0;
    /* Only what a filter looks at is put in order: the top k, or as long a prefix as the
     * top-p mass needs (sorting a whole vocabulary took 25-31 ms a token at 151936). */
    int sorted = 0;
    if (p->top_k > 0 && p->top_k < n) {
        n = top_k(c, n, p->top_k);
        sorted = 1;
    }
    float mx = sorted ? c[0].logit : max_logit(c, n);
    float *e = s->e;
    if (p->top_p < 1) {
        exp_shifted(e, s->c, n, mx);
        double sum = sum_of(e, n);
        for (int32_t m = sorted ? n : 64;; m = m > n / 64 ? n : m * 64) {
            if (m > n) m = n;
            if (!sorted && m < n) sort_first(c, n, m);
            if (!sorted && m == n) { /* most of them: all, from id order */
                candidates(c, lg, V, p->temperature);
                radix_sort(c, s->tmp, n);
            }
            exp_shifted(e, s->c, m, mx);
            double acc = 0;
            int32_t keep = 0;
            for (int32_t i = 0; i < m && !keep; i++) {
                acc += e[i] / sum;
                if (acc >= p->top_p) keep = i + 1;
            }
            if (keep || m == n) {
                if (keep) n = keep;
                break;
            }
        }
    }
    exp_shifted(e, s->c, n, mx); /* from here on: unnormalised probabilities */
    if (p->min_p > 0) {
        /* the largest probability is exp(0) = 1 after the shift */
        int32_t m = 0;
        for (int32_t i = 0; i < n; i++)
            if (e[i] >= p->min_p) {
                s->c[m] = s->c[i];
                e[m++] = e[i];
            }
        n = m > 0 ? m : 1;
    }
    int32_t t = draw(e, n, uniform(s->rng));
    return c[t >= 0 ? t : n - 1].id;
}
