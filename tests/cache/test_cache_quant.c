/* The group-quantized cache plugin (plugins/cache-quant) through its table, on the CPU
 * backend and, where given and a device is there, on Vulkan: the plugin's own kernels run
 * through the backends' kernel interface (plugin ABI 1.6).
 *
 * usage: test_cache_quant CACHE_PLUGIN CPU_PLUGIN [VULKAN_PLUGIN]
 *
 * Four layers: full attention with 2 K/V heads of 64 (GQA: 4 query heads); a sliding
 * window of 5 with one K/V head of 128 for 4 queries and a soft-cap; keys of 64 with
 * values of 32; heads of 16. Decode steps take the plugin's own attention over the codes
 * in the first two and its dequantized copy with the backend's attention op in the other
 * two (shapes its kernel does not take), as every step of several rows does. A sequence
 * gets a prompt of 7 rows, 12 decode steps, then a step of 9 rows (the ring grows past
 * its window and shrinks back), and after a trim a few more steps: one of 70 rows, and
 * 8300 rows appended at once before two decode steps, so that decode splits the rows over
 * many chunks of several blocks each. Every other step appends random keys and values and
 * attends. The expected output is this file's own model of the format (affine codes per
 * group, the group's minimum as bias and (max - min) x f32(1 / (2^bits - 1)) as scale, a
 * value's code the q whose interval [(q - 0.5) scale, (q + 0.5) scale) holds value - min,
 * products rounded to f32) with the attention in double precision.
 *
 * Tolerance: the codes are exact, so outputs agree within 1e-5 x the largest |value| (the
 * f32 attention's own rounding; an indexing or packing error is O(1), one code a step off
 * about 1e-3 at 8 bits). The cache's bytes must be exactly the format's size, and bad
 * formats and head sizes, and a backend without plugin kernels, are refused with a
 * message. The setting group=N (ABI 1.8) runs the same steps with groups of 16, 32 and 128
 * on the layers they divide; unknown or bad settings are refused naming what is known.
 * Exit 0 pass, 1 fail. */
#include "lmhost/lmhost.h"

#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_fail, g_checks;
static uint64_t g_rng = 0x2545f4914f6cdd1dull;

static int g_copy_logs; /* "decode reads a dequantized copy" warnings: refused attend builds */

static void host_log(int level, const char *fmt, ...) {
    if (level > LMH_LOG_WARN) return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "log: %s\n", msg);
    if (strstr(msg, "decode reads a dequantized copy")) g_copy_logs++;
}

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

/* A backend whose kernel_add refuses the decode attention builds, as one whose device has
 * too little shared memory for them: the cache must decode through its f32 copy instead. */
static int (*g_inner_kernel_add)(lmh_backend *, const lmh_kernel_desc *, lmh_kernel **, char *,
                                 size_t);
static int refuse_attend(lmh_backend *b, const lmh_kernel_desc *d, lmh_kernel **out, char *err,
                         size_t err_len) {
    if (d && d->name && strstr(d->name, "attend ")) {
        *out = NULL;
        snprintf(err, err_len, "kernel '%s' refused by the test", d->name);
        return LMH_EUNSUPPORTED;
    }
    return g_inner_kernel_add(b, d, out, err, err_len);
}

static const lmh_host_api g_host = {
    .size = sizeof(lmh_host_api), .abi_minor = LMH_ABI_MINOR, .log = host_log};

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

/* ---- the format's model ---------------------------------------------------------------- */

/* x's hd values quantized and dequantized in groups of `group` at `bits` */
static void round_trip(const float *x, double *out, int hd, int group, int bits) {
    for (int g0 = 0; g0 < hd; g0 += group) {
        float mn = x[g0], mx = x[g0];
        for (int i = 1; i < group; i++) {
            if (x[g0 + i] < mn) mn = x[g0 + i];
            if (x[g0 + i] > mx) mx = x[g0 + i];
        }
        float nb = (float)((1 << bits) - 1), scale = (mx - mn) * (1.0f / nb);
        if (!(scale > 0)) scale = 1;
        for (int i = 0; i < group; i++) {
            /* the code whose interval [(q - 0.5) scale, (q + 0.5) scale) holds v - min,
             * the products rounded to f32 as the kernels compute them */
            float d = x[g0 + i] - mn, q = 0;
            while (q < nb && d >= (q + 0.5f) * scale) q += 1;
            out[g0 + i] = (double)q * scale + mn;
        }
    }
}

typedef struct layer {
    lmh_layer_state st;
    int heads;
    float softcap;
    /* every position's keys and values as appended, and as the format keeps them */
    float *k, *v;
    double *kq, *vq;
    int pos;
    const float *sinks; /* (ABI 1.10) per-head sink logits, or NULL */
} layer;

