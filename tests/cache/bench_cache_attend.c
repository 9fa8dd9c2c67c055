/* Decode attention of one layer through a cache plugin's table, timed: what a cache format
 * costs a decode step at a given context, without a model around it.
 *
 * usage: bench_cache_attend BACKEND_PLUGIN CACHE_PLUGIN FORMAT[,SETTINGS] KV_HEADS HEADS
 *                           HEAD_SIZE ROWS [STEPS]
 *
 * Appends ROWS random rows (in steps of up to 4096), then runs STEPS (default 200) decode
 * steps, each appending one row and attending with one query row, after 20 untimed ones,
 * and prints the mean milliseconds a step (from the first enqueue to the download of the
 * last output). BENCH_NO_APPEND=1: the steps only attend; BENCH_THREADS=N: the CPU
 * backend's threads. Exit 0 when every call
 * succeeded. Example, tq3 against f16 at 32K for 8 K/V heads of 128 and 32 queries:
 *   bench_cache_attend build/backends/vulkan/lmhost-backend-vulkan.so \
 *       build/plugins/cache-turboquant/lmhost-cache-turboquant.so tq3 8 32 128 32768
 *   bench_cache_attend build/backends/vulkan/lmhost-backend-vulkan.so \
 *       build/plugins/cache-plain/lmhost-cache-plain.so f16 8 32 128 32768 */
#include "lmhost/lmhost.h"

#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

static const lmh_plugin_info *load(const char *path) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
        exit(1);
    }
    const lmh_plugin_info *(*entry)(void) =
        (const lmh_plugin_info *(*)(void))(uintptr_t)dlsym(h, LMH_PLUGIN_ENTRY_NAME);
    const lmh_plugin_info *info = entry ? entry() : NULL;
    char err[256] = "";
    if (!info || (info->init && info->init(&g_host, err, sizeof err))) {
        fprintf(stderr, "%s: no usable entry %s\n", path, err);
        exit(1);
    }
    return info;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die_if(int rc, const char *what) {
    if (rc == LMH_OK) return;
    fprintf(stderr, "%s: %d\n", what, rc);
    exit(1);
}

int main(int argc, char **argv) {
    if (argc < 8) {
        fprintf(stderr, "usage: bench_cache_attend BACKEND_PLUGIN CACHE_PLUGIN FORMAT[,SETTINGS] "
                        "KV_HEADS HEADS HEAD_SIZE ROWS [STEPS]\n");
        return 2;
    }
    const lmh_backend_api *be = load(argv[1])->api;
    const lmh_cache_api *ca = load(argv[2])->api;
    char format[64], *opts = NULL;
    snprintf(format, sizeof format, "%s", argv[3]);
    if ((opts = strchr(format, ','))) *opts++ = 0;
    int kvh = atoi(argv[4]), heads = atoi(argv[5]), hd = atoi(argv[6]), rows = atoi(argv[7]);
    int steps = argc > 8 ? atoi(argv[8]) : 200, warm = 20;
    /* BENCH_THREADS: CPU threads (default: the backend's, every core) */
    const char *th = getenv("BENCH_THREADS");
    lmh_backend_opts o = {.size = sizeof o, .threads = th ? atoi(th) : 0};
    lmh_backend *b = NULL;
    char err[256] = "";
    if (be->create(&g_host, &o, &b, err, sizeof err) != LMH_OK) {
        fprintf(stderr, "backend: %s\n", err);
        return 1;
    }
    lmh_layer_state st = {LMH_STATE_KV, kvh, hd, hd, 0};
    lmh_cache_config cfg = {sizeof cfg, format, 1, &st, 0, NULL, opts, 0};
    lmh_cache *c = NULL;
    if (ca->create(&g_host, be, b, &cfg, &c, err, sizeof err) != LMH_OK) {
        fprintf(stderr, "cache: %s\n", err);
        return 1;
    }
    die_if(ca->seq_add(c, 1), "seq_add");
    int chunk = 4096;
    size_t row = (size_t)kvh * hd;
    float *buf = malloc((size_t)chunk * row * sizeof(float));
    uint64_t r = 0x2545f4914f6cdd1dull;
    for (size_t i = 0; i < (size_t)chunk * row; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        buf[i] = (float)((r >> 11) * (2.0 / 9007199254740992.0)) - 1.0f;
    }
    for (int done = 0; done < rows;) {
        int n = rows - done < chunk ? rows - done : chunk;
        int64_t ne[3] = {n, kvh, hd};
        lmh_tensor *k = be->tensor_new(b, LMH_F32, 3, ne, 0),
                   *v = be->tensor_new(b, LMH_F32, 3, ne, 0);
        die_if(!k || !v ? LMH_ENOMEM : LMH_OK, "tensor_new");
        die_if(be->upload(b, k, 0, buf, (size_t)n * row * 4), "upload");
        die_if(be->upload(b, v, 0, buf, (size_t)n * row * 4), "upload");
        die_if(ca->append(c, 1, 0, k, v), "append");
        be->tensor_free(b, k);
        be->tensor_free(b, v);
        done += n;
    }
    int64_t one[3] = {1, kvh, hd}, qne[3] = {1, heads, hd}, pne[1] = {1};
    lmh_tensor *k1 = be->tensor_new(b, LMH_F32, 3, one, 0),
               *v1 = be->tensor_new(b, LMH_F32, 3, one, 0);
    lmh_tensor *q = be->tensor_new(b, LMH_F32, 3, qne, 0),
               *out = be->tensor_new(b, LMH_F32, 3, qne, 0);
    lmh_tensor *qp = be->tensor_new(b, LMH_I32, 1, pne, 0);
    die_if(be->upload(b, k1, 0, buf, row * 4), "upload");
    die_if(be->upload(b, v1, 0, buf + row, row * 4), "upload");
    die_if(be->upload(b, q, 0, buf, (size_t)heads * hd * 4), "upload");
    lmh_attn_params ap = {.scale = (float)(1.0 / sqrt((double)hd))};
    float res[4];
    double t0 = 0;
    for (int s = 0; s < warm + steps; s++) {
        if (s == warm) {
            die_if(be->download(b, out, 0, res, sizeof res), "download");
            t0 = now_s();
        }
        int32_t p = rows + s;
        die_if(be->upload(b, qp, 0, &p, 4), "upload");
        if (!getenv("BENCH_NO_APPEND")) die_if(ca->append(c, 1, 0, k1, v1), "append");
        die_if(ca->attend(c, 1, 0, q, qp, out, &ap), "attend");
    }
    die_if(be->download(b, out, 0, res, sizeof res), "download");
    double ms = (now_s() - t0) * 1e3 / steps;
    printf("%s %s kvh %d heads %d hd %d rows %d: %.4f ms a step (%s)\n", argv[3], be->describe(b),
           kvh, heads, hd, rows, ms, isfinite(res[0]) ? "finite" : "NOT FINITE");
    ca->seq_remove(c, 1);
    ca->destroy(c);
    be->destroy(b);
    free(buf);
    return 0;
}
