/* The CPU backend's attention (LMH_OP_ATTENTION) on every SIMD path this CPU runs, through
 * the plugin's API: long contexts (5000 keys) with groups of 1, 2, 4 and 8 query heads a
 * kv head, K/V in f32, f16 and bf16, sliding windows, rings, soft-capping and (ABI 1.10)
 * attention sinks (a per-head logit in the softmax's denominator only), against a
 * double-precision model; and the invariance rules the backend keeps in exact mode, bit
 * for bit:
 *   - a row alone (a decode step, the cache holding keys up to its position) gives what it
 *     gives as one row of a larger op (a prefill chunk, more keys stored past it);
 *   - 1, 2 or 3 threads give the same bits;
 *   - the same keys in a flat cache, a ring of one size or a ring of another give the same
 *     bits (positions are visited oldest first).
 * usage: test_cpu_attention CPU_PLUGIN
 * Built with -DLMHOST_ATTN_STATIC and the backend's sources instead (run_neon_qemu.sh, a
 * static aarch64 binary): test_cpu_attention, no argument. */
#include "lmhost/lmhost.h"
#include "../test_debug.h"

#ifndef LMHOST_ATTN_STATIC
#include <dlfcn.h>
#endif
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const lmh_backend_api *g_api;
static int g_fail, g_checks;