enum { MAXPOS = 8500, APPEND_ONLY = 1000, NL = 4 };

static int g_group; /* the setting group=N of the run, 0: none */

static int group_of(int hd) {
    return g_group ? g_group : hd % 64 == 0 ? 64 : hd % 32 == 0 ? 32 : 16;
}

/* out[n, heads, dv] of queries q at positions pos - n .. pos - 1 over the kept rows */
static void attend_ref(const layer *L, const float *q, int n, double *out) {
    int d = L->st.head_dim_k, dv = L->st.head_dim_v, kvh = L->st.n_kv_heads;
    double scale = 1.0 / sqrt((double)d);
    for (int r = 0; r < n; r++) {
        int pq = L->pos - n + r;
        for (int h = 0; h < L->heads; h++) {
            int g = h / (L->heads / kvh);
            double m = -INFINITY, sum = 0, acc[256] = {0}, s[MAXPOS];
            for (int pk = 0; pk <= pq; pk++) {
                if (L->st.window && pq - pk >= L->st.window) continue;
                double dot = 0;
                for (int i = 0; i < d; i++)
                    dot += (double)q[((size_t)r * L->heads + h) * d + i] *
                           L->kq[((size_t)pk * kvh + g) * d + i];
                dot *= scale;
                if (L->softcap > 0) dot = L->softcap * tanh(dot / L->softcap);
                s[pk] = dot;
                if (dot > m) m = dot;
            }
            /* a sink joins the denominator only */
            if (L->sinks && L->sinks[h] > m) m = L->sinks[h];
            if (L->sinks) sum = exp(L->sinks[h] - m);
            for (int pk = 0; pk <= pq; pk++) {
                if (L->st.window && pq - pk >= L->st.window) continue;
                double w = exp(s[pk] - m);
                sum += w;
                for (int i = 0; i < dv; i++) acc[i] += w * L->vq[((size_t)pk * kvh + g) * dv + i];
            }
            for (int i = 0; i < dv; i++) out[((size_t)r * L->heads + h) * dv + i] = acc[i] / sum;
        }
    }
}

/* ---- one backend ------------------------------------------------------------------------ */

static const lmh_cache_api *g_cache;

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

