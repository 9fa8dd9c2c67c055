/* Timings, not a test: y = x W^T for a 4-bit group-64 W [14336, 4096] (bf16 scales and
 * biases) and one row of x, the decode shape of an 8B model's MLP, on every SIMD path,
 * exact (avx512, avx2, portable...) then fast mode (avx512-i8, avx2-i8, portable-i8...); then
 * the same shape as microscaled 4-bit weights (MXFP4, group 32, e8m0 scales), exact, and fast
 * where an int8 path has a microscaled row function of its own.
 * usage: bench_qkernels [threads] [bits] [rows] [in] [path] */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "kernels.h"
#include "qkernels.h"
#include "threadpool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct arg {
    const cpu_kernels *k;
    const cpu_qkernels *qk;
    const cpu_qmat *w;
    const float *x;
    float *buf; /* CPU_Q_ROWS rows per worker */
    float *y;
} arg;

typedef struct arg8 {
    const cpu_q8kernel *k;
    const cpu_qmat *w;
    const float *x;
    void *mem;
    cpu_q8act a;
    float *y;
} arg8;

static void run8(void *p, int64_t o0, int64_t o1, int w) {
    (void)w;
    const arg8 *a = p;
    cpu_q8_matmul(a->k, &a->a, a->w, o0, o1, a->y, a->w->rows, NULL);
}

/* One fast-mode op: the activations quantized once, then the rows split over the pool. */
static void op8(cpu_pool *pool, int64_t grain, arg8 *a) {
    cpu_q8_quantize(a->x, 1, a->w->in, a->w->group, a->mem, &a->a);
    cpu_pool_run(pool, a->w->rows, grain, run8, a);
}

