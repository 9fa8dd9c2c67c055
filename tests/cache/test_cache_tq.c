/* The TurboQuant cache plugin (plugins/cache-turboquant) through its table, on the CPU
 * backend and, where given and a device is there, on Vulkan, where its kernels are the
 * SPIR-V of plugins/cache-turboquant/shaders.
 *
 * usage: test_cache_tq CACHE_PLUGIN CPU_PLUGIN [VULKAN_PLUGIN]
 *
 * One layer of 2 K/V heads; 4 or 8 query heads (2, 16 and 32 in a few settings); heads of 64,
 * 128 and 256 values (one, one and two blocks; 384 and 512 in a few); tq3 and tq4; every row
 * encoded when appended (hot=0,start=0,step=1) or the hot window's policy with a small start
 * (hot=16,start=32,step=8: rows encoded straight from a long step, then from the f16 ring in steps
 * of 8); a soft-cap on the heads of 256. A sequence gets 37 rows, single rows, 200 rows at once,
 * single rows again (one setting also 8300 rows at once, so that a decode chunk holds several tiles
 * of rows). After every step all its rows are read back (read_rows: the rows the codes decode to,
 * the ring's rows as f32) and the step's queries attend: a single row through the attention on the
 * codes, several through the decoded rows and the backend's attention op. Either must be
 * the softmax attention over what read_rows gives, computed here in double, to 1e-5 of the
 * largest |output| (f32 rounding; a wrong code, sign or norm is 1e-3 or more).
 *
 * With Vulkan, the same settings get the same random rows and queries on both backends:
 * its attention outputs must be the CPU's to 1e-5 of the largest, and what read_rows gives
 * the CPU's bit for bit (the decoder rounds as the C does, so equal rows mean equal
 * records: codes, signs and norms), except for at most one block in 2000 (a rotated value
 * on a boundary; none are expected, the encoder rounding as the C does too).
 * With LMHOST_DEBUG vk-kernel-shared=16384 (a device with 16 KB of shared memory for plugin
 * kernels) Vulkan refuses the attention kernels: decode then reads decoded rows, which
 * must be logged, and all of the above still hold.
 * Exit 0 pass, 1 fail. */
#include "lmhost/lmhost.h"

#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_fail, g_checks;
static uint64_t g_rng;
static int g_refusals; /* "decode reads decoded rows" warnings: attend builds refused */

static void host_log(int level, const char *fmt, ...) {
    if (level > LMH_LOG_WARN) return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "log: %s\n", msg);
    if (strstr(msg, "decode reads decoded rows")) g_refusals++;
}

static const lmh_host_api g_host = {
    .size = sizeof(lmh_host_api), .abi_minor = LMH_ABI_MINOR, .log = host_log};

static void check(int ok, const char *fmt, ...) {
    g_checks++;
    if (ok) return;
    g_fail++;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

static float frand(float lo, float hi) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return lo + (hi - lo) * (float)((g_rng >> 11) * (1.0 / 9007199254740992.0));
}

static const lmh_plugin_info *load(const char *path) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "FAIL: dlopen %s: %s\n", path, dlerror());
        exit(1);
    }
    const lmh_plugin_info *(*entry)(void) =
        (const lmh_plugin_info *(*)(void))(uintptr_t)dlsym(h, LMH_PLUGIN_ENTRY_NAME);
    const lmh_plugin_info *info = entry ? entry() : NULL;
    char err[256] = "";
    if (!info || (info->init && info->init(&g_host, err, sizeof err))) {
        fprintf(stderr, "FAIL: %s: no usable entry %s\n", path, err);
        exit(1);
    }
    return info;
}

static const lmh_cache_api *g_cache;

enum { KVH = 2, APPEND_ONLY = 100000 };

typedef struct setting {
    const char *format, *options;
    int heads, hd;
    float softcap;
    int big;   /* rows of a long append-only step (0: none) */
    int sinks; /* (ABI 1.10) per-head attention sinks */
} setting;

