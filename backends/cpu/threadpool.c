/* Thread pool: persistent workers woken through a generation counter.
 *
 * A run publishes the job, opens generation g (`open` = g), bumps `gen` and works on
 * chunks itself; chunks are handed out through one atomic counter. Workers spin on `gen`
 * for a short while after each job (a forward pass dispatches hundreds of small jobs per
 * token, and a spinning worker picks one up in well under a microsecond), then sleep on a
 * futex (a condition variable off Linux).
 *
 * A worker joins a run by incrementing `active` and then checking that the run it was
 * woken for is still open; when the caller has handed out every chunk it closes the run
 * (`open` = 0) and waits only until `active` is 0. So a worker that was not scheduled in
 * time (more threads than free cores) does not hold the caller up: it finds the run
 * closed and goes back to waiting without touching the job. Both sides use seq_cst for
 * the increment/check and close/check pairs, so one always sees the other, and the job
 * fields are never rewritten while a joined worker may read them.
 *
 * All hand-offs of data go through C11 atomics with acquire/release; the futex only puts
 * threads to sleep, so ThreadSanitizer sees every happens-before edge it needs. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_getaffinity, syscall */
#endif
#include "threadpool.h"

#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#if defined(__linux__) && !defined(LMHOST_POOL_NO_FUTEX)
#define POOL_FUTEX 1
#include <linux/futex.h>
#include <sys/syscall.h>
#else
#define POOL_FUTEX 0
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield" ::: "memory")
#else
#define cpu_relax() ((void)0)
#endif

/* How long a thread spins before it sleeps: long enough to bridge the gap between
 * consecutive ops of a forward pass, short enough not to burn a core between tokens. */
#define SPIN_NS 200000
/* Cap on chunks per run (per thread), so grain 1 over a large range does not turn into
 * one atomic operation per item. */
#define MAX_CHUNKS_PER_THREAD 64

#define CACHE_LINE 64

struct cpu_pool {
    int threads;
    pthread_t *tids;

    /* Job of the open generation: written by the caller before it opens the run, read
     * by workers that joined it. */
    cpu_pool_fn fn;
    void *arg;
    int64_t n, chunk;

    /* Each hot word on its own line, so spinning readers do not slow the writers. */
    _Alignas(CACHE_LINE) atomic_uint gen; /* futex word the workers wait on; never 0 after a run */
    atomic_uint open;                     /* generation workers may join, 0: none */
    atomic_int sleepers;                  /* workers (about to be) asleep on gen */
    atomic_bool stop;
    _Alignas(CACHE_LINE) atomic_llong next;  /* next item to hand out */
    _Alignas(CACHE_LINE) atomic_uint active; /* workers inside a run; futex word of the caller */
    atomic_bool caller_sleeping;
    char pad_[CACHE_LINE];

#if !POOL_FUTEX
    pthread_mutex_t mu;
    pthread_cond_t cv_gen, cv_done;
#endif
};

typedef struct worker_start {
    cpu_pool *p;
    int id;
} worker_start;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Spins until *w != old or SPIN_NS pass; returns the last value seen. The clock is read
 * every 64 rounds only: a pause is 10 to 140 cycles depending on the core. */
static unsigned spin_while_equal(atomic_uint *w, unsigned old) {
    int64_t t0 = 0;
    for (unsigned i = 1;; i++) {
        unsigned v = atomic_load_explicit(w, memory_order_acquire);
        if (v != old) return v;
        if ((i & 63) == 0) {
            int64_t t = now_ns();
            if (t0 == 0)
                t0 = t;
            else if (t - t0 > SPIN_NS)
                return v;
            /* More threads than cores: let the thread we wait for run. */
            if ((i & 1023) == 0) sched_yield();
        }
        cpu_relax();
    }
}

#if POOL_FUTEX
static void futex_wait(atomic_uint *w, unsigned old) {
    syscall(SYS_futex, (unsigned *)w, FUTEX_WAIT_PRIVATE, old, NULL, NULL, 0);
}
static void futex_wake(atomic_uint *w, int count) {
    syscall(SYS_futex, (unsigned *)w, FUTEX_WAKE_PRIVATE, count, NULL, NULL, 0);
}
#endif

/* Worker side: blocks until gen differs from `seen`, returns the new value. */
static unsigned wait_gen(cpu_pool *p, unsigned seen) {
    unsigned g = spin_while_equal(&p->gen, seen);
    if (g != seen) return g;
    /* sleepers++ before re-reading gen, and the caller bumps gen before reading sleepers
     * (both seq_cst): one of the two sees the other, so no wake-up is lost. */
    atomic_fetch_add(&p->sleepers, 1);
#if POOL_FUTEX
    while ((g = atomic_load(&p->gen)) == seen) futex_wait(&p->gen, seen);
#else
    pthread_mutex_lock(&p->mu);
    while ((g = atomic_load(&p->gen)) == seen) pthread_cond_wait(&p->cv_gen, &p->mu);
    pthread_mutex_unlock(&p->mu);
#endif
    atomic_fetch_sub(&p->sleepers, 1);
    return g;
}

static void wake_workers(cpu_pool *p) {
    if (atomic_load(&p->sleepers) == 0) return;
#if POOL_FUTEX
    futex_wake(&p->gen, INT_MAX);
#else
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv_gen);
    pthread_mutex_unlock(&p->mu);
#endif
}

static void do_chunks(cpu_pool *p, int worker) {
    const int64_t n = p->n, chunk = p->chunk;
    const cpu_pool_fn fn = p->fn;
    void *const arg = p->arg;
    for (;;) {
        int64_t i0 = atomic_fetch_add_explicit(&p->next, chunk, memory_order_relaxed);
        if (i0 >= n) break;
        fn(arg, i0, i0 + chunk < n ? i0 + chunk : n, worker);
    }
}

