/* Thread pool: every item is done exactly once, chunks are whole multiples of the grain,
 * worker ids are in range, results are visible to the caller when cpu_pool_run returns,
 * for 1..8 threads, many sizes and grains, back-to-back runs (workers spinning) and runs
 * after a pause (workers asleep), and pools freed at once. Items are written with plain
 * stores, so a chunk handed out twice is also a data race for ThreadSanitizer. */
#include "threadpool.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int failures;

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        if (failures < 40) {                                                                       \
            printf("FAIL: ");                                                                      \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
        }                                                                                          \
        failures++;                                                                                \
    } while (0)

typedef struct job {
    int64_t n, grain;
    int threads;
    unsigned char *hits; /* plain, one writer per item */
    atomic_int bad_range, bad_worker, bad_chunk;
    atomic_int used[8];
    int slow;
} job;

static void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

static void fn(void *arg, int64_t i0, int64_t i1, int worker) {
    job *j = arg;
    if (i0 < 0 || i1 > j->n || i0 >= i1) {
        atomic_fetch_add(&j->bad_range, 1);
        return;
    }
    if (worker < 0 || worker >= j->threads)
        atomic_fetch_add(&j->bad_worker, 1);
    else
        atomic_fetch_add_explicit(&j->used[worker], 1, memory_order_relaxed);
    /* Chunks start on a multiple of the grain and are at least a grain long, except the
     * last one. */
    const int64_t g = j->grain < 1 ? 1 : j->grain;
    if (i0 % g != 0 || (i1 - i0 < g && i1 != j->n)) atomic_fetch_add(&j->bad_chunk, 1);
    for (int64_t i = i0; i < i1; i++) j->hits[i]++;
    if (j->slow) sleep_us(j->slow);
}

static void run_one(cpu_pool *p, int64_t n, int64_t grain, int slow) {
    job j;
    memset(&j, 0, sizeof j);
    j.n = n;
    j.grain = grain;
    j.threads = cpu_pool_threads(p);
    j.slow = slow;
    j.hits = calloc((size_t)(n > 0 ? n : 1), 1);
    atomic_init(&j.bad_range, 0);
    atomic_init(&j.bad_worker, 0);
    atomic_init(&j.bad_chunk, 0);
    for (int i = 0; i < 8; i++) atomic_init(&j.used[i], 0);
    cpu_pool_run(p, n, grain, fn, &j);
    int64_t wrong = 0, first = -1;
    for (int64_t i = 0; i < n; i++)
        if (j.hits[i] != 1) {
            if (first < 0) first = i;
            wrong++;
        }
    if (wrong)
        FAIL(
            "threads=%d n=%lld grain=%lld: %lld items not done exactly once (first %lld: %d times)",
            j.threads, (long long)n, (long long)grain, (long long)wrong, (long long)first,
            j.hits[first]);
    if (atomic_load(&j.bad_range))
        FAIL("threads=%d n=%lld grain=%lld: bad range", j.threads, (long long)n, (long long)grain);
    if (atomic_load(&j.bad_worker))
        FAIL("threads=%d n=%lld grain=%lld: worker id out of range", j.threads, (long long)n,
             (long long)grain);
    if (atomic_load(&j.bad_chunk))
        FAIL("threads=%d n=%lld grain=%lld: chunk not a whole multiple of the grain", j.threads,
             (long long)n, (long long)grain);
    free(j.hits);
}

static int used_workers(cpu_pool *p) {
    job j;
    memset(&j, 0, sizeof j);
    j.n = 64;
    j.grain = 1;
    j.threads = cpu_pool_threads(p);
    j.slow = 2000;
    j.hits = calloc(64, 1);
    for (int i = 0; i < 8; i++) atomic_init(&j.used[i], 0);
    cpu_pool_run(p, 64, 1, fn, &j);
    int used = 0;
    for (int i = 0; i < 8; i++) used += atomic_load(&j.used[i]) > 0;
    free(j.hits);
    return used;
}

int main(void) {
    const int64_t sizes[] = {0, 1, 2, 3, 5, 7, 8, 9, 16, 31, 64, 100, 1000, 4097, 100003};
    const int64_t grains[] = {0, 1, 2, 3, 7, 16, 64, 1000, 5000};
    long runs = 0;

    cpu_pool *p0 = cpu_pool_new(0);
    if (!p0 || cpu_pool_threads(p0) < 1)
        FAIL("cpu_pool_new(0)");
    else
        printf("cpu_pool_new(0): %d threads\n", cpu_pool_threads(p0));
    cpu_pool_free(p0);

    for (int threads = 1; threads <= 8; threads++) {
        /* Freed at once, before any run. */
        cpu_pool_free(cpu_pool_new(threads));

        cpu_pool *p = cpu_pool_new(threads);
        if (!p || cpu_pool_threads(p) != threads) {
            FAIL("cpu_pool_new(%d)", threads);
            continue;
        }
        for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++)
            for (size_t gi = 0; gi < sizeof grains / sizeof *grains; gi++) {
                run_one(p, sizes[si], grains[gi], 0);
                runs++;
            }
        /* The grain as large as n, and around it. */
        for (int64_t n = 1; n < 40; n++) {
            run_one(p, n, n, 0);
            run_one(p, n, n + 1, 0);
            run_one(p, n, n - 1, 0);
            runs += 3;
        }
        /* Back to back: workers are still spinning from the last run. */
        for (int i = 0; i < 2000; i++) {
            run_one(p, 1 + i % 97, 1 + i % 5, 0);
            runs++;
        }
        /* After a pause long enough for the workers to go to sleep. */
        for (int i = 0; i < 5; i++) {
            sleep_us(3000);
            run_one(p, 1000, 10, 0);
            runs++;
        }
        /* Slow chunks: the caller waits on the workers (and sleeps). */
        run_one(p, 16, 1, 2000);
        runs++;
        /* With as many cores as threads, long chunks reach more than the caller. Not
         * guaranteed on a loaded machine, so only reported. */
        if (threads > 1)
            printf("threads=%d: %d workers took chunks of a slow job\n", threads, used_workers(p));
        cpu_pool_free(p);
    }

    /* A pool freed while its workers sleep. */
    cpu_pool *p = cpu_pool_new(4);
    run_one(p, 100, 1, 0);
    sleep_us(5000);
    cpu_pool_free(p);

    printf("%ld runs, %d failures\n", runs, failures);
    return failures ? 1 : 0;
}
