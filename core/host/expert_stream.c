/* Experts streamed from disk: see expert_stream.h. Everything here runs on the engine's
 * thread but the reads, which worker threads do into staging buffers; a read's expert is
 * copied into its stack (upload, or tensor_quant_write for packed weights, both ordered
 * with the ops already enqueued) when a product first needs it. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* O_DIRECT */
#endif
#include "expert_stream.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define XS_ALIGN     4096u /* O_DIRECT's offsets, lengths and buffers */
#define XS_FREE_BUFS 64
#define XS_FREE_MAX  ((size_t)256 << 20) /* staging kept for reuse, at most */

typedef struct xs_file {
    char *path;
    int fd_direct; /* -1 where the file system refuses O_DIRECT */
    int fd;
} xs_file;

/* One expert of one weight being read: its parts land in buf[p] + skip[p]. */
typedef struct xs_pend {
    xs_tensor *t;
    int32_t expert, slot;
    uint8_t *buf[3];
    size_t cap[3], skip[3];
    int left;  /* parts still being read (under the store's lock) */
    int err;   /* errno of a failed read */
    int ahead; /* read for a predicted routing (xs_prefetch), not yet needed */
} xs_pend;

typedef struct xs_job {
    xs_pend *p;
    int part;
} xs_job;

struct xs_tensor {
    xs_store *st;
    xs_desc d;
    int32_t *file[3]; /* per expert: the store's file and offset of each part */
    uint64_t *off[3];
    size_t slice; /* an expert's bytes, all parts */
    int32_t n_slots;
    lmh_tensor *stack; /* on backend slot d.slot, [n_slots, out, in]; NULL until used */
    int32_t *slot_of;  /* [E]: the slot holding (or being read for) expert e, or -1 */
    int32_t *exp_of;   /* [n_slots]: the expert a slot holds, or -1 */
    uint64_t *used;    /* [n_slots]: when last needed (least recently used goes first) */
    xs_pend **pend;    /* [E]: the read in flight for expert e */
    uint32_t *mark;    /* [E]: == epoch while a product needs expert e */
    uint32_t epoch;
    xs_tensor *sib;   /* the next weight of the same layer on the same backend (a ring) */
    int32_t resident; /* slots holding an expert whose read has landed */
    int32_t n_pend;   /* reads in flight or landed in staging, not yet in the stack */
};