/* Leaves the run: our writes (the items we did) become visible to the caller through
 * the release half of the decrement. The caller sets caller_sleeping before re-reading
 * active, so one of us sees the other. */
static void leave(cpu_pool *p) {
    if (atomic_fetch_sub(&p->active, 1) == 1 && atomic_load(&p->caller_sleeping)) {
#if POOL_FUTEX
        futex_wake(&p->active, 1);
#else
        pthread_mutex_lock(&p->mu);
        pthread_cond_signal(&p->cv_done);
        pthread_mutex_unlock(&p->mu);
#endif
    }
}

static void *worker_main(void *v) {
    worker_start ws = *(worker_start *)v;
    free(v);
    cpu_pool *p = ws.p;
    unsigned seen = 0; /* gen starts at 0 and the pool is built before any run */
    for (;;) {
        seen = wait_gen(p, seen);
        if (atomic_load_explicit(&p->stop, memory_order_relaxed)) break;
        atomic_fetch_add(&p->active, 1);
        /* Still open: the caller now waits for us, and the job is the one of `seen`. */
        if (atomic_load(&p->open) == seen) do_chunks(p, ws.id);
        leave(p);
    }
    return NULL;
}

/* Caller side, after it found no chunk left: close the run, wait for the joined workers. */
static void wait_done(cpu_pool *p) {
    atomic_store(&p->open, 0u);
    unsigned v = atomic_load(&p->active);
    /* Spin while workers keep leaving; sleep once SPIN_NS pass without progress. */
    while (v != 0) {
        unsigned w = spin_while_equal(&p->active, v);
        if (w == v) break;
        v = w;
    }
    if (v == 0) return;
    atomic_store(&p->caller_sleeping, true);
#if POOL_FUTEX
    while ((v = atomic_load(&p->active)) != 0) futex_wait(&p->active, v);
#else
    pthread_mutex_lock(&p->mu);
    while (atomic_load(&p->active) != 0) pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
#endif
    atomic_store(&p->caller_sleeping, false);
}

static int online_cpus(void) {
#ifdef CPU_COUNT
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
#endif
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    return c > 0 ? (int)c : 1;
}

cpu_pool *cpu_pool_new(int threads) {
    if (threads <= 0) threads = online_cpus();
    cpu_pool *p = aligned_alloc(CACHE_LINE, (sizeof *p + CACHE_LINE - 1) / CACHE_LINE * CACHE_LINE);
    if (!p) return NULL;
    p->threads = threads;
    p->fn = NULL;
    p->arg = NULL;
    p->n = p->chunk = 0;
    atomic_init(&p->gen, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->stop, false);
    atomic_init(&p->next, 0);
    atomic_init(&p->open, 0);
    atomic_init(&p->active, 0);
    atomic_init(&p->caller_sleeping, false);
#if !POOL_FUTEX
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_gen, NULL);
    pthread_cond_init(&p->cv_done, NULL);
#endif
    p->tids = calloc((size_t)threads, sizeof *p->tids);
    if (!p->tids) {
        free(p);
        return NULL;
    }
    for (int i = 1; i < threads; i++) {
        worker_start *ws = malloc(sizeof *ws);
        if (ws) *ws = (worker_start){.p = p, .id = i};
        if (!ws || pthread_create(&p->tids[i], NULL, worker_main, ws) != 0) {
            free(ws);
            p->threads = i; /* cpu_pool_free joins the ones started */
            cpu_pool_free(p);
            return NULL;
        }
    }
    return p;
}

void cpu_pool_free(cpu_pool *p) {
    if (!p) return;
    atomic_store_explicit(&p->stop, true, memory_order_relaxed);
    atomic_fetch_add(&p->gen, 1); /* seq_cst: before wake_workers reads sleepers */
    wake_workers(p);
    for (int i = 1; i < p->threads; i++) pthread_join(p->tids[i], NULL);
#if !POOL_FUTEX
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_gen);
    pthread_cond_destroy(&p->cv_done);
#endif
    free(p->tids);
    free(p);
}

int cpu_pool_threads(const cpu_pool *p) {
    return p->threads;
}

void cpu_pool_run(cpu_pool *p, int64_t n, int64_t grain, cpu_pool_fn fn, void *arg) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    /* One chunk, or nobody to share with: no hand-off at all. */
    if (p->threads == 1 || n <= grain) {
        fn(arg, 0, n, 0);
        return;
    }
    /* Chunks are whole multiples of grain, so every chunk but the last starts and ends
     * on a multiple of grain (the backend relies on it to keep kernel blocks whole). */
    int64_t chunk = grain, max_chunks = (int64_t)p->threads * MAX_CHUNKS_PER_THREAD;
    if ((n + chunk - 1) / chunk > max_chunks) {
        int64_t per = (n + max_chunks - 1) / max_chunks;
        chunk = (per + grain - 1) / grain * grain;
    }
    p->fn = fn;
    p->arg = arg;
    p->n = n;
    p->chunk = chunk;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    /* Only this thread writes gen; 0 is skipped so that `open` = 0 always means closed. */
    unsigned g = atomic_load_explicit(&p->gen, memory_order_relaxed) + 1;
    if (g == 0) g = 1;
    /* seq_cst: publishes the job (release) and orders both before reading sleepers. */
    atomic_store(&p->open, g);
    atomic_store(&p->gen, g);
    wake_workers(p);
    do_chunks(p, 0);
    wait_done(p);
}