/* What one backend gave for one setting: the single-row attention outputs of every step
 * and, after the last step, every row read back. */
typedef struct result {
    float *att, *k, *v;
    size_t n_att, n_rows;
} result;

static lmh_tensor *upload(const lmh_backend_api *be, lmh_backend *b, lmh_dtype dt, int ndim,
                          const int64_t *ne, const void *data) {
    lmh_tensor *t = be->tensor_new(b, dt, ndim, ne, 0);
    size_t n = lmh_dtype_size(dt);
    for (int i = 0; i < ndim; i++) n *= (size_t)ne[i];
    if (!t || be->upload(b, t, 0, data, n) != LMH_OK) {
        fprintf(stderr, "FAIL: tensor upload\n");
        exit(1);
    }
    return t;
}

/* out[n, heads, hd]: queries at positions pos - n .. pos - 1 over rows k, v [pos, KVH, hd]
 * (each query sees the rows up to its own position), softmax in double */
static void attend_ref(const float *q, int n, int heads, int hd, const float *k, const float *v,
                       int pos, float scale, float softcap, const float *sinks, double *out) {
    double *s = malloc((size_t)pos * sizeof(double));
    for (int r = 0; r < n; r++) {
        int pq = pos - n + r;
        for (int h = 0; h < heads; h++) {
            int g = h / (heads / KVH);
            const float *qh = q + ((size_t)r * heads + h) * hd;
            double m = -INFINITY, sum = 0, *o = out + ((size_t)r * heads + h) * hd;
            for (int j = 0; j <= pq; j++) {
                const float *kj = k + ((size_t)j * KVH + g) * hd;
                double d = 0;
                for (int i = 0; i < hd; i++) d += (double)qh[i] * kj[i];
                d *= scale;
                if (softcap > 0) d = softcap * tanh(d / softcap);
                s[j] = d;
                if (d > m) m = d;
            }
            /* a sink joins the denominator only */
            if (sinks && sinks[h] > m) m = sinks[h];
            if (sinks) sum = exp(sinks[h] - m);
            for (int i = 0; i < hd; i++) o[i] = 0;
            for (int j = 0; j <= pq; j++) {
                double w = exp(s[j] - m);
                const float *vj = v + ((size_t)j * KVH + g) * hd;
                sum += w;
                for (int i = 0; i < hd; i++) o[i] += w * vj[i];
            }
            for (int i = 0; i < hd; i++) o[i] /= sum;
        }
    }
    free(s);
}