static void run(void *p, int64_t o0, int64_t o1, int w) {
    const arg *a = p;
    cpu_q_matmul(a->k, a->qk, a->x, 1, a->w, o0, o1, a->y, a->w->rows,
                 a->buf + (int64_t)w * CPU_Q_ROWS * a->w->in);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2, bits = argc > 2 ? atoi(argv[2]) : 4;
    const int64_t out = argc > 3 ? atoll(argv[3]) : 14336, in = argc > 4 ? atoll(argv[4]) : 4096;
    const int64_t group = 64;
    cpu_qmat w = {.sb = 2,
                  .bits = bits,
                  .group = (int32_t)group,
                  .rows = out,
                  .in = in,
                  .wpr = in * bits / 32,
                  .gpr = in / group};
    size_t qb = (size_t)(out * w.wpr) * 4, sb = (size_t)(out * w.gpr) * 2;
    uint32_t *q = malloc(qb);
    uint16_t *sc = malloc(sb), *bi = malloc(sb);
    float *x = malloc((size_t)in * 4), *y = malloc((size_t)out * 4);
    if (!q || !sc || !bi || !x || !y) return 1;
    for (size_t i = 0; i < qb / 4; i++) q[i] = (uint32_t)(i * 2654435761u);
    for (size_t i = 0; i < sb / 2; i++) {
        sc[i] = cpu_f32_to_bf16(0.01f);
        bi[i] = cpu_f32_to_bf16(-0.05f);
    }
    for (int64_t i = 0; i < in; i++) x[i] = (float)(i % 7) * 0.1f;
    w.q = q;
    w.scales = sc;
    w.biases = bi;
    cpu_pool *pool = cpu_pool_new(threads);
    float *qbuf = malloc((size_t)(threads * CPU_Q_ROWS * in) * sizeof(float));
    if (!qbuf) return 1;
    double mb = (double)(qb + 2 * sb) / 1e6;
    for (const cpu_kernels *const *k = cpu_kernels_available(); *k; k++) {
        if (argc > 5 && strcmp(argv[5], (*k)->name) != 0) continue;
        arg a = {.k = *k, .qk = cpu_qkernels_for((*k)->name), .w = &w, .x = x, .y = y, .buf = qbuf};
        int64_t grain = (out / (threads * 4) + 15) & ~(int64_t)15;
        cpu_pool_run(pool, out, grain, run, &a); /* warm */
        double best = 1e9;
        for (int rep = 0; rep < 20; rep++) {
            double t0 = now();
            cpu_pool_run(pool, out, grain, run, &a);
            double t = now() - t0;
            if (t < best) best = t;
        }
        printf("%-8s %d-bit g64 [%lld x %lld] matvec, %d threads: %.3f ms, %.1f GB/s of %.1f MB\n",
               a.qk->name, bits, (long long)out, (long long)in, threads, best * 1e3,
               mb / 1e3 / best, mb);
    }
    /* fast mode (--precision fast): one line per int8 path, the activations' quantization
     * included in the time */
    void *mem = aligned_alloc(64, (cpu_q8_bytes(1, in, (int32_t)group) + 63) & ~(size_t)63);
    if (!mem) return 1;
    for (const cpu_q8kernel *const *k = cpu_q8kernels_available(); *k; k++) {
        if (argc > 5 && strncmp(argv[5], (*k)->name, strlen(argv[5])) != 0) continue;
        arg8 a = {.k = *k, .w = &w, .x = x, .y = y, .mem = mem};
        int64_t grain = (out / (threads * 4) + 15) & ~(int64_t)15;
        op8(pool, grain, &a); /* warm */
        double best = 1e9;
        for (int rep = 0; rep < 20; rep++) {
            double t0 = now();
            op8(pool, grain, &a);
            double t = now() - t0;
            if (t < best) best = t;
        }
        printf("%-8s %d-bit g64 [%lld x %lld] matvec, %d threads: %.3f ms, %.1f GB/s of %.1f MB\n",
               (*k)->name, bits, (long long)out, (long long)in, threads, best * 1e3,
               mb / 1e3 / best, mb);
    }
    free(mem);
    /* microscaled 4-bit (MXFP4) of the same shape: exact paths, then the fast ones */
    cpu_qmat wm = {.sb = CPU_Q_MX,
                   .bits = 4,
                   .group = 32,
                   .rows = out,
                   .in = in,
                   .wpr = in / 8,
                   .gpr = in / 32};
    uint8_t *ms = malloc((size_t)(out * wm.gpr));
    mem = aligned_alloc(64, (cpu_q8_bytes(1, in, 32) + 63) & ~(size_t)63);
    if (!ms || !mem) return 1;
    for (int64_t i = 0; i < out * wm.gpr; i++) ms[i] = (uint8_t)(120 + i % 2);
    wm.q = q; /* (the codes' bytes: any nibble is a value) */
    wm.scales = ms;
    double mbm = (double)(out * in / 2 + out * wm.gpr) / 1e6;
    int64_t grain = (out / (threads * 4) + 15) & ~(int64_t)15;
    for (const cpu_kernels *const *k = cpu_kernels_available(); *k; k++) {
        if (argc > 5 && strcmp(argv[5], (*k)->name) != 0) continue;
        arg a = {
            .k = *k, .qk = cpu_qkernels_for((*k)->name), .w = &wm, .x = x, .y = y, .buf = qbuf};
        cpu_pool_run(pool, out, grain, run, &a); /* warm */
        double best = 1e9;
        for (int rep = 0; rep < 20; rep++) {
            double t0 = now();
            cpu_pool_run(pool, out, grain, run, &a);
            double t = now() - t0;
            if (t < best) best = t;
        }
        printf("%-8s mxfp4 [%lld x %lld] matvec, %d threads: %.3f ms, %.1f GB/s of %.1f MB\n",
               a.qk->name, (long long)out, (long long)in, threads, best * 1e3, mbm / 1e3 / best,
               mbm);
    }
    for (const cpu_q8kernel *const *k = cpu_q8kernels_available(); *k; k++) {
        if (argc > 5 && strncmp(argv[5], (*k)->name, strlen(argv[5])) != 0) continue;
        if (!(*k)->rows_mx) continue; /* (the backend runs the exact kernels then) */
        arg8 a = {.k = *k, .w = &wm, .x = x, .y = y, .mem = mem};
        op8(pool, grain, &a); /* warm */
        double best = 1e9;
        for (int rep = 0; rep < 20; rep++) {
            double t0 = now();
            op8(pool, grain, &a);
            double t = now() - t0;
            if (t < best) best = t;
        }
        printf("%-8s mxfp4 [%lld x %lld] matvec, %d threads: %.3f ms, %.1f GB/s of %.1f MB\n",
               (*k)->name, (long long)out, (long long)in, threads, best * 1e3, mbm / 1e3 / best,
               mbm);
    }
    free(mem);
    free(ms);
    cpu_pool_free(pool);
    free(qbuf);
    free(q);
    free(sc);
    free(bi);
    free(x);
    free(y);
    return 0;
}
