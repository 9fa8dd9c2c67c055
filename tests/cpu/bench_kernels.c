/* Timings of the CPU kernels (not a test): matrix-vector product 4096 -> 14336 (a
 * Llama-8B FFN up projection, decode) per weight type, on one thread and on the pool,
 * and a 64-row matmul (prefill) in GFLOP/s; also the pool's dispatch cost.
 *
 * usage: bench_kernels [path|all] [threads]   (path: portable, avx2, avx512, neon)
 * LMHOST_BENCH_THP=1 puts the weights on transparent huge pages. */
#include "kernels.h"
#include "threadpool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define IN      4096
#define OUT     14336
#define PREFILL 64

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct job {
    const cpu_kernels *k;
    int dt;
    const float *x;
    int64_t n;
    const void *w;
    float *y;
} job;

static void run_rows(void *arg, int64_t o0, int64_t o1, int worker) {
    (void)worker;
    const job *j = arg;
    if (j->dt == 0)
        j->k->matmul_f32(j->x, j->n, IN, j->w, o0, o1, j->y, OUT);
    else if (j->dt == 1)
        j->k->matmul_f16(j->x, j->n, IN, j->w, o0, o1, j->y, OUT);
    else
        j->k->matmul_bf16(j->x, j->n, IN, j->w, o0, o1, j->y, OUT);
}

/* Median seconds of `reps` runs after one warm-up (the fastest in *best). pool NULL: the
 * calling thread. */
static double time_matmul(cpu_pool *pool, job *j, int reps, double *best) {
    double t[64];
    if (reps > 64) reps = 64;
    /* The backend's split: a quarter of an equal share per chunk, a multiple of 16. */
    int64_t th = pool ? cpu_pool_threads(pool) : 1, g = OUT / (th * 4);
    g = (g + 15) & ~(int64_t)15;
    for (int i = -1; i < reps; i++) {
        double t0 = now();
        if (pool)
            cpu_pool_run(pool, OUT, g, run_rows, j);
        else
            run_rows(j, 0, OUT, 0);
        if (i >= 0) t[i] = now() - t0;
    }
    qsort(t, (size_t)reps, sizeof *t, cmp_double);
    *best = t[0];
    return t[reps / 2];
}

static void nop(void *arg, int64_t i0, int64_t i1, int worker) {
    (void)i0;
    (void)i1;
    (void)worker;
    /* Touch something so the call is not optimized away. */
    __atomic_fetch_add((int *)arg, 1, __ATOMIC_RELAXED);
}

/* LMHOST_BENCH_THP=1: weights on transparent huge pages (fewer TLB misses while
 * streaming; worth a few percent on some machines). */
static void *alloc_weights(size_t bytes) {
    const size_t huge = (size_t)2 << 20;
    void *p = aligned_alloc(huge, (bytes + huge - 1) / huge * huge);
    const char *e = getenv("LMHOST_BENCH_THP");
    if (p && e && *e == '1') madvise(p, bytes, MADV_HUGEPAGE);
    return p;
}

int main(int argc, char **argv) {
    const char *only = argc > 1 && strcmp(argv[1], "all") != 0 ? argv[1] : NULL;
    int threads = argc > 2 ? atoi(argv[2]) : 2;

    float *x = malloc(sizeof(float) * IN * PREFILL), *y = malloc(sizeof(float) * OUT * PREFILL);
    float *wf = alloc_weights(sizeof(float) * IN * (size_t)OUT);
    uint16_t *wh = alloc_weights(2 * IN * (size_t)OUT), *wb = alloc_weights(2 * IN * (size_t)OUT);
    if (!x || !y || !wf || !wh || !wb) return 1;
    uint32_t s = 1;
    for (size_t i = 0; i < (size_t)IN * PREFILL; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = (float)(s >> 8) * 0x1p-24f - 0.5f;
    }
    for (size_t i = 0; i < (size_t)IN * OUT; i++) {
        s = s * 1664525u + 1013904223u;
        wf[i] = ((float)(s >> 8) * 0x1p-24f - 0.5f) * 0.1f;
    }
    const cpu_kernels *pk = cpu_kernels_select("portable");
    pk->f32_to_f16(wf, wh, (int64_t)IN * OUT);
    pk->f32_to_bf16(wf, wb, (int64_t)IN * OUT);
    const void *ws[3] = {wf, wh, wb};
    const char *dn[3] = {"f32", "f16", "bf16"};
    const double bytes[3] = {4.0 * IN * OUT, 2.0 * IN * OUT, 2.0 * IN * OUT};

    cpu_pool *pool = cpu_pool_new(threads);
    if (!pool) return 1;
    printf("matvec %dx%d (in x out), prefill %d rows; pool %d threads\n", IN, OUT, PREFILL,
           cpu_pool_threads(pool));

    {
        int counter = 0;
        const int reps = 20000, chunks = 2 * cpu_pool_threads(pool);
        double t0 = now();
        for (int i = 0; i < reps; i++) cpu_pool_run(pool, chunks, 1, nop, &counter);
        printf("pool dispatch (%d chunks, empty work): %.2f us per run\n", chunks,
               (now() - t0) / reps * 1e6);
    }

    for (const cpu_kernels *const *t = cpu_kernels_available(); *t; t++) {
        const cpu_kernels *k = *t;
        if (only && strcmp(only, k->name) != 0) continue;
        int slow = strcmp(k->name, "portable") == 0;
        for (int dt = 0; dt < 3; dt++) {
            job j = {k, dt, x, 1, ws[dt], y};
            double b1, bp;
            double t1 = time_matmul(NULL, &j, slow ? 3 : 21, &b1);
            double tp = time_matmul(pool, &j, slow ? 3 : 21, &bp);
            printf("%-8s matvec  %-4s 1 thread %6.2f ms (best %6.2f, %4.1f GB/s)   %d threads "
                   "%6.2f ms (best %6.2f, %4.1f GB/s)\n",
                   k->name, dn[dt], t1 * 1e3, b1 * 1e3, bytes[dt] / b1 * 1e-9,
                   cpu_pool_threads(pool), tp * 1e3, bp * 1e3, bytes[dt] / bp * 1e-9);
        }
        for (int dt = 0; dt < 3; dt++) {
            job j = {k, dt, x, PREFILL, ws[dt], y};
            const double flop = 2.0 * PREFILL * IN * OUT;
            double b1, bp;
            double t1 = time_matmul(NULL, &j, slow ? 1 : 5, &b1);
            double tp = time_matmul(pool, &j, slow ? 1 : 5, &bp);
            printf("%-8s prefill %-4s 1 thread %6.1f GFLOP/s (best %6.1f)       %d threads "
                   "%6.1f GFLOP/s (best %6.1f)\n",
                   k->name, dn[dt], flop / t1 * 1e-9, flop / b1 * 1e-9, cpu_pool_threads(pool),
                   flop / tp * 1e-9, flop / bp * 1e-9);
        }
    }
    cpu_pool_free(pool);
    free(x);
    free(y);
    free(wf);
    free(wh);
    free(wb);
    return 0;
}