static void run_setting(const char *name, const lmh_backend_api *be, lmh_backend *b,
                        const setting *S, uint64_t seed, result *res, double *worst) {
    const int hd = S->hd, heads = S->heads;
    lmh_layer_state st = {LMH_STATE_KV, KVH, hd, hd, 0};
    lmh_cache_config cfg = {sizeof cfg, S->format, 1, &st, 0, NULL, S->options, 0};
    char err[256] = "", label[128];
    snprintf(label, sizeof label, "%s %s,%s heads %d of %d", name, S->format, S->options, heads,
             hd);
    lmh_cache *c = NULL;
    if (g_cache->create(&g_host, be, b, &cfg, &c, err, sizeof err) != LMH_OK) {
        check(0, "%s: create: %s", label, err);
        return;
    }
    g_rng = seed;
    const uint64_t id = 3;
    g_cache->seq_add(c, id);
    const int steps_small[] = {37, 1, 1, 1, 1, 1, 1, 200, 1, 1, 1};
    const int steps_big[] = {37, 1, APPEND_ONLY + S->big, 1, 1};
    const int *steps = S->big ? steps_big : steps_small;
    int n_steps = S->big ? 5 : 11, pos = 0, most = 0;
    for (int i = 0; i < n_steps; i++) most += steps[i] % APPEND_ONLY;
    size_t row = (size_t)KVH * hd;
    float *k = malloc((size_t)most * row * sizeof(float)),
          *v = malloc((size_t)most * row * sizeof(float));
    res->att = malloc((size_t)n_steps * heads * hd * sizeof(float));
    res->n_att = 0;
    float sinks[32];
    for (int h = 0; h < heads && h < 32; h++) sinks[h] = (float)(h % 5) - 1.0f;
    int64_t nh = heads;
    lmh_tensor *skt = S->sinks ? upload(be, b, LMH_F32, 1, &nh, sinks) : NULL;
    lmh_attn_params ap = {
        .scale = (float)(1.0 / sqrt((double)hd)), .softcap = S->softcap, .sinks = skt};
    for (int si = 0; si < n_steps; si++) {
        int n = steps[si] % APPEND_ONLY, only_append = steps[si] >= APPEND_ONLY;
        float *kn = malloc((size_t)n * row * sizeof(float)),
              *vn = malloc((size_t)n * row * sizeof(float));
        /* keys with an offset per channel (as real keys have), values plain */
        for (size_t i = 0; i < (size_t)n * row; i++)
            kn[i] = frand(-1.0f, 1.0f) + (float)(i % 5) * 0.2f;
        for (size_t i = 0; i < (size_t)n * row; i++) vn[i] = frand(-1.0f, 1.0f);
        int64_t ne[3] = {n, KVH, hd};
        lmh_tensor *kt = upload(be, b, LMH_F32, 3, ne, kn), *vt = upload(be, b, LMH_F32, 3, ne, vn);
        int rc = g_cache->append(c, id, 0, kt, vt);
        be->tensor_free(b, kt);
        be->tensor_free(b, vt);
        free(kn);
        free(vn);
        pos += n;
        check(rc == LMH_OK, "%s: step %d: append %d rows: %d", label, si, n, rc);
        if (rc != LMH_OK) break;
        /* every row as the cache holds it */
        int64_t all[3] = {pos, KVH, hd};
        lmh_tensor *kr = be->tensor_new(b, LMH_F32, 3, all, 0),
                   *vr = be->tensor_new(b, LMH_F32, 3, all, 0);
        rc = g_cache->read_rows(c, id, 0, 0, pos, kr, vr);
        if (rc == LMH_OK) rc = be->download(b, kr, 0, k, (size_t)pos * row * sizeof(float));
        if (rc == LMH_OK) rc = be->download(b, vr, 0, v, (size_t)pos * row * sizeof(float));
        be->tensor_free(b, kr);
        be->tensor_free(b, vr);
        check(rc == LMH_OK, "%s: step %d: read_rows: %d", label, si, rc);
        if (rc != LMH_OK) break;
        if (only_append) continue;
        size_t nq = (size_t)n * heads * hd;
        float *q = malloc(nq * sizeof(float)), *got = malloc(nq * sizeof(float));
        double *want = malloc(nq * sizeof(double));
        for (size_t i = 0; i < nq; i++) q[i] = frand(-1.0f, 1.0f);
        int32_t *qp = malloc((size_t)n * sizeof(int32_t));
        for (int r = 0; r < n; r++) qp[r] = pos - n + r;
        int64_t qne[3] = {n, heads, hd}, pne[1] = {n};
        lmh_tensor *qt = upload(be, b, LMH_F32, 3, qne, q),
                   *pt = upload(be, b, LMH_I32, 1, pne, qp);
        lmh_tensor *ot = be->tensor_new(b, LMH_F32, 3, qne, 0);
        rc = g_cache->attend(c, id, 0, qt, pt, ot, &ap);
        if (rc == LMH_OK) rc = be->download(b, ot, 0, got, nq * sizeof(float));
        be->tensor_free(b, qt);
        be->tensor_free(b, pt);
        be->tensor_free(b, ot);
        check(rc == LMH_OK, "%s: step %d: attend %d rows: %d", label, si, n, rc);
        if (rc == LMH_OK) {
            attend_ref(q, n, heads, hd, k, v, pos, ap.scale, ap.softcap, skt ? sinks : NULL, want);
            double maxw = 0, maxd = 0;
            for (size_t i = 0; i < nq; i++) {
                double e = fabs(got[i] - want[i]);
                if (fabs(want[i]) > maxw) maxw = fabs(want[i]);
                if (!(e <= maxd)) maxd = isnan(e) ? INFINITY : e;
            }
            if (maxd / maxw > *worst) *worst = maxd / maxw;
            check(maxd <= 1e-5 * maxw, "%s: step %d (%d rows, %s): max |d| %.3g of %.3g", label, si,
                  n, n == 1 ? "codes" : "decoded rows", maxd, maxw);
            if (n == 1) {
                memcpy(res->att + res->n_att, got, nq * sizeof(float));
                res->n_att += nq;
            }
        }
        free(q);
        free(got);
        free(want);
        free(qp);
    }
    if (skt) be->tensor_free(b, skt);
    res->k = k;
    res->v = v;
    res->n_rows = (size_t)pos;
    g_cache->seq_remove(c, id);
    g_cache->destroy(c);
}

