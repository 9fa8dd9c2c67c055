/* A fixed pool of worker threads for data-parallel loops. */
#ifndef LMHOST_CPU_THREADPOOL_H
#define LMHOST_CPU_THREADPOOL_H

#include <stdint.h>

typedef struct cpu_pool cpu_pool;

/* fn(arg, i0, i1, worker) processes items [i0, i1); worker is 0..threads-1. */
typedef void (*cpu_pool_fn)(void *arg, int64_t i0, int64_t i1, int worker);

/* threads <= 0: one per online core. NULL on failure. */
cpu_pool *cpu_pool_new(int threads);
void cpu_pool_free(cpu_pool *p);
int cpu_pool_threads(const cpu_pool *p);
/* Runs fn over [0, n) split into chunks of at least `grain` items, on all workers
 * including the calling thread; returns when every item is done. Not reentrant: one
 * parallel_for at a time per pool. */
void cpu_pool_run(cpu_pool *p, int64_t n, int64_t grain, cpu_pool_fn fn, void *arg);

#endif