struct xs_store {
    uint64_t budget;
    xs_file *files;
    int n_files;
    xs_tensor **w;
    int n_w;
    uint64_t tick;
    /* the readers */
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    xs_job *q;
    int q_head, q_len, q_cap;
    pthread_t *th;
    int n_th, stop;
    double last_change;
    xs_stats s; /* reads, depth: under mu */
    /* the predictor's recent record (xs_predict_ok): guesses read and used in this window,
     * whether it is on, and passes since it last tried while off */
    uint64_t win_ahead, win_used;
    int predict_off, since_probe;
    /* staging buffers kept for reuse */
    uint8_t *free_buf[XS_FREE_BUFS];
    size_t free_cap[XS_FREE_BUFS];
    int n_free;
    size_t free_bytes;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Under mu: the time integrals move on to now before the count of reads in flight changes. */
static void depth_tick(xs_store *st) {
    double t = now_s(), dt = t - st->last_change;
    if (st->s.depth_now) {
        st->s.read_busy_s += dt;
        st->s.depth_time += dt * st->s.depth_now;
    }
    st->last_change = t;
}

/* Reads len bytes at off of f into buf + skip, where skip = off % XS_ALIGN and buf holds
 * the aligned span: O_DIRECT where it works, else through the page cache, dropped after. */
static int read_part(const xs_file *f, uint64_t off, size_t len, uint8_t *buf) {
    const uint64_t a0 = off & ~(uint64_t)(XS_ALIGN - 1);
    const uint64_t want = off + len - a0, span = (want + XS_ALIGN - 1) & ~(uint64_t)(XS_ALIGN - 1);
    if (f->fd_direct >= 0) {
        uint64_t got = 0;
        while (got < want) {
            ssize_t r = pread(f->fd_direct, buf + got, (size_t)(span - got), (off_t)(a0 + got));
            if (r < 0 && errno == EINTR) continue;
            if (r < 0 && errno == EINVAL) break; /* this file system after all: buffered */
            if (r < 0) return errno;
            if (r == 0) return EIO; /* the file is shorter than its header says */
            got += (uint64_t)r;
            if (got % XS_ALIGN) break; /* a short read ends the file: done or too short */
        }
        if (got >= want) return 0;
        if (got && got < want) return EIO;
    }
    uint8_t *dst = buf + (off - a0);
    size_t got = 0;
    while (got < len) {
        ssize_t r = pread(f->fd, dst + got, len - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return errno;
        if (r == 0) return EIO;
        got += (size_t)r;
    }
    posix_fadvise(f->fd, (off_t)off, (off_t)len, POSIX_FADV_DONTNEED);
    return 0;
}

static void *reader(void *arg) {
    xs_store *st = arg;
    pthread_mutex_lock(&st->mu);
    for (;;) {
        while (!st->stop && !st->q_len) pthread_cond_wait(&st->work, &st->mu);
        if (st->stop) break;
        xs_job j = st->q[st->q_head];
        st->q_head = (st->q_head + 1) % st->q_cap;
        st->q_len--;
        pthread_mutex_unlock(&st->mu);
        xs_pend *p = j.p;
        const xs_tensor *t = p->t;
        const xs_file *f = &st->files[t->file[j.part][p->expert]];
        int rc = read_part(f, t->off[j.part][p->expert], t->d.part_bytes[j.part], p->buf[j.part]);
        pthread_mutex_lock(&st->mu);
        depth_tick(st);
        st->s.depth_now--;
        st->s.reads++;
        st->s.read_bytes += t->d.part_bytes[j.part];
        if (rc && !p->err) p->err = rc;
        p->left--;
        pthread_cond_broadcast(&st->done);
    }
    pthread_mutex_unlock(&st->mu);
    return NULL;
}

xs_store *xs_new(uint64_t budget_bytes, int io_threads) {
    xs_store *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    st->budget = budget_bytes;
    st->s.budget_bytes = budget_bytes;
    pthread_mutex_init(&st->mu, NULL);
    pthread_cond_init(&st->work, NULL);
    pthread_cond_init(&st->done, NULL);
    st->n_th = io_threads < 1 ? 1 : io_threads > 64 ? 64 : io_threads;
    st->th = calloc((size_t)st->n_th, sizeof *st->th);
    st->last_change = now_s();
    int started = 0;
    for (int i = 0; st->th && i < st->n_th; i++)
        if (pthread_create(&st->th[i], NULL, reader, st) == 0) started++;
    st->n_th = started;
    if (!started) {
        xs_free(st, NULL);
        return NULL;
    }
    return st;
}

static uint8_t *buf_get(xs_store *st, size_t n, size_t *cap) {
    for (int i = 0; i < st->n_free; i++)
        if (st->free_cap[i] >= n && st->free_cap[i] / 2 <= n) {
            uint8_t *b = st->free_buf[i];
            *cap = st->free_cap[i];
            st->free_bytes -= *cap;
            st->free_buf[i] = st->free_buf[--st->n_free];
            st->free_cap[i] = st->free_cap[st->n_free];
            return b;
        }
    void *b = NULL;
    if (posix_memalign(&b, XS_ALIGN, n ? n : XS_ALIGN)) return NULL;
    *cap = n;
    return b;
}

static void buf_put(xs_store *st, uint8_t *b, size_t cap) {
    if (!b) return;
    if (st->n_free < XS_FREE_BUFS && st->free_bytes + cap <= XS_FREE_MAX) {
        st->free_buf[st->n_free] = b;
        st->free_cap[st->n_free++] = cap;
        st->free_bytes += cap;
    } else {
        free(b);
    }
}

static void tensor_free(xs_tensor *t) {
    for (int p = 0; p < 3; p++) {
        free(t->file[p]);
        free(t->off[p]);
    }
    free(t->slot_of);
    free(t->exp_of);
    free(t->used);
    free(t->pend);
    free(t->mark);
    free(t);
}

static void wait_pend(xs_store *st, xs_pend *p) {
    pthread_mutex_lock(&st->mu);
    while (p->left) pthread_cond_wait(&st->done, &st->mu);
    pthread_mutex_unlock(&st->mu);
}

static void pend_release(xs_store *st, xs_pend *p) {
    for (int i = 0; i < 3; i++) buf_put(st, p->buf[i], p->cap[i]);
    free(p);
}

void xs_drop_stacks(xs_store *st, pl_slot *slots) {
    for (int i = 0; st && i < st->n_w; i++) {
        xs_tensor *t = st->w[i];
        for (int64_t e = 0; e < t->d.n_experts; e++)
            if (t->pend[e]) {
                wait_pend(st, t->pend[e]);
                pend_release(st, t->pend[e]);
                t->pend[e] = NULL;
            }
        if (t->stack && slots) slots[t->d.slot].api->tensor_free(slots[t->d.slot].b, t->stack);
        if (t->stack) st->s.stack_bytes -= t->slice * (uint64_t)t->n_slots;
        t->stack = NULL;
        for (int64_t e = 0; e < t->d.n_experts; e++) t->slot_of[e] = -1;
        for (int32_t s = 0; s < t->n_slots; s++) {
            t->exp_of[s] = -1;
            t->used[s] = 0;
        }
        t->resident = 0;
        t->n_pend = 0;
    }
}

void xs_free(xs_store *st, pl_slot *slots) {
    if (!st) return;
    xs_drop_stacks(st, slots);
    pthread_mutex_lock(&st->mu);
    st->stop = 1;
    pthread_cond_broadcast(&st->work);
    pthread_mutex_unlock(&st->mu);
    for (int i = 0; i < st->n_th; i++) pthread_join(st->th[i], NULL);
    free(st->th);
    for (int i = 0; i < st->n_w; i++) tensor_free(st->w[i]);
    free(st->w);
    for (int i = 0; i < st->n_files; i++) {
        if (st->files[i].fd_direct >= 0) close(st->files[i].fd_direct);
        if (st->files[i].fd >= 0) close(st->files[i].fd);
        free(st->files[i].path);
    }
    free(st->files);
    for (int i = 0; i < st->n_free; i++) free(st->free_buf[i]);
    free(st->q);
    pthread_mutex_destroy(&st->mu);
    pthread_cond_destroy(&st->work);
    pthread_cond_destroy(&st->done);
    free(st);
}

static int file_index(xs_store *st, const char *path, char *err, size_t err_len) {
    for (int i = 0; i < st->n_files; i++)
        if (strcmp(st->files[i].path, path) == 0) return i;
    xs_file *nf = realloc(st->files, ((size_t)st->n_files + 1) * sizeof *nf);
    if (!nf) return snprintf(err, err_len, "out of memory"), -1;
    st->files = nf;
    xs_file *f = &st->files[st->n_files];
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (f->fd < 0) {
        snprintf(err, err_len, "%s: cannot open for streaming: %s", path, strerror(errno));
        return -1;
    }
    f->fd_direct = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (!(f->path = strdup(path))) {
        close(f->fd);
        if (f->fd_direct >= 0) close(f->fd_direct);
        return snprintf(err, err_len, "out of memory"), -1;
    }
    return st->n_files++;
}

xs_tensor *xs_add(xs_store *st, const xs_desc *d, char *err, size_t err_len) {
    const int64_t E = d->n_experts;
    if (E < 1 || E > (1 << 20) || d->out < 1 || d->in < 1 || d->n_parts < 1 || d->n_parts > 3) {
        snprintf(err, err_len, "streamed experts: bad shape [%lld, %lld, %lld] or %d parts",
                 (long long)E, (long long)d->out, (long long)d->in, d->n_parts);
        return NULL;
    }
    xs_tensor *t = calloc(1, sizeof *t);
    xs_tensor **nw = realloc(st->w, ((size_t)st->n_w + 1) * sizeof *nw);
    if (!t || !nw) {
        free(t);
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    st->w = nw;
    t->st = st;
    t->d = *d;
    int ok = (t->slot_of = malloc((size_t)E * sizeof *t->slot_of)) &&
             (t->pend = calloc((size_t)E, sizeof *t->pend)) &&
             (t->mark = calloc((size_t)E, sizeof *t->mark));
    for (int p = 0; ok && p < d->n_parts; p++) {
        ok = (t->file[p] = malloc((size_t)E * sizeof *t->file[p])) &&
             (t->off[p] = malloc((size_t)E * sizeof *t->off[p]));
        for (int64_t e = 0; ok && e < E; e++) {
            int fi = file_index(st, d->loc[p][e].path, err, err_len);
            if (fi < 0) {
                tensor_free(t);
                return NULL;
            }
            t->file[p][e] = fi;
            t->off[p][e] = d->loc[p][e].off;
        }
        t->slice += d->part_bytes[p];
        t->d.loc[p] = NULL; /* the caller's; not kept */
    }
    if (!ok) {
        tensor_free(t);
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    for (int64_t e = 0; e < E; e++) t->slot_of[e] = -1;
    st->w[st->n_w++] = t;
    st->s.expert_bytes += t->slice * (uint64_t)E;
    st->s.n_weights = st->n_w;
    return t;
}

int xs_plan(xs_store *st, int32_t min_slots, char *err, size_t err_len) {
    if (min_slots < 1) min_slots = 1;
    for (int s = 0; s < PL_MAX_SLOTS; s++) {
        uint64_t total = 0, need = 0;
        for (int i = 0; i < st->n_w; i++)
            if (st->w[i]->d.slot == s) {
                const xs_tensor *t = st->w[i];
                total += t->slice * (uint64_t)t->d.n_experts;
                int64_t m = min_slots < t->d.n_experts ? min_slots : t->d.n_experts;
                need += t->slice * (uint64_t)m;
            }
        if (!total) continue;
        if (need > st->budget) {
            snprintf(err, err_len,
                     "--expert-cache-mb %.2f cannot hold the %d experts a token routes to in "
                     "every layer: that takes %.2f MB",
                     (double)st->budget / (1 << 20), min_slots, (double)need / (1 << 20));
            return -1;
        }
        const double frac = st->budget >= total ? 1.0 : (double)st->budget / (double)total;
        for (int i = 0; i < st->n_w; i++) {
            xs_tensor *t = st->w[i];
            if (t->d.slot != s) continue;
            int64_t n = (int64_t)(frac * (double)t->d.n_experts);
            if (n < min_slots) n = min_slots;
            if (n > t->d.n_experts) n = t->d.n_experts;
            t->n_slots = (int32_t)n;
        }
    }
    for (int i = 0; i < st->n_w; i++) { /* siblings: the same layer on the same backend */
        xs_tensor *t = st->w[i];
        free(t->exp_of);
        free(t->used);
        if (!(t->exp_of = malloc((size_t)t->n_slots * sizeof *t->exp_of)) ||
            !(t->used = calloc((size_t)t->n_slots, sizeof *t->used))) {
            snprintf(err, err_len, "out of memory");
            return -1;
        }
        for (int32_t k = 0; k < t->n_slots; k++) t->exp_of[k] = -1;
        t->sib = t;
        for (int j = i + 1; j < i + st->n_w; j++) {
            xs_tensor *u = st->w[j % st->n_w];
            if (u->d.layer == t->d.layer && u->d.slot == t->d.slot) {
                t->sib = u;
                break;
            }
        }
    }
    return 0;
}

int32_t xs_slots(const xs_tensor *t) {
    return t->n_slots;
}

int64_t xs_n_experts(const xs_tensor *t) {
    return t->d.n_experts;
}

/* A slot of t for expert e (not resident, not being read): a free one, else the least
 * recently used whose expert the product at hand does not need and is not being read.
 * -1 when every slot is taken by those. */
static int32_t claim(xs_tensor *t, int32_t e) {
    int32_t best = -1;
    for (int32_t s = 0; s < t->n_slots; s++) {
        int32_t x = t->exp_of[s];
        if (x < 0) {
            best = s;
            break;
        }
        if (t->mark[x] == t->epoch || t->pend[x]) continue;
        if (best < 0 || t->used[s] < t->used[best]) best = s;
    }
    if (best < 0) return -1;
    int32_t old = t->exp_of[best];
    if (old >= 0) {
        t->slot_of[old] = -1;
        t->resident--;
    }
    t->exp_of[best] = e;
    t->slot_of[e] = best;
    t->used[best] = ++t->st->tick;
    return best;
}

/* Starts reading expert e of t into slot s. */
static int submit(xs_tensor *t, int32_t e, int32_t s) {
    xs_store *st = t->st;
    xs_pend *p = calloc(1, sizeof *p);
    if (!p) return -1;
    *p = (xs_pend){.t = t, .expert = e, .slot = s, .left = t->d.n_parts};
    for (int k = 0; k < t->d.n_parts; k++) {
        uint64_t off = t->off[k][e];
        p->skip[k] = off % XS_ALIGN;
        size_t span = (p->skip[k] + t->d.part_bytes[k] + XS_ALIGN - 1) & ~(size_t)(XS_ALIGN - 1);
        if (!(p->buf[k] = buf_get(st, span, &p->cap[k]))) {
            pend_release(st, p);
            return -1;
        }
    }
    pthread_mutex_lock(&st->mu);
    if (st->q_len + t->d.n_parts > st->q_cap) {
        int cap = st->q_cap ? st->q_cap * 2 : 256;
        while (cap < st->q_len + t->d.n_parts) cap *= 2;
        xs_job *nq = malloc((size_t)cap * sizeof *nq);
        if (!nq) {
            pthread_mutex_unlock(&st->mu);
            pend_release(st, p);
            return -1;
        }
        for (int i = 0; i < st->q_len; i++) nq[i] = st->q[(st->q_head + i) % st->q_cap];
        free(st->q);
        st->q = nq;
        st->q_cap = cap;
        st->q_head = 0;
    }
    depth_tick(st);
    for (int k = 0; k < t->d.n_parts; k++) {
        st->q[(st->q_head + st->q_len++) % st->q_cap] = (xs_job){.p = p, .part = k};
        st->s.depth_now++;
    }
    if (st->s.depth_now > st->s.depth_max) st->s.depth_max = st->s.depth_now;
    pthread_cond_broadcast(&st->work);
    pthread_mutex_unlock(&st->mu);
    t->pend[e] = p;
    t->n_pend++;
    return 0;
}

static int make_stack(xs_tensor *t, pl_slot *slots, char *err, size_t err_len) {
    const pl_slot *sl = &slots[t->d.slot];
    const int64_t ne[3] = {t->n_slots, t->d.out, t->d.in};
    if (lmh_dtype_is_packed(t->d.dtype)) {
        const lmh_backend_api *a = sl->api;
        if (sl->plugin->info->abi_minor < 11 ||
            a->size <
                offsetof(lmh_backend_api, tensor_quant_write) + sizeof a->tensor_quant_write ||
            !a->tensor_quant || !a->tensor_quant_write) {
            snprintf(err, err_len,
                     "backend %s cannot stream %s experts (it needs plugin ABI 1.11's "
                     "tensor_quant_write)",
                     sl->plugin->info->name, lmh_dtype_name(t->d.dtype));
            return -1;
        }
        t->stack =
            a->tensor_quant(sl->b, t->d.dtype, t->d.group, 3, ne, NULL, t->d.sb_dtype, NULL, NULL);
    } else {
        t->stack = sl->api->tensor_new(sl->b, t->d.dtype, 3, ne, LMH_TENSOR_WEIGHT);
    }
    if (!t->stack) {
        snprintf(err, err_len, "out of %s memory for a stack of %d experts (%llu bytes)",
                 sl->plugin->info->name, t->n_slots,
                 (unsigned long long)(t->slice * (uint64_t)t->n_slots));
        return -1;
    }
    t->st->s.stack_bytes += t->slice * (uint64_t)t->n_slots;
    return 0;
}

/* Waits for expert e's read and copies it into its slot of the stack. */
static int land(xs_tensor *t, pl_slot *slots, int32_t e, char *err, size_t err_len) {
    xs_store *st = t->st;
    xs_pend *p = t->pend[e];
    wait_pend(st, p);
    t->pend[e] = NULL;
    t->n_pend--;
    int rc = 0;
    if (p->err) {
        rc = snprintf(err, err_len, "reading expert %d of layer %d's experts failed: %s", e,
                      t->d.layer, strerror(p->err));
    } else if (!t->stack && make_stack(t, slots, err, err_len)) {
        rc = -1;
    } else {
        const pl_slot *sl = &slots[t->d.slot];
        const uint8_t *d0 = p->buf[0] + p->skip[0];
        if (lmh_dtype_is_packed(t->d.dtype)) {
            rc = sl->api->tensor_quant_write(sl->b, t->stack, (int64_t)p->slot * t->d.out, t->d.out,
                                             (const uint32_t *)d0, p->buf[1] + p->skip[1],
                                             t->d.n_parts > 2 ? p->buf[2] + p->skip[2] : NULL);
        } else if (t->d.transposed) { /* stored [in, out]: turned into [out, in] here */
            const size_t es = lmh_dtype_size(t->d.dtype);
            const int64_t R = t->d.in, C = t->d.out;
            size_t cap;
            uint8_t *tb = buf_get(st, t->slice, &cap);
            if (!tb) {
                rc = -1;
            } else {
                for (int64_t r = 0; r < R; r++)
                    for (int64_t c = 0; c < C; c++)
                        memcpy(tb + (size_t)(c * R + r) * es, d0 + (size_t)(r * C + c) * es, es);
                rc = sl->api->upload(sl->b, t->stack, (size_t)p->slot * t->slice, tb, t->slice);
                buf_put(st, tb, cap);
            }
        } else {
            rc = sl->api->upload(sl->b, t->stack, (size_t)p->slot * t->slice, d0, t->slice);
        }
        if (rc)
            snprintf(err, err_len, "copying an expert into its stack failed (%d)", rc);
        else
            t->resident++;
    }
    if (rc) { /* the slot holds nothing usable */
        t->exp_of[p->slot] = -1;
        t->slot_of[e] = -1;
    }
    pend_release(st, p);
    return rc ? -1 : 0;
}

/* The experts ids[0..n) name, marked in t's current epoch; returns how many are distinct. */
static int64_t mark_needed(xs_tensor *t, const int32_t *ids, int64_t n) {
    if (++t->epoch == 0) { /* wrapped: old marks could match */
        memset(t->mark, 0, (size_t)t->d.n_experts * sizeof *t->mark);
        t->epoch = 1;
    }
    int64_t distinct = 0;
    for (int64_t i = 0; i < n; i++)
        if (t->mark[ids[i]] != t->epoch) {
            t->mark[ids[i]] = t->epoch;
            distinct++;
        }
    return distinct;
}

/* Lands t's finished reads of experts the product at hand does not need (read ahead for a
 * guess, or for a sibling's routing): their staging is released and their slots can be
 * evicted like any resident expert's. The needed ones are counted first (xs_resident). */
static int land_finished(xs_tensor *t, pl_slot *slots, char *err, size_t err_len) {
    xs_store *st = t->st;
    for (int64_t e = 0; t->n_pend && e < t->d.n_experts; e++) {
        xs_pend *p = t->pend[e];
        if (!p || t->mark[e] == t->epoch) continue;
        pthread_mutex_lock(&st->mu);
        int done = p->left == 0;
        pthread_mutex_unlock(&st->mu);
        if (done && land(t, slots, (int32_t)e, err, err_len)) return -1;
    }
    return 0;
}

/* Lands every read in flight for t (their slots become victims again). */
static int land_all(xs_tensor *t, pl_slot *slots, char *err, size_t err_len) {
    for (int64_t e = 0; e < t->d.n_experts; e++)
        if (t->pend[e] && land(t, slots, (int32_t)e, err, err_len)) return -1;
    return 0;
}

lmh_tensor *xs_resident(xs_store *st, xs_tensor *t, pl_slot *slots, const int32_t *ids, int64_t n,
                        int32_t *slot_ids, char *err, size_t err_len) {
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= t->d.n_experts) {
            snprintf(err, err_len, "expert id %d out of range (%lld experts)", ids[i],
                     (long long)t->d.n_experts);
            return NULL;
        }
    if (mark_needed(t, ids, n) > t->n_slots) {
        snprintf(err, err_len, "a product needs more experts than the %d its stack holds",
                 t->n_slots);
        return NULL;
    }
    if (!t->stack && make_stack(t, slots, err, err_len)) return NULL;
    if (t->n_pend && land_finished(t, slots, err, err_len)) return NULL;
    /* hits, then reads for the misses, each expert once */
    int64_t first_miss = -1;
    for (int64_t i = 0; i < n; i++) {
        int32_t e = ids[i], s = t->slot_of[e];
        if (t->mark[e] != t->epoch) continue; /* counted already */
        t->mark[e] = t->epoch - 1;            /* seen: unmarked below */
        if (s >= 0 && !t->pend[e]) {
            st->s.hits++;
            t->used[s] = ++st->tick;
            continue;
        }
        st->s.misses++;
        if (t->pend[e]) {
            st->s.prefetched++;
            st->s.ahead_used += t->pend[e]->ahead;
            st->win_used += t->pend[e]->ahead;
            t->pend[e]->ahead = 0;
            t->used[s] = ++st->tick;
        } else if (first_miss < 0) {
            first_miss = i;
        }
    }
    mark_needed(t, ids, n); /* the marks again, for claim() */
    for (int64_t i = first_miss < 0 ? n : first_miss; i < n; i++) {
        int32_t e = ids[i];
        if (t->slot_of[e] >= 0) continue;
        int32_t s = claim(t, e);
        if (s < 0) { /* slots held by reads of experts not needed now: land them */
            if (land_all(t, slots, err, err_len)) return NULL;
            s = claim(t, e);
        }
        if (s < 0 || submit(t, e, s)) {
            if (s >= 0) t->exp_of[s] = -1, t->slot_of[e] = -1;
            snprintf(err, err_len, "out of memory reading experts");
            return NULL;
        }
    }
    /* the layer's other weights: the same experts, read while this product waits and runs */
    for (xs_tensor *u = t->sib; u != t; u = u->sib) {
        mark_needed(u, ids, n);
        for (int64_t i = 0; i < n; i++) {
            int32_t e = ids[i];
            if (e >= u->d.n_experts || u->slot_of[e] >= 0) continue;
            int32_t s = claim(u, e);
            if (s < 0) break; /* all taken: it reads what it needs at its own product */
            if (submit(u, e, s)) {
                u->exp_of[s] = -1;
                u->slot_of[e] = -1;
                break;
            }
        }
    }
    for (int64_t i = 0; i < n; i++) {
        int32_t e = ids[i];
        if (t->pend[e] && land(t, slots, e, err, err_len)) return NULL;
        slot_ids[i] = t->slot_of[e];
    }
    return t->stack;
}

void xs_prefetch(xs_store *st, int32_t layer, int slot, const int32_t *ids, int64_t n) {
    for (int i = 0; i < st->n_w; i++) {
        xs_tensor *t = st->w[i];
        if (t->d.layer != layer || t->d.slot != slot || !t->exp_of) continue;
        for (int64_t j = 0; j < n; j++)
            if (ids[j] < 0 || ids[j] >= t->d.n_experts) return;
        mark_needed(t, ids, n);
        for (int64_t j = 0; j < n; j++) {
            int32_t e = ids[j], s;
            if (t->slot_of[e] >= 0) continue;
            if ((s = claim(t, e)) < 0) break;
            if (submit(t, e, s)) {
                t->exp_of[s] = -1;
                t->slot_of[e] = -1;
                break;
            }
            t->pend[e]->ahead = 1;
            st->s.ahead++;
            st->win_ahead++;
        }
    }
}

/* Guesses are judged in windows of this many reads; below XS_PREDICT_MIN of them used, the
 * predictor stops (its reads would only evict and queue before the ones needed) and tries
 * again one pass in XS_PROBE_EVERY, to notice when the text routes more predictably. */
#define XS_WINDOW      256
#define XS_PREDICT_MIN 0.7
#define XS_PROBE_EVERY 16

int xs_predict_ok(xs_store *st) {
    if (st->win_ahead >= XS_WINDOW) {
        st->predict_off = (double)st->win_used < XS_PREDICT_MIN * (double)st->win_ahead;
        st->win_ahead = st->win_used = 0;
    }
    if (!st->predict_off) return 1;
    if (++st->since_probe < XS_PROBE_EVERY) return 0;
    st->since_probe = 0;
    return 1;
}

int xs_layer_streams(const xs_store *st, int32_t layer) {
    for (int i = 0; st && i < st->n_w; i++)
        if (st->w[i]->d.layer == layer) return 1;
    return 0;
}

void xs_get_stats(xs_store *st, xs_stats *s) {
    pthread_mutex_lock(&st->mu);
    depth_tick(st);
    *s = st->s;
    pthread_mutex_unlock(&st->mu);
    s->resident_bytes = 0;
    for (int i = 0; i < st->n_w; i++)
        s->resident_bytes += st->w[i]->slice * (uint64_t)st->w[i]->resident;
}