static const setting g_settings[] = {
    {"tq3", "hot=0,start=0,step=1", 4, 64, 0, 0, 0},
    {"tq3", "hot=0,start=0,step=1", 8, 128, 0, 0, 0},
    {"tq3", "hot=0,start=0,step=1", 4, 256, 30, 0, 0},
    {"tq4", "hot=0,start=0,step=1", 8, 64, 0, 0, 0},
    {"tq4", "hot=0,start=0,step=1", 4, 128, 0, 0, 0},
    {"tq4", "hot=0,start=0,step=1", 8, 256, 30, 0, 0},
    {"tq3", "hot=16,start=32,step=8", 8, 64, 0, 0, 0},
    {"tq3", "hot=16,start=32,step=8", 4, 128, 0, 0, 0},
    {"tq3", "hot=16,start=32,step=8", 8, 256, 30, 0, 0},
    {"tq4", "hot=16,start=32,step=8", 4, 64, 0, 0, 0},
    {"tq4", "hot=16,start=32,step=8", 8, 128, 0, 0, 0},
    {"tq4", "hot=16,start=32,step=8", 4, 256, 30, 0, 0},
    {"tq3", "hot=0,start=0,step=1,qjl=off", 4, 128, 0, 0, 0},
    {"tq3", "hot=16,start=32,step=8", 8, 128, 0, 8300, 0},
    /* more query heads a K/V head (8 and 16: the kernels take them 8 or 4 at a time), heads
     * of 512 and of 384 */
    {"tq3", "hot=16,start=32,step=8", 16, 128, 0, 0, 0},
    {"tq4", "hot=0,start=0,step=1", 32, 256, 30, 0, 0},
    {"tq3", "hot=0,start=0,step=1", 8, 512, 0, 0, 0},
    {"tq3", "hot=16,start=32,step=8", 16, 512, 0, 0, 0},
    {"tq3", "hot=0,start=0,step=1", 6, 384, 0, 0, 0},
    {"tq4", "hot=16,start=32,step=8", 2, 64, 0, 0, 0}, /* one query a K/V head */
    /* 1100 rows of 4 blocks: encode's 8800 workgroups take rows of the grid, as past 65535
     * workgroups on a GPU, where meson.build gives Vulkan vk-kernel-grid-x=4096 */
    {"tq3", "hot=0,start=0,step=1", 4, 512, 0, 1100, 0},
    /* attention sinks (ABI 1.10): the codes' merge in decode, the backend's attention over
     * decoded rows in prefill, with and without hot rows */
    {"tq3", "hot=0,start=0,step=1", 8, 128, 0, 0, 1},
    {"tq4", "hot=16,start=32,step=8", 4, 64, 0, 0, 1},
    {"tq3", "hot=16,start=32,step=8", 16, 256, 30, 0, 1},
};
enum { NS = sizeof g_settings / sizeof *g_settings };

