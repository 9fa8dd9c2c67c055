/* Timings, not a test: the CPU backend's attention op for one decode row (or a prefill
 * chunk of rows) over a long f16 cache, with the bytes of K and V it reads and the rate.
 * usage: bench_attention CPU_PLUGIN [keys] [threads] [rows] [heads] [kv_heads] [d] [reps] */
#include "lmhost/lmhost.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void host_log(int level, const char *fmt, ...) {
    if (level > LMH_LOG_WARN) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

static const lmh_host_api g_host = {
    .size = sizeof(lmh_host_api), .abi_minor = LMH_ABI_MINOR, .log = host_log};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct bw_arg {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
} bw_arg;

static void *bw_reader(void *arg) {
    bw_arg *a = arg;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 4 <= a->n; i += 4) {
        s0 += a->p[i];
        s1 += a->p[i + 1];
        s2 += a->p[i + 2];
        s3 += a->p[i + 3];
    }
    a->sum = s0 + s1 + s2 + s3;
    return NULL;
}

/* Bytes/s of `threads` threads each summing its part of a 1 GiB buffer, best of 5. */
static double read_bw(int threads) {
    const size_t bytes = (size_t)1 << 30;
    uint64_t *buf = malloc(bytes);
    if (!buf || threads < 1 || threads > 64) return 0;
    memset(buf, 1, bytes);
    const size_t per = bytes / sizeof(uint64_t) / (size_t)threads;
    double best = 0;
    for (int r = 0; r < 5; r++) {
        pthread_t th[64];
        bw_arg args[64];
        double t0 = now();
        for (int t = 0; t < threads; t++) {
            args[t] = (bw_arg){.p = buf + per * (size_t)t, .n = per};
            pthread_create(&th[t], NULL, bw_reader, &args[t]);
        }
        for (int t = 0; t < threads; t++) pthread_join(th[t], NULL);
        double v = (double)(per * (size_t)threads * sizeof(uint64_t)) / (now() - t0);
        if (v > best) best = v;
    }
    free(buf);
    return best;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_attention CPU_PLUGIN [keys] [threads] [rows] [heads] "
                        "[kv_heads] [d] [reps]\n");
        return 2;
    }
    const int64_t keys = argc > 2 ? atoll(argv[2]) : 16384;
    const int threads = argc > 3 ? atoi(argv[3]) : 2;
    const int64_t rows = argc > 4 ? atoll(argv[4]) : 1;
    const int64_t heads = argc > 5 ? atoll(argv[5]) : 16, kvh = argc > 6 ? atoll(argv[6]) : 8;
    const int64_t d = argc > 7 ? atoll(argv[7]) : 128;
    const int reps = argc > 8 ? atoi(argv[8]) : 20;
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "cannot load %s: %s\n", argv[1], dlerror());
        return 1;
    }
    lmh_plugin_entry_fn entry = (lmh_plugin_entry_fn)(uintptr_t)dlsym(h, LMH_PLUGIN_ENTRY_NAME);
    const lmh_plugin_info *info = entry ? entry() : NULL;
    char err[256] = "";
    if (!info || (info->init && info->init(&g_host, err, sizeof err))) {
        fprintf(stderr, "%s: not a usable backend plugin %s\n", argv[1], err);
        return 1;
    }
    const lmh_backend_api *api = info->api;
    lmh_backend *b;
    lmh_backend_opts o = {.size = sizeof o, .threads = threads};
    if (api->create(&g_host, &o, &b, err, sizeof err)) {
        fprintf(stderr, "create: %s\n", err);
        return 1;
    }
    int64_t kne[3] = {keys, kvh, d}, qne[3] = {rows, heads, d}, pne[1] = {rows};
    size_t kv_bytes = (size_t)(keys * kvh * d) * 2;
    uint16_t *kv = malloc(kv_bytes);
    float *q = malloc((size_t)(rows * heads * d) * sizeof(float));
    int32_t *pos = malloc((size_t)rows * sizeof(int32_t));
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < kv_bytes / 2; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        kv[i] = (uint16_t)(0x3000 + (x & 0x7ff)) | (uint16_t)(x & 0x8000); /* |v| in [0.125, 0.5) */
    }
    for (int64_t i = 0; i < rows * heads * d; i++) q[i] = (float)((i * 37) % 17) / 17.0f - 0.5f;
    for (int64_t r = 0; r < rows; r++) pos[r] = (int32_t)(keys - rows + r);
    lmh_tensor *K = api->tensor_new(b, LMH_F16, 3, kne, 0),
               *V = api->tensor_new(b, LMH_F16, 3, kne, 0);
    lmh_tensor *Q = api->tensor_new(b, LMH_F32, 3, qne, 0),
               *P = api->tensor_new(b, LMH_I32, 1, pne, 0);
    lmh_tensor *Y = api->tensor_new(b, LMH_F32, 3, qne, 0);
    api->upload(b, K, 0, kv, kv_bytes);
    api->upload(b, V, 0, kv, kv_bytes);
    api->upload(b, Q, 0, q, (size_t)(rows * heads * d) * sizeof(float));
    api->upload(b, P, 0, pos, (size_t)rows * sizeof(int32_t));
    lmh_op op = {.code = LMH_OP_ATTENTION, .dst = Y, .src = {Q, K, V, P}};
    op.p.i[0] = (int32_t)keys;
    op.p.f[0] = 0.088f;
    double best = 1e9, sum = 0;
    for (int i = 0; i < reps + 2; i++) {
        double t0 = now();
        api->enqueue(b, &op);
        api->sync(b);
        double t = now() - t0;
        if (i < 2) continue; /* warm-up */
        sum += t;
        if (t < best) best = t;
    }
    const double bytes = 2.0 * (double)kv_bytes;
    /* the machine's read bandwidth right after, the threads summing a 1 GiB buffer (as
     * lmhost bench measures it), for the bound */
    const double bw = read_bw(threads);
    if (bw > 0)
        printf("read bandwidth %.2f GB/s (%d threads, 1 GiB): K+V bound %.3f ms, best at %.0f%% "
               "of it, mean at %.0f%%\n",
               bw / 1e9, threads, bytes / bw * 1e3, 100.0 * bytes / bw / best,
               100.0 * bytes / bw / (sum / reps));
    printf("%s: %lld keys, %lld rows, %lld/%lld heads, d %lld, %d threads: %.3f ms best, %.3f ms "
           "mean; K+V %.1f MiB, %.2f GB/s (best)\n",
           api->describe(b), (long long)keys, (long long)rows, (long long)heads, (long long)kvh,
           (long long)d, threads, best * 1e3, sum / reps * 1e3, bytes / 1048576.0,
           bytes / best / 1e9);
    api->destroy(b);
    return 0;
}