static void host_log(int level, const char *fmt, ...) {
    if (level > LMH_LOG_WARN) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "log: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

static const lmh_host_api g_host = {
    .size = sizeof(lmh_host_api), .abi_minor = LMH_ABI_MINOR, .log = host_log};

/* A value in [-1, 1) from (a, b, c): the same whichever layout stores it. */
static float val(uint64_t a, uint64_t b, uint64_t c) {
    uint64_t x = a * 0x9e3779b97f4a7c15ull ^ (b + 0x632be59bd9b4e019ull) * 0xbf58476d1ce4e5b9ull ^
                 (c + 7) * 0x94d049bb133111ebull;
    x ^= x >> 31;
    x *= 0xd6e8feb86659fd39ull;
    x ^= x >> 29;
    return (float)((double)(x >> 11) / 4503599627370496.0 - 1.0);
}

static uint16_t to_f16(float f) {
    /* through the value's f32 bits: round to nearest even (normal range only is enough) */
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000, a = u & 0x7fffffff;
    if (a < 0x38800000) return (uint16_t)sign; /* tiny: 0 (values here are far larger or 0) */
    uint32_t r = (a >> 13) - (112u << 10), rem = a & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
    return (uint16_t)(sign | r);
}
static float from_f16(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, em = h & 0x7fff;
    uint32_t u = em ? sign | ((em << 13) + (112u << 23)) : sign;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* A value as the cache stores it (rounded to dt), back in f32. */
static float stored(lmh_dtype dt, float v) {
    return dt == LMH_F16 ? from_f16(to_f16(v)) : dt == LMH_BF16 ? from_bf16(to_bf16(v)) : v;
}

typedef struct acase {
    const char *name;
    int64_t heads, kvh, d, dv;
    lmh_dtype dt;
    int32_t total;  /* positions 0..total-1 exist */
    int32_t window; /* 0: none */
    int32_t ring;   /* 0: flat (kv0 = 0, n_kv = total) */
    int32_t ring2;  /* a second ring size to compare with (0: none) */
    float scale, cap;
    int nrows;  /* query rows: the last nrows positions, and a few earlier ones */
    float sink; /* non-zero: per-head sinks (LMH_ATTN_SINKS) of about this size */
} acase;

/* Head h's sink logit of a case with sinks. */
static float sink_of(const acase *c, int64_t h) {
    return c->sink * val((uint64_t)h, 77, 5);
}

typedef struct bk {
    lmh_backend *b;
    int threads;
    const char *path;
} bk;

static lmh_tensor *upload(lmh_backend *b, lmh_dtype dt, int nd, const int64_t *ne, const void *p) {
    lmh_tensor *t = g_api->tensor_new(b, dt, nd, ne, 0);
    if (!t) {
        fprintf(stderr, "tensor_new failed\n");
        exit(1);
    }
    size_t bytes = lmh_dtype_size(dt);
    for (int i = 0; i < nd; i++) bytes *= (size_t)ne[i];
    if (bytes && g_api->upload(b, t, 0, p, bytes) != LMH_OK) {
        fprintf(stderr, "upload failed\n");
        exit(1);
    }
    return t;
}

/* K or V of the case stored flat (ring 0, rows = total) or in a ring of `ring` rows. */
static void *make_kv(const acase *c, int is_v, int32_t ring, int64_t *rows) {
    const int64_t w = is_v ? c->dv : c->d, es = (int64_t)lmh_dtype_size(c->dt);
    *rows = ring ? ring : c->total;
    uint8_t *p = calloc((size_t)(*rows * c->kvh * w * es), 1);
    int32_t first = ring ? c->total - ring : 0;
    if (first < 0) first = 0;
    for (int32_t pos = first; pos < c->total; pos++) {
        int64_t row = ring ? pos % ring : pos;
        for (int64_t g = 0; g < c->kvh; g++)
            for (int64_t i = 0; i < w; i++) {
                float v = val((uint64_t)pos, (uint64_t)(g * 2 + is_v), (uint64_t)i);
                uint8_t *at = p + ((row * c->kvh + g) * w + i) * es;
                if (c->dt == LMH_F32)
                    memcpy(at, &v, 4);
                else {
                    uint16_t h = c->dt == LMH_F16 ? to_f16(v) : to_bf16(v);
                    memcpy(at, &h, 2);
                }
            }
    }
    return p;
}

/* Runs the case's op for query rows at positions pos[0..n) over the keys stored in a
 * ring of `ring` rows (0: flat, with n_kv = keys positions 0..n_kv-1) into out. */
static void run_op(const bk *be, const acase *c, int32_t ring, int32_t n_kv, const int32_t *pos,
                   int n, float *out) {
    lmh_backend *b = be->b;
    int64_t rows;
    void *kp = make_kv(c, 0, ring, &rows), *vp = make_kv(c, 1, ring, &rows);
    int64_t kne[3] = {rows, c->kvh, c->d}, vne[3] = {rows, c->kvh, c->dv};
    int64_t qne[3] = {n, c->heads, c->d}, one[1] = {n}, one_ne[3] = {n, c->heads, c->dv};
    float *qp = malloc((size_t)(n * c->heads * c->d) * sizeof(float));
    for (int r = 0; r < n; r++)
        for (int64_t i = 0; i < c->heads * c->d; i++)
            qp[r * c->heads * c->d + i] = val((uint64_t)pos[r] + 1000003u, 99, (uint64_t)i);
    lmh_tensor *K = upload(b, c->dt, 3, kne, kp), *V = upload(b, c->dt, 3, vne, vp);
    lmh_tensor *Q = upload(b, LMH_F32, 3, qne, qp), *P = upload(b, LMH_I32, 1, one, pos);
    lmh_tensor *Y = g_api->tensor_new(b, LMH_F32, 3, one_ne, 0), *S = NULL;
    lmh_op op = {.code = LMH_OP_ATTENTION, .dst = Y, .src = {Q, K, V, P}};
    if (c->sink != 0) {
        float sk[64];
        for (int64_t h = 0; h < c->heads; h++) sk[h] = sink_of(c, h);
        S = upload(b, LMH_F32, 1, &c->heads, sk);
        op.p.i[5] = LMH_ATTN_SINKS;
        op.src_more[0] = S;
    }
    if (ring) {
        int32_t stored_n = c->total < ring ? c->total : ring;
        op.p.i[0] = stored_n;
        op.p.i[3] = ring;
        op.p.i[4] = c->total;
    } else {
        op.p.i[0] = n_kv;
        op.p.i[1] = 0;
    }
    op.p.i[2] = c->window;
    op.p.f[0] = c->scale;
    op.p.f[1] = c->cap;
    int rc = g_api->enqueue(b, &op);
    if (rc == LMH_OK) rc = g_api->sync(b);
    if (rc == LMH_OK)
        rc = g_api->download(b, Y, 0, out, (size_t)(n * c->heads * c->dv) * sizeof(float));
    if (rc != LMH_OK) {
        fprintf(stderr, "FAIL %s: enqueue/download: %d\n", c->name, rc);
        g_fail++;
    }
    lmh_tensor *all[] = {K, V, Q, P, Y, S};
    for (int i = 0; i < 6; i++)
        if (all[i]) g_api->tensor_free(b, all[i]);
    free(kp);
    free(vp);
    free(qp);
}

/* The double-precision model of one row (every head) at position pq, all positions
 * 0..total-1 stored: what any layout must give. */
static void reference(const acase *c, int32_t pq, int32_t lo_stored, double *y) {
    int64_t G = c->heads / c->kvh;
    int32_t lo = lo_stored, hi = pq < c->total - 1 ? pq : c->total - 1;
    if (c->window > 0 && pq - c->window + 1 > lo) lo = pq - c->window + 1;
    double *s = malloc((size_t)(c->total + 1) * sizeof(double));
    for (int64_t h = 0; h < c->heads; h++) {
        int64_t g = h / G;
        double mx = -INFINITY;
        for (int32_t p = lo; p <= hi; p++) {
            double dot = 0;
            for (int64_t i = 0; i < c->d; i++)
                dot += (double)val((uint64_t)pq + 1000003u, 99, (uint64_t)(h * c->d + i)) *
                       stored(c->dt, val((uint64_t)p, (uint64_t)(g * 2), (uint64_t)i));
            dot *= c->scale;
            if (c->cap > 0) dot = c->cap * tanh(dot / c->cap);
            s[p - lo] = dot;
            if (dot > mx) mx = dot;
        }
        /* a sink joins the denominator only */
        const double sink = c->sink != 0 ? (double)sink_of(c, h) : -INFINITY;
        if (sink > mx) mx = sink;
        double sum = c->sink != 0 ? exp(sink - mx) : 0;
        for (int32_t p = lo; p <= hi; p++) sum += (s[p - lo] = exp(s[p - lo] - mx));
        for (int64_t j = 0; j < c->dv; j++) {
            double acc = 0;
            for (int32_t p = lo; p <= hi; p++)
                acc +=
                    s[p - lo] * stored(c->dt, val((uint64_t)p, (uint64_t)(g * 2 + 1), (uint64_t)j));
            y[h * c->dv + j] = hi < lo ? 0 : acc / sum;
        }
    }
    free(s);
}

static void same_bits(const char *what, const acase *c, const bk *be, const float *a,
                      const float *b, size_t n) {
    g_checks++;
    if (memcmp(a, b, n * sizeof(float))) {
        size_t i = 0;
        while (!memcmp(a + i, b + i, sizeof(float))) i++;
        fprintf(stderr, "FAIL %s [%s, %d threads] %s: element %zu: %.9g vs %.9g\n", c->name,
                be->path, be->threads, what, i, (double)a[i], (double)b[i]);
        g_fail++;
    }
}

/* One row at position pq as a decode step runs it: the cache holds positions 0..pq (a
 * ring the last of them). */
static void alone(const bk *be, const acase *c, int32_t pq, float *out) {
    acase a = *c;
    a.total = pq + 1;
    run_op(be, &a, a.ring, pq + 1, &pq, 1, out);
}

/* Every check of one case on one path; be[0..nb) are that path's backends (1, 2, 3
 * threads). */
static void run_case(const acase *c, const bk *be, int nb) {
    /* rows: the last few positions, one in the middle, one near the start, one on a chunk
     * boundary */
    int32_t pos[12];
    int n = 0;
    for (int i = 0; i < c->nrows; i++) pos[n++] = c->total - 1 - i;
    int32_t lo_stored = c->ring ? c->total - c->ring : 0;
    if (lo_stored < 0) lo_stored = 0;
    /* (a ring's rows see as far back as a decode step's ring would: its window stored) */
    int32_t extra[3] = {c->total / 2 + 3, c->ring ? lo_stored + c->window + 5 : 1,
                        (c->total / 512) * 256 - 1};
    for (int i = 0; i < (c->ring ? 1 : 3); i++)
        if (extra[i] >= lo_stored && extra[i] < c->total) pos[n++] = extra[i];
    const size_t per = (size_t)(c->heads * c->dv);
    float *y = malloc((size_t)n * per * sizeof(float)),
          *y2 = malloc((size_t)n * per * sizeof(float));
    float *y1 = malloc(per * sizeof(float));
    double *ref = malloc(per * sizeof(double));

    run_op(&be[0], c, c->ring, c->total, pos, n, y);
    /* against the model */
    double worst = 0;
    for (int r = 0; r < n; r++) {
        reference(c, pos[r], lo_stored, ref);
        double mx = 0, md = 0;
        for (size_t i = 0; i < per; i++) {
            double e = fabs(ref[i] - (double)y[r * per + i]);
            if (!(e <= md)) md = e;
            if (fabs(ref[i]) > mx) mx = fabs(ref[i]);
        }
        double rel = md / (mx > 1e-3 ? mx : 1e-3);
        if (!(rel <= worst)) worst = rel;
    }
    g_checks++;
    /* f32 sums over thousands of keys: a few 1e-6 of the largest output */
    if (!(worst < 5e-6)) {
        fprintf(stderr, "FAIL %s [%s]: %.3g of the largest output off the model\n", c->name,
                be[0].path, worst);
        g_fail++;
    }
    /* each row alone, only the keys up to its own position stored: as a decode step sees
     * it */
    for (int r = 0; r < n; r++) {
        alone(&be[0], c, pos[r], y1);
        same_bits("a row alone vs in the batch", c, &be[0], y + r * per, y1, per);
    }
    /* other thread counts */
    for (int t = 1; t < nb; t++) {
        run_op(&be[t], c, c->ring, c->total, pos, n, y2);
        same_bits("threads", c, &be[t], y, y2, (size_t)n * per);
        alone(&be[t], c, pos[0], y1);
        same_bits("a row alone, threads", c, &be[t], y, y1, per);
    }
    /* the same keys in another layout */
    if (c->ring) {
        if (c->ring2) {
            acase c2 = *c;
            c2.ring = c->ring2;
            run_op(&be[0], &c2, c->ring2, 0, pos, n, y2);
            same_bits("another ring size", c, &be[0], y, y2, (size_t)n * per);
        }
        acase cf = *c;
        cf.ring = 0;
        run_op(&be[0], &cf, 0, c->total, pos, n, y2);
        same_bits("flat vs ring", c, &be[0], y, y2, (size_t)n * per);
    }
    printf("ok   %-28s [%s] %d rows, %.2g of the largest output off the model\n", c->name,
           be[0].path, n, worst);
    free(y);
    free(y2);
    free(y1);
    free(ref);
}

#ifdef LMHOST_ATTN_STATIC
const lmh_plugin_info *lmhost_plugin_entry(void);
#endif

static const lmh_backend_api *load(const char *path) {
#ifdef LMHOST_ATTN_STATIC
    lmh_plugin_entry_fn entry = lmhost_plugin_entry;
#else
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "cannot load %s: %s\n", path, dlerror());
        exit(1);
    }
    lmh_plugin_entry_fn entry = (lmh_plugin_entry_fn)(uintptr_t)dlsym(h, LMH_PLUGIN_ENTRY_NAME);
#endif
    const lmh_plugin_info *info = entry ? entry() : NULL;
    if (!info || info->abi_major != LMH_ABI_MAJOR || info->kind != LMH_KIND_BACKEND) {
        fprintf(stderr, "%s: not a backend plugin of this ABI\n", path);
        exit(1);
    }
    char err[256] = "";
    if (info->init && info->init(&g_host, err, sizeof err)) {
        fprintf(stderr, "%s: init failed: %s\n", path, err);
        exit(1);
    }
    return info->api;
}