static void check_refusals(const lmh_backend_api *be, lmh_backend *b, lmh_layer_state *st) {
    char err[256];
    lmh_cache *c = NULL;
    lmh_cache_config cfg = {.size = sizeof cfg, .format = "q3", .n_layers = 1, .layers = st};
    int rc = g_cache->create(&g_host, be, b, &cfg, &c, err, sizeof err);
    g_checks++;
    if (rc == LMH_OK || !strstr(err, "q3")) {
        fprintf(stderr, "FAIL: format q3 accepted or no message (%d: %s)\n", rc, err);
        g_fail++;
    }
    lmh_layer_state odd = {LMH_STATE_KV, 1, 24, 24, 0};
    cfg = (lmh_cache_config){.size = sizeof cfg, .format = "q8", .n_layers = 1, .layers = &odd};
    err[0] = 0;
    rc = g_cache->create(&g_host, be, b, &cfg, &c, err, sizeof err);
    g_checks++;
    if (rc == LMH_OK || !strstr(err, "multiples of 16")) {
        fprintf(stderr, "FAIL: head size 24 accepted or no message (%d: %s)\n", rc, err);
        g_fail++;
    }
    /* a backend built before ABI 1.6: its table ends before kernel_add */
    lmh_backend_api old = *be;
    old.size = (uint32_t)offsetof(lmh_backend_api, kernel_add);
    cfg = (lmh_cache_config){.size = sizeof cfg, .format = "q8", .n_layers = 1, .layers = st};
    err[0] = 0;
    rc = g_cache->create(&g_host, &old, b, &cfg, &c, err, sizeof err);
    g_checks++;
    if (rc == LMH_OK || !strstr(err, "plugin kernels")) {
        fprintf(stderr, "FAIL: a backend without plugin kernels accepted (%d: %s)\n", rc, err);
        g_fail++;
    }
    /* settings (ABI 1.8): group=N alone, N one of 16..128 dividing the head sizes (64 here) */
    static const struct {
        const char *options, *says;
    } bad[] = {{"group=48", "16, 32, 64 or 128"},
               {"group=", "16, 32, 64 or 128"},
               {"group=064", "16, 32, 64 or 128"},
               {"bits=4", "unknown setting 'bits=4' (known: group="},
               {"group=32,hot=0", "unknown setting 'hot=0'"},
               {"group=32,", "unknown setting ''"},
               {"group=32,group=32", "given twice"},
               {"group=128", "group=128 does not divide layer 0's head sizes (64 and 64)"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cfg = (lmh_cache_config){.size = sizeof cfg,
                                 .format = "q4",
                                 .n_layers = 1,
                                 .layers = st,
                                 .options = bad[i].options};
        err[0] = 0;
        c = NULL;
        rc = g_cache->create(&g_host, be, b, &cfg, &c, err, sizeof err);
        check(rc == LMH_EINVAL && !c && strstr(err, bad[i].says),
              "settings '%s' refused saying '%s' (%d: %s)", bad[i].options, bad[i].says, rc, err);
    }
    /* a host of ABI 1.7 passes a struct without options: whatever lies past it is not read */
    cfg = (lmh_cache_config){.size = offsetof(lmh_cache_config, options),
                             .format = "q4",
                             .n_layers = 1,
                             .layers = st,
                             .options = "bogus"};
    c = NULL;
    rc = g_cache->create(&g_host, be, b, &cfg, &c, err, sizeof err);
    check(rc == LMH_OK && c, "a 1.7 config's options are not read (%d: %s)", rc, err);
    if (c) g_cache->destroy(c);
}

/* group: the setting group=N (0: none, the plugin's pick), on the layers whose heads it
 * divides: 16 on all four, 32 on the first three, 128 on heads of 128 alone (layer 1 is the
 * sliding window in each) */
static void run_backend(const char *name, const lmh_backend_api *be, lmh_backend *b, int bits,
                        int group) {
    layer L[NL] = {
        {.st = {LMH_STATE_KV, 2, 64, 64, 0}, .heads = 4, .softcap = 0},
        {.st = {LMH_STATE_KV, 1, 128, 128, 5}, .heads = 4, .softcap = 20},
        {.st = {LMH_STATE_KV, 2, 64, 32, 0}, .heads = 2, .softcap = 0},
        {.st = {LMH_STATE_KV, 1, 16, 16, 0}, .heads = 1, .softcap = 0},
    };
    int nl = group == 32 ? 3 : NL;
    /* the q4 runs give the full and the sliding layer attention sinks (ABI 1.10): the codes'
     * merge in decode, the backend's attention in prefill */
    static const float sinks[4] = {0.5f, 3.0f, -1.0f, 6.0f};
    if (bits == 4) L[0].sinks = L[1].sinks = sinks;
    if (group == 128) {
        L[0].st = (lmh_layer_state){LMH_STATE_KV, 2, 128, 128, 0};
        nl = 2;
    }
    lmh_layer_state st[NL];
    for (int l = 0; l < nl; l++) st[l] = L[l].st;
    if (bits == 8 && !group) check_refusals(be, b, st);
    char err[256] = "", opt[32] = "", tag[40] = ""; /* "group=N" and " group=N" */
    if (group) snprintf(opt, sizeof opt, "group=%d", group);
    if (group) snprintf(tag, sizeof tag, " %s", opt);
    g_group = group;
    lmh_cache *c = NULL;
    lmh_cache_config cfg = {.size = sizeof cfg,
                            .format = bits == 8 ? "q8" : "q4",
                            .n_layers = nl,
                            .layers = st,
                            .options = group ? opt : NULL};
    if (g_cache->create(&g_host, be, b, &cfg, &c, err, sizeof err) != LMH_OK) {
        fprintf(stderr, "FAIL: %s%s: create: %s\n", name, tag, err);
        g_fail++;
        return;
    }
    const uint64_t id = 7;
    g_cache->seq_add(c, id);
    for (int l = 0; l < nl; l++) {
        int kvh = L[l].st.n_kv_heads;
        L[l].k = calloc((size_t)MAXPOS * kvh * L[l].st.head_dim_k, sizeof(float));
        L[l].v = calloc((size_t)MAXPOS * kvh * L[l].st.head_dim_v, sizeof(float));
        L[l].kq = calloc((size_t)MAXPOS * kvh * L[l].st.head_dim_k, sizeof(double));
        L[l].vq = calloc((size_t)MAXPOS * kvh * L[l].st.head_dim_v, sizeof(double));
    }
    double tol = 1e-5, worst = 0;
    /* rows a step; negative: a trim; APPEND_ONLY + n: n rows appended without attending */
    const int steps[] = {
        7, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 9, -10, 1, 4, 1, 70, 1, 1, APPEND_ONLY + 8300, 1, 1};
    for (size_t si = 0; si < sizeof steps / sizeof *steps; si++) {
        int n = steps[si], only_append = n >= APPEND_ONLY;
        if (only_append) n -= APPEND_ONLY;
        if (n < 0) { /* forget the last rows: the ring has wrapped, so only a full restart */
            int rc = g_cache->seq_trim(c, id, L[0].pos + n);
            g_checks++;
            if (rc != LMH_EUNSUPPORTED) {
                fprintf(stderr, "FAIL: %s: trim into a wrapped ring gave %d\n", name, rc);
                g_fail++;
            }
            if (g_cache->seq_trim(c, id, 0) != LMH_OK) g_fail++;
            for (int l = 0; l < nl; l++) L[l].pos = 0;
            continue;
        }
        for (int l = 0; l < nl; l++) {
            layer *y = &L[l];
            int kvh = y->st.n_kv_heads, d = y->st.head_dim_k, dv = y->st.head_dim_v;
            float *k = y->k + (size_t)y->pos * kvh * d, *v = y->v + (size_t)y->pos * kvh * dv;
            /* each head's values around its own offset, so that groups differ in range */
            for (int i = 0; i < n * kvh * d; i++) k[i] = frand(-1.5f, 1.5f) + (float)(i % 7) * 0.3f;
            for (int i = 0; i < n * kvh * dv; i++) v[i] = frand(-2.0f, 1.0f);
            for (int r = 0; r < n * kvh; r++) {
                round_trip(k + (size_t)r * d, y->kq + (size_t)y->pos * kvh * d + (size_t)r * d, d,
                           group_of(d), bits);
                round_trip(v + (size_t)r * dv, y->vq + (size_t)y->pos * kvh * dv + (size_t)r * dv,
                           dv, group_of(dv), bits);
            }
            int64_t kne[3] = {n, kvh, d}, vne[3] = {n, kvh, dv}, qne[3] = {n, y->heads, d},
                    one[1] = {n}, one_out[3] = {n, y->heads, dv};
            lmh_tensor *kt = upload(be, b, LMH_F32, 3, kne, k),
                       *vt = upload(be, b, LMH_F32, 3, vne, v);
            int rc = g_cache->append(c, id, l, kt, vt);
            y->pos += n;
            be->tensor_free(b, kt);
            be->tensor_free(b, vt);
            if (only_append) {
                g_checks++;
                if (rc != LMH_OK) {
                    fprintf(stderr, "FAIL: %s: appending %d rows: %d\n", name, n, rc);
                    g_fail++;
                }
                continue;
            }
            float *q = malloc((size_t)n * y->heads * d * sizeof(float));
            for (int i = 0; i < n * y->heads * d; i++) q[i] = frand(-1.0f, 1.0f);
            int32_t qp[80];
            for (int r = 0; r < n; r++) qp[r] = y->pos - n + r;
            lmh_tensor *qt = upload(be, b, LMH_F32, 3, qne, q),
                       *pt = upload(be, b, LMH_I32, 1, one, qp),
                       *ot = be->tensor_new(b, LMH_F32, 3, one_out, 0);
            int64_t nh = y->heads;
            lmh_tensor *skt = y->sinks ? upload(be, b, LMH_F32, 1, &nh, y->sinks) : NULL;
            lmh_attn_params ap = {.scale = (float)(1.0 / sqrt((double)d)),
                                  .softcap = y->softcap,
                                  .window = y->st.window,
                                  .sinks = skt};
            if (rc == LMH_OK) rc = g_cache->attend(c, id, l, qt, pt, ot, &ap);
            size_t no = (size_t)n * y->heads * dv;
            float *got = malloc(no * sizeof(float));
            double *want = malloc(no * sizeof(double));
            if (rc == LMH_OK) rc = be->download(b, ot, 0, got, no * sizeof(float));
            g_checks++;
            if (rc != LMH_OK) {
                fprintf(stderr, "FAIL: %s: step %zu layer %d: %d\n", name, si, l, rc);
                g_fail++;
            } else {
                attend_ref(y, q, n, want);
                double maxw = 0, maxd = 0;
                for (size_t i = 0; i < no; i++) {
                    if (fabs(want[i]) > maxw) maxw = fabs(want[i]);
                    double e = fabs(got[i] - want[i]);
                    if (!(e <= maxd)) maxd = isnan(e) ? INFINITY : e;
                }
                if (maxd / maxw > worst) worst = maxd / maxw;
                if (!(maxd <= tol * maxw)) {
                    fprintf(stderr, "FAIL: %s q%d%s: step %zu layer %d: max |d| %.3g of %.3g\n",
                            name, bits, tag, si, l, maxd, maxw);
                    g_fail++;
                }
            }
            /* the ring: window - 1 + n rows for a step of n, back to the window in decode */
            int32_t rows = g_cache->layer_rows(c, id, l);
            if (l == 1 && y->pos >= y->st.window) {
                int32_t most = n == 1 ? y->st.window : y->st.window - 1 + n;
                g_checks++;
                if (rows > most) {
                    fprintf(stderr, "FAIL: %s: the ring holds %d rows after a step of %d\n", name,
                            rows, n);
                    g_fail++;
                }
            }
            free(q);
            free(got);
            free(want);
            be->tensor_free(b, qt);
            be->tensor_free(b, pt);
            be->tensor_free(b, ot);
            if (skt) be->tensor_free(b, skt);
        }
    }
    /* bytes: rows allocated x heads x (codes + a scale and a bias a group) x 4 */
    uint64_t want_bytes = 0;
    for (int l = 0; l < nl; l++) {
        int d = L[l].st.head_dim_k, dv = L[l].st.head_dim_v;
        uint64_t words = (uint64_t)(d * bits / 32 + 2 * d / group_of(d)) +
                         (uint64_t)(dv * bits / 32 + 2 * dv / group_of(dv));
        /* full attention: 16 rows doubled to hold 8380 positions; the ring: 5 - 1 + 1 */
        uint64_t rows = l == 1 ? 5 : 16384;
        want_bytes += rows * (uint64_t)L[l].st.n_kv_heads * words * 4;
    }
    g_checks++;
    if (g_cache->bytes(c) != want_bytes || g_cache->seq_bytes(c, id) != want_bytes) {
        fprintf(stderr, "FAIL: %s q%d%s: bytes %llu (sequence %llu), the format's %llu\n", name,
                bits, tag, (unsigned long long)g_cache->bytes(c),
                (unsigned long long)g_cache->seq_bytes(c, id), (unsigned long long)want_bytes);
        g_fail++;
    }
    printf("%s q%d%s: worst output error %.2e of the largest value (tolerance %.0e)\n", name, bits,
           tag, worst, tol);
    g_cache->seq_remove(c, id);
    g_checks++;
    if (g_cache->bytes(c) != 0) {
        fprintf(stderr, "FAIL: %s: %llu bytes left after the sequence went\n", name,
                (unsigned long long)g_cache->bytes(c));
        g_fail++;
    }
    g_cache->destroy(c);
    for (int l = 0; l < nl; l++) {
        free(L[l].k);
        free(L[l].v);
        free(L[l].kq);
        free(L[l].vq);
    }
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: test_cache_quant CACHE_PLUGIN CPU_PLUGIN [VULKAN_PLUGIN]\n");
        return 2;
    }
    g_cache = load(argv[1])->api;
    for (int i = 2; i < argc; i++) {
        const lmh_backend_api *be = load(argv[i])->api;
        lmh_backend_opts o = {.size = sizeof o, .threads = 2};
        lmh_backend *b = NULL;
        char err[256] = "";
        if (be->create(&g_host, &o, &b, err, sizeof err) != LMH_OK) {
            printf("skip %s: %s\n", argv[i], err); /* no Vulkan device here */
            continue;
        }
        const char *name = i == 2 ? "cpu" : "vulkan";
        /* vk-kernel-shared below attend's needs: the Vulkan backend refuses it */
        char kv[32];
        const char *ks = i != 2 && lmh_debug_get("vk-kernel-shared", kv, sizeof kv) ? kv : NULL;
        int logs = g_copy_logs;
        for (int bits = 8; bits >= 4; bits -= 4) {
            run_backend(name, be, b, bits, 0);
            for (int group = 16; group <= 128; group *= 2)
                if (group != 64) run_backend(name, be, b, bits, group);
        }
        if (ks && atoi(ks) > 0 && atoi(ks) < 16384 + 1024)
            check(g_copy_logs > logs, "%s with vk-kernel-shared=%s: attend refused", name, ks);
        else /* the backend's reading of the kernel's needs lets it run where it fits */
            check(g_copy_logs == logs, "%s: attend's builds run", name);
        lmh_backend_api refusing = *be;
        g_inner_kernel_add = be->kernel_add;
        refusing.kernel_add = refuse_attend;
        logs = g_copy_logs;
        char label[64];
        snprintf(label, sizeof label, "%s, attend refused", name);
        run_backend(label, &refusing, b, 8, 0);
        run_backend(label, &refusing, b, 4, 0);
        check(g_copy_logs > logs, "%s: the refusal is logged", label);
        be->destroy(b);
    }
    printf("%d checks, %d failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
