/* lmhost cache-eval: what a cache format does to the vectors it stores, measured through the
 * cache plugin's own table (plugin ABI 1.8: read_rows, row_bytes), so that any plugin and
 * format is measured the same way. A stable contract: outside checks parse its one line of
 * JSON.
 *
 * N random unit vectors x of dimension D are appended as the keys and the values of one
 * sequence of a one-layer cache (1 K/V head of D, no window, LMH_CACHE_SETTLED: every row in
 * its final form), then read back decoded. For each x, a unit vector y with <x, y> = 0.5:
 *   v_mse      mean of ||x - x~||^2 over the values read back (x as appended, in f32);
 *   k_ip_bias  mean of <y, k~> - 0.5 over the keys read back;
 *   k_ip_var   variance (divided by N) of <y, k~> - 0.5;
 *   k/v_bits_per_dim  8 x row_bytes / D.
 *
 * The generator, fixed so that a seed gives the same vectors everywhere: splitmix64 seeded
 * with S gives 64-bit words; a uniform u in (0, 1] is ((w >> 11) + 1) x 2^-53; Box-Muller in
 * double turns two uniforms u1, u2 into sqrt(-2 ln u1) cos(2 pi u2) and then
 * sqrt(-2 ln u1) sin(2 pi u2), used in that order. For each vector in turn, D normal draws
 * make x (divided by its norm), then D more make g, from which Gram-Schmidt takes
 * w = (g - <g, x> x) / ||g - <g, x> x||, and y = 0.5 x + sqrt(0.75) w. */
#include "cache_spec.h"
#include "cli.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK 256 /* rows an append and a read */

typedef struct rng {
    uint64_t s;
    double spare; /* Box-Muller's second value */
    int has_spare;
} rng;

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double uniform01(rng *r) { /* (0, 1]: never 0, whose log is -inf */
    return (double)((splitmix64(&r->s) >> 11) + 1) * 0x1p-53;
}

static double normal(rng *r) {
    if (r->has_spare) {
        r->has_spare = 0;
        return r->spare;
    }
    double u1 = uniform01(r), u2 = uniform01(r);
    double m = sqrt(-2.0 * log(u1)), a = 2.0 * M_PI * u2;
    r->spare = m * sin(a);
    r->has_spare = 1;
    return m * cos(a);
}