int main(int argc, char **argv) {
#ifdef LMHOST_ATTN_STATIC
    (void)argv;
    const int want = 1;
#else
    const int want = 2;
#endif
    if (argc != want) {
        fprintf(stderr, "usage: test_cpu_attention CPU_PLUGIN\n");
        return 2;
    }
    g_api = load(want == 2 ? argv[1] : "(static)");
    static const acase cases[] = {
        /* name, heads, kvh, d, dv, dtype, total, window, ring, ring2, scale, cap, rows, sink */
        {"gqa1 f32", 4, 4, 128, 128, LMH_F32, 5000, 0, 0, 0, 0.25f, 0, 3, 0},
        {"gqa2 f16", 8, 4, 128, 128, LMH_F16, 5000, 0, 0, 0, 0.3f, 0, 3, 0},
        {"gqa4 bf16", 8, 2, 128, 128, LMH_BF16, 5000, 0, 0, 0, 0.3f, 0, 3, 0},
        {"gqa8 f16", 16, 2, 128, 128, LMH_F16, 5000, 0, 0, 0, 0.3f, 0, 3, 0},
        {"gqa8 f32 d72 dv44", 8, 1, 72, 44, LMH_F32, 5000, 0, 0, 0, 0.4f, 0, 3, 0},
        {"gqa3 bf16 d72 dv44", 6, 2, 72, 44, LMH_BF16, 3001, 0, 0, 0, 0.4f, 0, 2, 0},
        {"gqa2 f16 soft-cap", 4, 2, 128, 128, LMH_F16, 5000, 0, 0, 0, 1.0f, 5.0f, 3, 0},
        {"gqa4 f16 window", 8, 2, 128, 128, LMH_F16, 5000, 1000, 0, 0, 0.3f, 0, 3, 0},
        {"gqa2 f16 window ring", 4, 2, 128, 128, LMH_F16, 5000, 1000, 1024, 1500, 0.3f, 0, 4, 0},
        {"gqa4 bf16 ring wraps", 8, 2, 64, 64, LMH_BF16, 5000, 700, 777, 1300, 0.5f, 0, 4, 0},
        {"gqa1 f32 short", 2, 2, 16, 16, LMH_F32, 37, 0, 0, 0, 0.5f, 0, 3, 0},
        {"gqa2 f16 ring short", 4, 2, 32, 32, LMH_F16, 45, 8, 16, 24, 0.5f, 2.0f, 3, 0},
        /* attention sinks (ABI 1.10): small, and large enough to take most of the weight */
        {"gqa4 f16 sinks", 8, 2, 64, 64, LMH_F16, 5000, 0, 0, 0, 0.3f, 0, 3, 2.0f},
        {"gqa2 f32 sinks large", 4, 2, 32, 32, LMH_F32, 600, 0, 0, 0, 0.5f, 0, 3, 12.0f},
        {"gqa2 f16 window ring sinks", 4, 2, 64, 64, LMH_F16, 3000, 500, 512, 777, 0.3f, 0, 4,
         3.0f},
        {"gqa1 bf16 short sinks", 2, 2, 16, 16, LMH_BF16, 37, 8, 0, 0, 0.5f, 0, 3, 1.0f},
    };
    static const char *paths[] = {"portable", "avx2", "avx512", "neon"};
    int tested = 0;
    for (size_t pi = 0; pi < sizeof paths / sizeof *paths; pi++) {
        test_debug_set("simd", paths[pi]);
        bk be[3];
        int nb = 0;
        for (int t = 1; t <= 3; t++) {
            lmh_backend_opts o = {.size = sizeof o, .threads = t};
            char err[512] = "";
            be[nb] = (bk){.threads = t, .path = paths[pi]};
            if (g_api->create(&g_host, &o, &be[nb].b, err, sizeof err)) break;
            nb++;
        }
        if (!nb) {
            printf("skip %s: not on this CPU or build\n", paths[pi]);
            continue;
        }
        tested++;
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(&cases[i], be, nb);
        for (int t = 0; t < nb; t++) g_api->destroy(be[t].b);
    }
    printf("%d paths, %d checks, %d failed\n", tested, g_checks, g_fail);
    return g_fail || !tested ? 1 : 0;
}
