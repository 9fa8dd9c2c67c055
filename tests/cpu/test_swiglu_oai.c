/* The CPU backend's LMH_OP_SWIGLU_OAI (ABI 1.10), gpt-oss's clamped SwiGLU of interleaved
 * (gate, up) columns, against a double-precision model on every SIMD path this CPU runs:
 * values inside and well past the limit, several shapes, in place of nothing (dst apart);
 * and the operands it refuses (odd shapes, a limit that is not positive).
 * usage: test_cpu_swiglu_oai CPU_PLUGIN */
#include "lmhost/lmhost.h"
#include "../test_debug.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const lmh_backend_api *g_api;
static int g_fail, g_checks;

static const lmh_host_api g_host = {.size = sizeof(lmh_host_api), .abi_minor = LMH_ABI_MINOR};

static uint64_t g_rng = 0x243f6a8885a308d3ull;
static float frand(float lo, float hi) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return lo + (hi - lo) * (float)((double)(g_rng >> 11) / 9007199254740992.0);
}

static double model(double g, double u, double alpha, double lim) {
    g = g < lim ? g : lim;
    u = u < -lim ? -lim : u > lim ? lim : u;
    return (u + 1.0) * g / (1.0 + exp(-alpha * g));
}

static lmh_tensor *tensor(lmh_backend *b, int64_t rows, int64_t cols) {
    int64_t ne[2] = {rows, cols};
    lmh_tensor *t = g_api->tensor_new(b, LMH_F32, 2, ne, 0);
    if (!t) {
        fprintf(stderr, "tensor_new failed\n");
        exit(1);
    }
    return t;
}

static void one(lmh_backend *b, const char *path, int64_t rows, int64_t d, float alpha, float lim,
                float span) {
    float *x = malloc((size_t)(rows * 2 * d) * sizeof *x), *y = malloc((size_t)(rows * d) * 4);
    for (int64_t i = 0; i < rows * 2 * d; i++) x[i] = frand(-span, span);
    lmh_tensor *X = tensor(b, rows, 2 * d), *Y = tensor(b, rows, d);
    lmh_op op = {.code = LMH_OP_SWIGLU_OAI, .dst = Y, .src = {X}};
    op.p.f[0] = alpha;
    op.p.f[1] = lim;
    int rc = g_api->upload(b, X, 0, x, (size_t)(rows * 2 * d) * 4);
    if (rc == LMH_OK) rc = g_api->enqueue(b, &op);
    if (rc == LMH_OK) rc = g_api->sync(b);
    if (rc == LMH_OK) rc = g_api->download(b, Y, 0, y, (size_t)(rows * d) * 4);
    g_checks++;
    double worst = 0;
    for (int64_t r = 0; r < rows && rc == LMH_OK; r++)
        for (int64_t j = 0; j < d; j++) {
            double want = model(x[r * 2 * d + 2 * j], x[r * 2 * d + 2 * j + 1], alpha, lim);
            double e = fabs(want - y[r * d + j]) / (fabs(want) > 1 ? fabs(want) : 1);
            if (!(e <= worst)) worst = e;
        }
    if (rc != LMH_OK || !(worst < 1e-6)) {
        fprintf(stderr, "FAIL [%s] %lld x %lld, limit %g: rc %d, %.3g off the model\n", path,
                (long long)rows, (long long)d, (double)lim, rc, worst);
        g_fail++;
    }
    g_api->tensor_free(b, X);
    g_api->tensor_free(b, Y);
    free(x);
    free(y);
}

/* An operand set the backend must refuse (supports() and enqueue() alike). */
static void refused(lmh_backend *b, const char *what, int64_t rows, int64_t in, int64_t out,
                    float lim) {
    lmh_tensor *X = tensor(b, rows, in), *Y = tensor(b, rows, out);
    lmh_op op = {.code = LMH_OP_SWIGLU_OAI, .dst = Y, .src = {X}};
    op.p.f[0] = 1.702f;
    op.p.f[1] = lim;
    g_checks++;
    if (g_api->supports(b, &op) || g_api->enqueue(b, &op) == LMH_OK) {
        fprintf(stderr, "FAIL: %s accepted\n", what);
        g_fail++;
    }
    g_api->tensor_free(b, X);
    g_api->tensor_free(b, Y);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: test_cpu_swiglu_oai CPU_PLUGIN\n");
        return 2;
    }
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    lmh_plugin_entry_fn entry =
        h ? (lmh_plugin_entry_fn)(uintptr_t)dlsym(h, LMH_PLUGIN_ENTRY_NAME) : NULL;
    const lmh_plugin_info *info = entry ? entry() : NULL;
    if (!info || info->kind != LMH_KIND_BACKEND || info->abi_major != LMH_ABI_MAJOR) {
        fprintf(stderr, "%s: not a backend plugin of this ABI\n", argv[1]);
        return 1;
    }
    char err[256] = "";
    if (info->init && info->init(&g_host, err, sizeof err)) {
        fprintf(stderr, "init: %s\n", err);
        return 1;
    }
    g_api = info->api;
    static const char *paths[] = {"portable", "avx2", "avx512", "neon"};
    int tested = 0;
    for (size_t pi = 0; pi < sizeof paths / sizeof *paths; pi++) {
        test_debug_set("simd", paths[pi]);
        lmh_backend_opts o = {.size = sizeof o, .threads = 2};
        lmh_backend *b = NULL;
        if (g_api->create(&g_host, &o, &b, err, sizeof err)) {
            printf("skip %s: not on this CPU or build\n", paths[pi]);
            continue;
        }
        tested++;
        one(b, paths[pi], 1, 1, 1.702f, 7.0f, 12.0f);
        one(b, paths[pi], 7, 33, 1.702f, 7.0f, 20.0f);
        one(b, paths[pi], 300, 128, 1.702f, 7.0f, 9.0f);
        one(b, paths[pi], 5, 64, 0.5f, 0.25f, 3.0f);
        refused(b, "an odd input width", 3, 9, 4, 7.0f);
        refused(b, "an output not half the input", 3, 8, 3, 7.0f);
        refused(b, "a limit of 0", 3, 8, 4, 0.0f);
        refused(b, "a negative limit", 3, 8, 4, -1.0f);
        g_api->destroy(b);
    }
    printf("%d paths, %d checks, %d failed\n", tested, g_checks, g_fail);
    return g_fail || !tested ? 1 : 0;
}