static double dot(const double *a, const double *b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* x and y of one pair as above; g is scratch of D. Returns 0, or -1 for a degenerate draw
 * (a zero vector, or g along x), which at double precision does not happen. */
static int draw_pair(rng *r, int64_t D, double *x, double *y, double *g) {
    for (int64_t i = 0; i < D; i++) x[i] = normal(r);
    double n = sqrt(dot(x, x, D));
    for (int64_t i = 0; i < D; i++) g[i] = normal(r);
    if (!(n > 0)) return -1;
    for (int64_t i = 0; i < D; i++) x[i] /= n;
    double gx = dot(g, x, D);
    for (int64_t i = 0; i < D; i++) g[i] -= gx * x[i];
    double gn = sqrt(dot(g, g, D));
    if (!(gn > 0)) return -1;
    for (int64_t i = 0; i < D; i++) y[i] = 0.5 * x[i] + sqrt(0.75) * (g[i] / gn);
    return 0;
}

/* s as a JSON string's contents (the spec is the user's text). */
static void json_str(FILE *f, const char *s) {
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
}

/* Whether the plugin's table has member `m` (tables grow by minor versions) and it is set. */
#define HAS(api, m) ((api)->size >= offsetof(lmh_cache_api, m) + sizeof(api)->m && (api)->m)

#define ABOUT                                                                                      \
    "Stores N random unit vectors of dimension D as keys and values in the cache format SPEC\n"    \
    "(as --cache takes it: PLUGIN, PLUGIN:FORMAT or FORMAT, then ,key=value settings), reads\n"    \
    "them back and prints one JSON line: format, dim, k_bits_per_dim, v_bits_per_dim, v_mse,\n"    \
    "k_ip_bias, k_ip_var.\n"

int cli_cache_eval(int argc, char **argv) {
    const char *spec = NULL, *dim_s = NULL, *n_s = NULL, *seed_s = NULL, *backend = NULL,
               *threads_s = NULL, *device_s = NULL, *plugin_dir = NULL;
    cli_opt opts[] = {
        {"--cache", &spec, NULL, 0, "SPEC", "required", "the cache format and its settings"},
        {"--dim", &dim_s, NULL, 0, "D", "required", "the vectors' dimension (a head's size)"},
        {"--vectors", &n_s, NULL, 0, "N", "required", "how many vectors"},
        {"--seed", &seed_s, NULL, 0, "S", "required", "the random vectors' seed"},
        {"--backend", &backend, NULL, 0, "NAME[:OPTIONS]", "cpu",
         "the backend plugin the cache runs on, and its options"},
        {"--threads", &threads_s, NULL, 0, "N", "all cores", "CPU threads"},
        {"--device", &device_s, NULL, 0, "N", "0", "the backend's device index"},
        {"--plugin-dir", &plugin_dir, NULL, 0, "DIR", "none",
         "a directory searched for plugins before the usual places"},
        {.help = ABOUT}};
    if (cli_parse(argc, argv, opts)) return 2;
    if (!spec || !dim_s || !n_s || !seed_s) {
        fprintf(stderr, "lmhost cache-eval: --cache, --dim, --vectors and --seed are required\n");
        cli_help(stderr, argv[0], opts);
        return 2;
    }
    int64_t D, N, seed, threads = 0, device = 0;
    if (cli_int("--dim", dim_s, 1, 1 << 16, &D) || cli_int("--vectors", n_s, 1, 1 << 24, &N) ||
        cli_int("--seed", seed_s, 0, INT64_MAX, &seed) ||
        (threads_s && cli_int("--threads", threads_s, 1, 1024, &threads)) ||
        (device_s && cli_int("--device", device_s, 0, 255, &device)))
        return 2;
    if (N * D > (int64_t)1 << 26) { /* y in double and x in f32: 768 MiB at most */
        fprintf(stderr, "lmhost cache-eval: --vectors x --dim must be at most 2^26 (got %lld)\n",
                (long long)(N * D));
        return 2;
    }

    registry reg = {0};
    lmh_backend *b = NULL;
    lmh_cache *c = NULL;
    const lmh_backend_api *be = NULL;
    const lmh_cache_api *ca = NULL;
    lmh_tensor *kt = NULL, *vt = NULL;
    double *x = NULL, *y = NULL, *g = NULL;
    float *xf = NULL, *buf = NULL;
    int rc = 1;
    char err[1024] = "";
    if (registry_load(&reg, plugin_dir)) goto out;
    cache_spec cs;
    if (cache_spec_parse(&reg, spec, &cs, err, sizeof err)) {
        fprintf(stderr, "lmhost cache-eval: %s\n", err);
        goto out;
    }
    ca = cs.p->info->api;
    if (!HAS(ca, read_rows) || !HAS(ca, row_bytes)) {
        fprintf(stderr,
                "lmhost cache-eval: cache plugin '%s' (built for plugin ABI %u.%u) has no "
                "read_rows/row_bytes, which plugin ABI 1.8 added\n",
                cs.p->info->name, cs.p->info->abi_major, cs.p->info->abi_minor);
        goto out;
    }
    lmh_backend_opts bo = {
        .size = sizeof bo, .threads = (int32_t)threads, .device = (int32_t)device};
    const plugin *bp = NULL;
    if (registry_backend_start(&reg, backend ? backend : "cpu", &bo, &bp, &b, err, sizeof err)) {
        fprintf(stderr, "lmhost cache-eval: %s\n", err);
        goto out;
    }
    be = bp->info->api;
    lmh_layer_state st = {.kind = LMH_STATE_KV,
                          .n_kv_heads = 1,
                          .head_dim_k = (int32_t)D,
                          .head_dim_v = (int32_t)D,
                          .window = 0};
    lmh_cache_config cc = {.size = sizeof cc,
                           .format = cs.format,
                           .n_layers = 1,
                           .layers = &st,
                           .max_seq_len = (int32_t)N,
                           .recurrent = NULL,
                           .options = cs.options[0] ? cs.options : NULL,
                           .flags = LMH_CACHE_SETTLED};
    err[0] = 0;
    if (ca->create(&host_api, be, b, &cc, &c, err, sizeof err) != 0 || !c) {
        fprintf(stderr, "lmhost cache-eval: cache %s (format %s) failed to start: %s\n",
                cs.p->info->name, cs.format, err[0] ? err : "no reason");
        c = NULL;
        goto out;
    }
    uint64_t kbytes = 0, vbytes = 0;
    ca->row_bytes(c, 0, &kbytes, &vbytes);

    /* the vectors: x as appended (f32) and y in double */
    x = malloc((size_t)D * sizeof *x);
    g = malloc((size_t)D * sizeof *g);
    y = malloc((size_t)(N * D) * sizeof *y);
    xf = malloc((size_t)(N * D) * sizeof *xf);
    buf = malloc((size_t)CHUNK * (size_t)D * sizeof *buf);
    int64_t ne[3] = {CHUNK, 1, D};
    if (!x || !g || !y || !xf || !buf) {
        fprintf(stderr, "lmhost cache-eval: out of memory\n");
        goto out;
    }
    rng r = {.s = (uint64_t)seed};
    for (int64_t j = 0; j < N; j++) {
        if (draw_pair(&r, D, x, y + j * D, g)) {
            fprintf(stderr, "lmhost cache-eval: a degenerate random draw (vector %lld)\n",
                    (long long)j);
            goto out;
        }
        for (int64_t i = 0; i < D; i++) xf[j * D + i] = (float)x[i];
    }
    if (ca->seq_add(c, 1) != LMH_OK) {
        fprintf(stderr, "lmhost cache-eval: the cache refused a sequence\n");
        goto out;
    }
    /* appended in chunks of CHUNK rows, keys and values the same vectors */
    for (int64_t at = 0; at < N; at += CHUNK) {
        ne[0] = N - at < CHUNK ? N - at : CHUNK;
        size_t bytes = (size_t)(ne[0] * D) * sizeof(float);
        kt = be->tensor_new(b, LMH_F32, 3, ne, 0);
        vt = be->tensor_new(b, LMH_F32, 3, ne, 0);
        int e = kt && vt ? LMH_OK : LMH_ENOMEM;
        if (e == LMH_OK) e = be->upload(b, kt, 0, xf + at * D, bytes);
        if (e == LMH_OK) e = be->upload(b, vt, 0, xf + at * D, bytes);
        if (e == LMH_OK) e = ca->append(c, 1, 0, kt, vt);
        if (kt) be->tensor_free(b, kt);
        if (vt) be->tensor_free(b, vt);
        kt = vt = NULL;
        if (e != LMH_OK) {
            fprintf(stderr, "lmhost cache-eval: appending rows %lld.. failed (error %d)\n",
                    (long long)at, e);
            goto out;
        }
    }
    /* read back the same way; errors of every vector in double */
    double v_se = 0, *k_err = malloc((size_t)N * sizeof *k_err);
    if (!k_err) {
        fprintf(stderr, "lmhost cache-eval: out of memory\n");
        goto out;
    }
    int bad = 0;
    for (int64_t at = 0; at < N && !bad; at += CHUNK) {
        ne[0] = N - at < CHUNK ? N - at : CHUNK;
        size_t bytes = (size_t)(ne[0] * D) * sizeof(float);
        kt = be->tensor_new(b, LMH_F32, 3, ne, 0);
        vt = be->tensor_new(b, LMH_F32, 3, ne, 0);
        int e = kt && vt ? LMH_OK : LMH_ENOMEM;
        if (e == LMH_OK) e = ca->read_rows(c, 1, 0, (int32_t)at, (int32_t)ne[0], kt, vt);
        if (e == LMH_OK) e = be->download(b, vt, 0, buf, bytes);
        for (int64_t j = 0; e == LMH_OK && j < ne[0]; j++) {
            const float *xv = xf + (at + j) * D, *dv = buf + j * D;
            for (int64_t i = 0; i < D; i++) {
                double d = (double)xv[i] - (double)dv[i];
                v_se += d * d;
            }
        }
        if (e == LMH_OK) e = be->download(b, kt, 0, buf, bytes);
        for (int64_t j = 0; e == LMH_OK && j < ne[0]; j++) {
            const double *yv = y + (at + j) * D;
            const float *dk = buf + j * D;
            double s = 0;
            for (int64_t i = 0; i < D; i++) s += yv[i] * (double)dk[i];
            k_err[at + j] = s - 0.5;
        }
        if (kt) be->tensor_free(b, kt);
        if (vt) be->tensor_free(b, vt);
        kt = vt = NULL;
        if (e != LMH_OK) {
            fprintf(stderr, "lmhost cache-eval: reading rows %lld.. back failed (error %d)\n",
                    (long long)at, e);
            bad = 1;
        }
    }
    double bias = 0, var = 0;
    for (int64_t j = 0; !bad && j < N; j++) bias += k_err[j];
    bias /= (double)N;
    for (int64_t j = 0; !bad && j < N; j++) var += (k_err[j] - bias) * (k_err[j] - bias);
    var /= (double)N;
    free(k_err);
    if (bad) goto out;
    double v_mse = v_se / (double)N;
    if (!isfinite(v_mse) || !isfinite(bias) || !isfinite(var)) {
        fprintf(stderr,
                "lmhost cache-eval: the rows read back are not finite (v_mse %g, "
                "k_ip_bias %g, k_ip_var %g)\n",
                v_mse, bias, var);
        goto out;
    }
    printf("{\"format\": \"");
    json_str(stdout, spec);
    printf("\", \"dim\": %lld, \"k_bits_per_dim\": %.9g, \"v_bits_per_dim\": %.9g, \"v_mse\": "
           "%.9g, \"k_ip_bias\": %.9g, \"k_ip_var\": %.9g}\n",
           (long long)D, 8.0 * (double)kbytes / (double)D, 8.0 * (double)vbytes / (double)D, v_mse,
           bias, var);
    rc = fflush(stdout) == 0 ? 0 : 1;
out:
    if (c) ca->destroy(c);
    if (b) be->destroy(b);
    registry_free(&reg);
    free(x);
    free(y);
    free(g);
    free(xf);
    free(buf);
    return rc;
}