/* Vulkan's results for setting S against the CPU's */
static void compare(const setting *S, const result *cpu, const result *vk) {
    char label[128];
    snprintf(label, sizeof label, "vulkan against cpu: %s,%s heads %d of %d", S->format, S->options,
             S->heads, S->hd);
    if (!cpu->att || !vk->att || cpu->n_att != vk->n_att || cpu->n_rows != vk->n_rows) {
        check(0, "%s: the runs differ in length", label);
        return;
    }
    double maxw = 0, maxd = 0;
    for (size_t i = 0; i < cpu->n_att; i++) {
        double e = fabs((double)vk->att[i] - cpu->att[i]);
        if (fabs(cpu->att[i]) > maxw) maxw = fabs(cpu->att[i]);
        if (!(e <= maxd)) maxd = isnan(e) ? INFINITY : e;
    }
    check(maxd <= 1e-5 * maxw, "%s: attention max |d| %.3g of %.3g", label, maxd, maxw);
    /* blocks (of 64 or 128 values) of keys and values read back differently */
    int m = S->hd == 64 ? 64 : 128;
    size_t blocks = cpu->n_rows * KVH * (size_t)(S->hd / m), diff = 0;
    for (int kv = 0; kv < 2; kv++) {
        const float *a = kv ? cpu->v : cpu->k, *b = kv ? vk->v : vk->k;
        for (size_t i = 0; i < blocks; i++)
            diff += memcmp(a + i * m, b + i * m, (size_t)m * sizeof(float)) != 0;
    }
    printf("%s: attention %.2e of the largest, %zu of %zu blocks read back differently\n", label,
           maxd / maxw, diff, 2 * blocks);
    check(diff * 2000 <= 2 * blocks, "%s: %zu of %zu blocks differ", label, diff, 2 * blocks);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: test_cache_tq CACHE_PLUGIN CPU_PLUGIN [VULKAN_PLUGIN]\n");
        return 2;
    }
    g_cache = load(argv[1])->api;
    result res[2][NS];
    memset(res, 0, sizeof res);
    int ran[2] = {0, 0};
    for (int i = 2; i < argc && i < 4; i++) {
        const lmh_backend_api *be = load(argv[i])->api;
        lmh_backend_opts o = {.size = sizeof o, .threads = 2};
        lmh_backend *b = NULL;
        char err[256] = "";
        if (be->create(&g_host, &o, &b, err, sizeof err) != LMH_OK) {
            printf("skip %s: %s\n", argv[i], err); /* no Vulkan device here */
            continue;
        }
        const char *name = i == 2 ? "cpu" : "vulkan";
        /* vk-kernel-shared=16384: the Vulkan backend refuses both attend builds */
        char kv[32];
        const char *ks = i != 2 && lmh_debug_get("vk-kernel-shared", kv, sizeof kv) ? kv : NULL;
        int refusals = g_refusals;
        double worst = 0;
        for (int s = 0; s < NS; s++)
            run_setting(name, be, b, &g_settings[s], 0x9e3779b97f4a7c15ull * (uint64_t)(s + 1),
                        &res[i - 2][s], &worst);
        printf("%s: worst attention error %.2e of the largest output (tolerance 1e-5)\n", name,
               worst);
        if (ks && atoi(ks) > 0 && atoi(ks) <= 16384)
            check(g_refusals > refusals, "%s with vk-kernel-shared=%s: attend refused", name, ks);
        else if (!ks)
            check(g_refusals == refusals, "%s: attend's builds run", name);
        ran[i - 2] = 1;
        be->destroy(b);
    }
    if (ran[0] && ran[1])
        for (int s = 0; s < NS; s++) compare(&g_settings[s], &res[0][s], &res[1][s]);
    for (int i = 0; i < 2; i++)
        for (int s = 0; s < NS; s++) {
            free(res[i][s].att);
            free(res[i][s].k);
            free(res[i][s].v);
        }
    printf("%d checks, %d failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
