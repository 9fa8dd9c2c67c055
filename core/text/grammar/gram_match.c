/* Matching: a match's state is a set of threads, each a DFA state of some rule and the stack
 * of states to return to (cells shared between threads, bump-allocated). A token advances
 * every thread over its bytes. A mask walks the vocabulary's trie depth first with one
 * thread set per trie level, so a rejected prefix rejects its whole subtree, and most of
 * the walk inside string content is one table lookup per trie node. Masks are cached by the
 * state (its threads and their stacks), with, per mask, the tokens whose completion after
 * them is longest, so that a cached mask serves any budget that does not bind. */
#include "gram_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct cell {
    const struct cell *parent;
    uint64_t hash;
    int32_t ret, depth, tail; /* tail: fewest bytes to finish this cell and all below */
} cell;

typedef struct {
    int32_t st;
    const cell *stk;
} thr;

typedef struct {
    thr *t;
    int32_t n, cap;
    int32_t min; /* fewest bytes to complete, -1 until asked */
    bool end;    /* the output may end here */
} tset;

/* chunks grow from 64 cells to 4096: most matches need few */
#define CHUNK_MIN 64
#define CHUNK_MAX 4096

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    cell c[];
} chunk;

typedef struct {
    chunk *head, *cur;
    size_t n_chunks;
} arena;

typedef struct {
    uint64_t hash;
    uint32_t *key;
    int32_t key_n;
    uint32_t *bits; /* dense mask, or NULL */
    int32_t *ids;   /* sparse: allowed ids */
    int32_t n_ids;
    int32_t count; /* allowed when the budget does not bind */
    int32_t floor; /* valid for budget - 1 >= floor */
    int32_t *ex;   /* (id, min bytes after) of the tokens past floor, longest first */
    int32_t n_ex;
    size_t bytes;
    int32_t prev, next, chain;
} centry;

#define EX_CAP      4096 /* tokens kept per mask with their own completion length */
#define N_BUCKETS   4096
#define MAX_ENTRIES 16384

struct gram_match {
    const prog *p;
    const gram_vocab *v;
    int32_t words;
    arena ar[2], scratch;
    int cur_ar;
    tset cur;
    bool eos_seen, oom;
    uint32_t *key;
    int32_t key_n, key_cap;
    uint64_t key_hash;
    tset *lv; /* per trie depth */
    tset **view;
    tset tmp[2];
    thr *vis; /* states a closure entered */
    int32_t n_vis, cap_vis;
    /* a recording walk's tokens by completion length: run r is run_ids[r][0 .. run_n[r]) */
    const int32_t **run_ids;
    int32_t *run_n, *run_min;
    int32_t n_runs, cap_runs, run_lo, run_hi;
    bool runs_lost;    /* out of memory while recording: the walk must be done again */
    int32_t *chain;    /* walk: the states after 0, 1, ... characters of plain text */
    int32_t *eq_until; /* chain[c .. eq_until[c]] exist and need as many bytes to complete */
    int32_t chain_of, chain_len;
    int32_t *spec; /* special tokens some literal of the grammar holds */
    int32_t n_spec;
    /* pointer map for copying stacks */
    const cell **map_old;
    cell **map_new;
    size_t map_cap;
    /* the mask cache */
    centry *ce;
    int32_t n_ce, cap_ce, free_ce;
    int32_t buckets[N_BUCKETS];
    int32_t lru_head, lru_tail, n_live;
    size_t cache_bytes, cache_limit;
    int64_t hits, misses;
};

/* ---- cells ------------------------------------------------------------------------------ */

static void arena_reset(arena *a) {
    a->cur = NULL;
}

static void arena_free(arena *a) {
    for (chunk *c = a->head; c;) {
        chunk *n = c->next;
        free(c);
        c = n;
    }
    a->head = a->cur = NULL;
    a->n_chunks = 0;
}

/* Keeps at most n chunks (a rare walk can take many). */
static void arena_trim(arena *a, size_t n) {
    if (a->n_chunks <= n) return;
    chunk *c = a->head;
    for (size_t i = 1; i < n && c; i++) c = c->next;
    if (!c) return;
    for (chunk *x = c->next; x;) {
        chunk *nx = x->next;
        free(x);
        x = nx;
    }
    c->next = NULL;
    a->n_chunks = n;
    a->cur = NULL;
}

static cell *arena_cell(arena *a) {
    if (!a->cur || a->cur->used == a->cur->cap) {
        chunk *nx = a->cur ? a->cur->next : a->head;
        if (!nx) {
            size_t cap = a->cur && a->cur->cap < CHUNK_MAX ? a->cur->cap * 2
                         : a->cur                          ? CHUNK_MAX
                                                           : CHUNK_MIN;
            nx = malloc(sizeof *nx + cap * sizeof(cell));
            if (!nx) return NULL;
            nx->next = NULL;
            nx->cap = cap;
            if (a->cur)
                a->cur->next = nx;
            else
                a->head = nx;
            a->n_chunks++;
        }
        nx->used = 0;
        a->cur = nx;
    }
    return &a->cur->c[a->cur->used++];
}

static uint64_t mix(uint64_t h, uint64_t x) {
    h ^= x + 0x9E3779B97F4A7C15ULL + (h << 6) + (h >> 2);
    h *= 0xBF58476D1CE4E5B9ULL;
    return h ^ (h >> 31);
}

static const cell *push(gram_match *m, arena *a, int32_t ret, const cell *parent) {
    cell *c = arena_cell(a);
    if (!c) {
        m->oom = true;
        return NULL;
    }
    c->parent = parent;
    c->ret = ret;
    c->depth = parent ? parent->depth + 1 : 1;
    int64_t tail = (int64_t)m->p->st[ret].min_end + (parent ? parent->tail : 0);
    c->tail = tail > GRAM_INF ? GRAM_INF : (int32_t)tail;
    c->hash = mix(parent ? parent->hash : 0x51ED27, (uint64_t)(uint32_t)ret);
    return c;
}

static bool stk_eq(const cell *a, const cell *b) {
    while (a != b) {
        if (!a || !b || a->hash != b->hash || a->ret != b->ret || a->depth != b->depth)
            return false;
        a = a->parent;
        b = b->parent;
    }
    return true;
}

/* ---- thread sets ------------------------------------------------------------------------ */

static bool tset_reserve(gram_match *m, tset *s, int32_t n) {
    if (n <= s->cap) return true;
    int32_t cap = s->cap ? s->cap * 2 : 8;
    while (cap < n) cap *= 2;
    thr *t = realloc(s->t, (size_t)cap * sizeof *t);
    if (!t) {
        m->oom = true;
        return false;
    }
    s->t = t;
    s->cap = cap;
    return true;
}

static void tset_clear(tset *s) {
    s->n = 0;
    s->end = false;
    s->min = -1;
}

static int32_t tset_min(const prog *p, tset *s) {
    if (s->min >= 0) return s->min;
    int32_t mn = s->end ? 0 : GRAM_INF;
    for (int32_t i = 0; i < s->n; i++) {
        int32_t x = p->st[s->t[i].st].min_end + (s->t[i].stk ? s->t[i].stk->tail : 0);
        if (x < mn) mn = x;
    }
    s->min = mn;
    return mn;
}

static void add_thread(gram_match *m, tset *out, int32_t s, const cell *stk) {
    for (int32_t j = 0; j < out->n; j++)
        if (out->t[j].st == s && stk_eq(out->t[j].stk, stk)) return;
    if (!tset_reserve(m, out, out->n + 1)) return;
    out->t[out->n++] = (thr){s, stk};
}

/* Adds what state s with stack stk reaches without reading a byte: itself when it reads
 * bytes, the starts of the rules it calls, and where its rule returns to when it may end. */
static void closure(gram_match *m, tset *out, int32_t s, const cell *stk, arena *a) {
    const prog *p = m->p;
    for (;;) {
        const gstate *g = &p->st[s];
        if (g->min_end >= GRAM_INF) return;
        if (!g->simple) {
            /* a rule that may match nothing, called in a loop, comes back here */
            for (int32_t i = 0; i < m->n_vis; i++)
                if (m->vis[i].st == s && m->vis[i].stk == stk) return;
            if (m->n_vis == m->cap_vis) {
                int32_t cap = m->cap_vis ? m->cap_vis * 2 : 64;
                thr *v = realloc(m->vis, (size_t)cap * sizeof *v);
                if (!v) {
                    m->oom = true;
                    return;
                }
                m->vis = v;
                m->cap_vis = cap;
            }
            m->vis[m->n_vis++] = (thr){s, stk};
        }
        if (g->row >= 0) add_thread(m, out, s, stk);
        for (int i = 0; i < g->n_call; i++) {
            const gcall *cl = &p->calls[g->call_off + i];
            int32_t cs = p->rule_start[cl->rule];
            if (p->st[cs].min_end >= GRAM_INF || p->st[cl->ret].min_end >= GRAM_INF) continue;
            /* returning to a state that can only end is returning further: no cell */
            const cell *ns = p->st[cl->ret].pure_final ? stk : push(m, a, cl->ret, stk);
            if (ns || p->st[cl->ret].pure_final) closure(m, out, cs, ns, a);
        }
        if (!g->final) return;
        if (!stk) {
            out->end = true;
            return;
        }
        s = stk->ret;
        stk = stk->parent;
    }
}

/* in, then byte c: out (lit_only: along literal bytes only, as a special token goes). */
static void advance(gram_match *m, const tset *in, uint8_t c, tset *out, arena *a, bool lit_only) {
    const prog *p = m->p;
    tset_clear(out);
    m->n_vis = 0;
    int k = p->cls[c];
    for (int32_t i = 0; i < in->n; i++) {
        const gstate *g = &p->st[in->t[i].st];
        int32_t to = -1;
        if (!lit_only) {
            to = p->trans[g->row + k];
        } else {
            for (int j = 0; j < g->n_lit; j++)
                if (p->lits[g->lit_off + j].cls == k) to = p->lits[g->lit_off + j].to;
        }
        if (to >= 0) closure(m, out, to, in->t[i].stk, a);
    }
}

static gram_status status_of(const tset *s) {
    if (!s->end) return GRAM_MORE;
    return s->n ? GRAM_CAN_END : GRAM_ENDED;
}

/* ---- the current state -------------------------------------------------------------------- */

static int cmp_thr(const void *a, const void *b) {
    const thr *x = a, *y = b;
    if (x->st != y->st) return x->st < y->st ? -1 : 1;
    uint64_t hx = x->stk ? x->stk->hash : 0, hy = y->stk ? y->stk->hash : 0;
    return (hx > hy) - (hx < hy);
}

/* The state as words (the cache's key): end, threads in a canonical order with their
 * stacks. */
static bool make_key(gram_match *m) {
    tset *s = &m->cur;
    if (s->n > 1) qsort(s->t, (size_t)s->n, sizeof *s->t, cmp_thr);
    int64_t need = 2;
    for (int32_t i = 0; i < s->n; i++) need += 2 + (s->t[i].stk ? s->t[i].stk->depth : 0);
    if (need > m->key_cap) {
        int32_t cap = (int32_t)need * 2;
        uint32_t *k = realloc(m->key, (size_t)cap * sizeof *k);
        if (!k) return false;
        m->key = k;
        m->key_cap = cap;
    }
    int32_t n = 0;
    m->key[n++] = s->end;
    m->key[n++] = (uint32_t)s->n;
    for (int32_t i = 0; i < s->n; i++) {
        m->key[n++] = (uint32_t)s->t[i].st;
        m->key[n++] = (uint32_t)(s->t[i].stk ? s->t[i].stk->depth : 0);
        for (const cell *c = s->t[i].stk; c; c = c->parent) m->key[n++] = (uint32_t)c->ret;
    }
    m->key_n = n;
    uint64_t h = 0x2545F4914F6CDD1DULL;
    for (int32_t i = 0; i < n; i++) h = mix(h, m->key[i]);
    m->key_hash = h;
    return true;
}

static cell *map_get(gram_match *m, const cell *old) {
    size_t mask = m->map_cap - 1,
           i = (size_t)(((uintptr_t)old >> 4) * 0x9E3779B97F4A7C15ULL) & mask;
    for (; m->map_old[i]; i = (i + 1) & mask)
        if (m->map_old[i] == old) return m->map_new[i];
    return NULL;
}

static void map_put(gram_match *m, const cell *old, cell *nw) {
    size_t mask = m->map_cap - 1,
           i = (size_t)(((uintptr_t)old >> 4) * 0x9E3779B97F4A7C15ULL) & mask;
    while (m->map_old[i]) i = (i + 1) & mask;
    m->map_old[i] = old;
    m->map_new[i] = nw;
}

/* Makes s the current state: its stacks copied (sharing kept) into the other state arena. */
static int commit(gram_match *m, const tset *s) {
    arena *na = &m->ar[1 - m->cur_ar];
    arena_reset(na);
    size_t total = 0;
    for (int32_t i = 0; i < s->n; i++) total += s->t[i].stk ? (size_t)s->t[i].stk->depth : 0;
    size_t cap = 16;
    while (cap < total * 2 + 2) cap *= 2;
    if (cap > m->map_cap) {
        const cell **mo = realloc(m->map_old, cap * sizeof *mo);
        if (mo) m->map_old = mo;
        cell **mn = realloc(m->map_new, cap * sizeof *mn);
        if (mn) m->map_new = mn;
        if (!mo || !mn) return -1;
        m->map_cap = cap;
    }
    memset(m->map_old, 0, m->map_cap * sizeof *m->map_old);
    tset nt = m->cur; /* reuse the current thread buffer for the result */
    thr *copy = malloc((size_t)(s->n ? s->n : 1) * sizeof *copy);
    if (!copy) return -1;
    for (int32_t i = 0; i < s->n; i++) {
        /* copy the chain from the deepest cell not copied yet up */
        const cell *c = s->t[i].stk;
        cell *prev_new = NULL;
        cell *first_new = NULL;
        while (c) {
            cell *got = map_get(m, c);
            if (got) {
                if (prev_new)
                    prev_new->parent = got;
                else
                    first_new = got;
                break;
            }
            cell *nc = arena_cell(na);
            if (!nc) {
                free(copy);
                return -1;
            }
            *nc = *c;
            nc->parent = NULL;
            map_put(m, c, nc);
            if (prev_new)
                prev_new->parent = nc;
            else
                first_new = nc;
            prev_new = nc;
            c = c->parent;
        }
        copy[i] = (thr){s->t[i].st, first_new};
    }
    bool end = s->end;
    int32_t n = s->n;
    if (!tset_reserve(m, &nt, n)) {
        free(copy);
        return -1;
    }
    if (n) memcpy(nt.t, copy, (size_t)n * sizeof *copy);
    free(copy);
    nt.n = n;
    nt.end = end;
    nt.min = -1;
    m->cur = nt;
    m->cur_ar = 1 - m->cur_ar;
    tset_min(m->p, &m->cur);
    return make_key(m) ? 0 : -1;
}

/* ---- the cache ---------------------------------------------------------------------------- */

static void entry_free(centry *e) {
    free(e->key);
    free(e->bits);
    free(e->ids);
    free(e->ex);
    e->key = NULL;
    e->bits = NULL;
    e->ids = e->ex = NULL;
}

static void lru_unlink(gram_match *m, int32_t i) {
    centry *e = &m->ce[i];
    if (e->prev >= 0)
        m->ce[e->prev].next = e->next;
    else
        m->lru_head = e->next;
    if (e->next >= 0)
        m->ce[e->next].prev = e->prev;
    else
        m->lru_tail = e->prev;
    e->prev = e->next = -1;
}

static void lru_front(gram_match *m, int32_t i) {
    centry *e = &m->ce[i];
    e->prev = -1;
    e->next = m->lru_head;
    if (m->lru_head >= 0) m->ce[m->lru_head].prev = i;
    m->lru_head = i;
    if (m->lru_tail < 0) m->lru_tail = i;
}

static void cache_remove(gram_match *m, int32_t i) {
    centry *e = &m->ce[i];
    int32_t *pp = &m->buckets[e->hash & (N_BUCKETS - 1)];
    while (*pp != i) pp = &m->ce[*pp].chain;
    *pp = e->chain;
    lru_unlink(m, i);
    m->cache_bytes -= e->bytes;
    entry_free(e);
    e->chain = m->free_ce;
    m->free_ce = i;
    m->n_live--;
}

static void cache_shrink(gram_match *m) {
    while (m->lru_tail >= 0 && (m->cache_bytes > m->cache_limit || m->n_live > MAX_ENTRIES))
        cache_remove(m, m->lru_tail);
}

static centry *cache_find(gram_match *m) {
    for (int32_t i = m->buckets[m->key_hash & (N_BUCKETS - 1)]; i >= 0; i = m->ce[i].chain) {
        centry *e = &m->ce[i];
        if (e->hash == m->key_hash && e->key_n == m->key_n &&
            !memcmp(e->key, m->key, (size_t)m->key_n * sizeof *m->key)) {
            lru_unlink(m, i);
            lru_front(m, i);
            return e;
        }
    }
    return NULL;
}

static void set_bit(uint32_t *bits, int32_t id) {
    bits[id >> 5] |= 1u << (id & 31);
}

static void clear_bit(uint32_t *bits, int32_t id) {
    bits[id >> 5] &= ~(1u << (id & 31));
}

static int cmp_ex(const void *a, const void *b) {
    int32_t x = ((const int32_t *)a)[1], y = ((const int32_t *)b)[1];
    return (x < y) - (x > y);
}

/* The budget on a mask of every token the grammar allows (bits, with the completion
 * lengths in the runs): tokens whose completion would not fit lim are cleared; returns how
 * many stay. */
static int32_t apply_budget(gram_match *m, uint32_t *bits, int32_t n, int32_t lim) {
    int32_t count = n;
    if (lim >= m->run_hi) return count;
    for (int32_t r = 0; r < m->n_runs; r++)
        if (m->run_min[r] > lim)
            for (int32_t k = 0; k < m->run_n[r]; k++) {
                clear_bit(bits, m->run_ids[r][k]);
                count--;
            }
    return count;
}

/* Caches the mask in bits (every token the grammar allows, n of them, with their
 * completion lengths in the runs), then applies the budget lim to bits; returns how many
 * stay. */
static int32_t cache_put(gram_match *m, uint32_t *bits, int32_t n, int32_t lim) {
    if (!m->cache_limit) return apply_budget(m, bits, n, lim);
    centry e = {.hash = m->key_hash, .key_n = m->key_n, .count = n, .prev = -1, .next = -1};
    int32_t lo = m->run_lo, hi = m->run_hi, nr = m->n_runs;
    const int32_t *const *ri = m->run_ids, *rn = m->run_n, *rm = m->run_min;
    /* floor: the least value with at most EX_CAP tokens above it */
    int32_t *hist = NULL, n_ex = 0;
    if (n && hi >= lo && hi - lo <= 65536) hist = calloc((size_t)(hi - lo) + 2, sizeof *hist);
    if (!hist) {
        /* a list of them all when short, else none: valid only where no budget binds */
        e.floor = n <= EX_CAP ? -1 : hi;
        for (int32_t r = 0; r < nr; r++) n_ex += rm[r] > e.floor ? rn[r] : 0;
    } else {
        for (int32_t r = 0; r < nr; r++) hist[rm[r] - lo] += rn[r];
        e.floor = -1;
        for (int32_t x = hi; x >= lo; x--) {
            if (n_ex + hist[x - lo] > EX_CAP) {
                e.floor = x;
                break;
            }
            n_ex += hist[x - lo];
        }
    }
    e.key = malloc((size_t)m->key_n * sizeof *e.key);
    e.ex = malloc((size_t)(n_ex ? n_ex : 1) * 2 * sizeof *e.ex);
    bool dense = (int64_t)n >= m->words;
    if (dense)
        e.bits = malloc((size_t)m->words * sizeof *e.bits);
    else
        e.ids = malloc((size_t)(n ? n : 1) * sizeof *e.ids);
    if (!e.key || !e.ex || (dense ? !e.bits : !e.ids)) {
        free(hist);
        entry_free(&e);
        return apply_budget(m, bits, n, lim);
    }
    memcpy(e.key, m->key, (size_t)m->key_n * sizeof *e.key);
    if (dense) {
        memcpy(e.bits, bits, (size_t)m->words * sizeof *e.bits);
    } else {
        for (int32_t r = 0; r < nr; r++)
            for (int32_t k = 0; k < rn[r]; k++) e.ids[e.n_ids++] = ri[r][k];
    }
    /* the list, longest completion first: placed by the histogram, or sorted when short */
    if (hist) {
        int32_t at = 0;
        for (int32_t x = hi; x > e.floor && x >= lo; x--) {
            int32_t c = hist[x - lo];
            hist[x - lo] = at;
            at += c;
        }
        for (int32_t r = 0; r < nr; r++)
            if (rm[r] > e.floor)
                for (int32_t k = 0; k < rn[r]; k++) {
                    int32_t j = hist[rm[r] - lo]++;
                    e.ex[2 * j] = ri[r][k];
                    e.ex[2 * j + 1] = rm[r];
                }
    } else if (n_ex) {
        int32_t j = 0;
        for (int32_t r = 0; r < nr; r++)
            if (rm[r] > e.floor)
                for (int32_t k = 0; k < rn[r]; k++) {
                    e.ex[2 * j] = ri[r][k];
                    e.ex[2 * j + 1] = rm[r];
                    j++;
                }
        qsort(e.ex, (size_t)n_ex, 2 * sizeof *e.ex, cmp_ex);
    }
    e.n_ex = n_ex;
    free(hist);
    int32_t count = n;
    if (lim >= e.floor) {
        for (int32_t i = 0; i < n_ex && e.ex[2 * i + 1] > lim; i++) {
            clear_bit(bits, e.ex[2 * i]);
            count--;
        }
    } else {
        count = apply_budget(m, bits, n, lim);
    }
    e.bytes = sizeof e + (size_t)m->key_n * 4 + (size_t)n_ex * 8 +
              (dense ? (size_t)m->words * 4 : (size_t)n * 4);
    int32_t i;
    if (m->free_ce >= 0) {
        i = m->free_ce;
        m->free_ce = m->ce[i].chain;
    } else {
        if (m->n_ce == m->cap_ce) {
            int32_t cap = m->cap_ce ? m->cap_ce * 2 : 64;
            centry *ce = realloc(m->ce, (size_t)cap * sizeof *ce);
            if (!ce) {
                entry_free(&e);
                return count;
            }
            m->ce = ce;
            m->cap_ce = cap;
        }
        i = m->n_ce++;
    }
    int32_t *bk = &m->buckets[e.hash & (N_BUCKETS - 1)];
    e.chain = *bk;
    m->ce[i] = e;
    *bk = i;
    lru_front(m, i);
    m->cache_bytes += e.bytes;
    m->n_live++;
    cache_shrink(m);
    return count;
}

static int32_t cache_fill(gram_match *m, const centry *e, int32_t lim, uint32_t *bits) {
    if (e->bits) {
        memcpy(bits, e->bits, (size_t)m->words * sizeof *bits);
    } else {
        memset(bits, 0, (size_t)m->words * sizeof *bits);
        for (int32_t i = 0; i < e->n_ids; i++) set_bit(bits, e->ids[i]);
    }
    int32_t count = e->count;
    for (int32_t i = 0; i < e->n_ex && e->ex[2 * i + 1] > lim; i++) {
        clear_bit(bits, e->ex[2 * i]);
        count--;
    }
    return count;
}

/* ---- the mask ----------------------------------------------------------------------------- */

/* m->chain for state x: the state after c characters of plain text is chain[c] (-1: none
 * can come), for c < chain_len. False when that is not known for every token: the states
 * stop reading all plain characters alike before the longest plain token ends. */
static bool plain_chain(gram_match *m, int32_t x) {
    if (m->chain_of == x) return m->chain_len > 0;
    const gstate *st = m->p->st;
    int32_t maxc = m->v->max_chars + 1, c = 0;
    m->chain_of = x;
    m->chain_len = 0;
    for (int32_t s = x; c < maxc; c++) {
        m->chain[c] = s;
        if (s < 0) continue;
        if (st[s].next_char < 0 && !st[s].plain_dead && c + 1 < maxc) return false;
        s = st[s].next_char;
    }
    m->chain_len = maxc;
    const int32_t *ch = m->chain;
    m->eq_until[maxc - 1] = ch[maxc - 1] >= 0 ? maxc - 1 : maxc - 2;
    for (int32_t k = maxc - 1; k-- > 0;)
        m->eq_until[k] = ch[k] < 0 ? k - 1
                         : ch[k + 1] >= 0 && st[ch[k + 1]].min_end == st[ch[k]].min_end
                             ? m->eq_until[k + 1]
                             : k;
    return true;
}

static bool grow_runs(gram_match *m) {
    int32_t cap = m->cap_runs ? m->cap_runs * 2 : 1024;
    const int32_t **ri = realloc(m->run_ids, (size_t)cap * sizeof *ri);
    if (ri) m->run_ids = ri;
    int32_t *rn = realloc(m->run_n, (size_t)cap * sizeof *rn);
    if (rn) m->run_n = rn;
    int32_t *rm = realloc(m->run_min, (size_t)cap * sizeof *rm);
    if (rm) m->run_min = rm;
    if (!ri || !rn || !rm) return false;
    m->cap_runs = cap;
    return true;
}

/* Tokens ids[0 .. n) are allowed with mn bytes to complete after them: recorded as a run
 * (record), or kept when they fit lim; set: their bits are not set yet. Returns how many
 * count. */
static int32_t emit(gram_match *m, uint32_t *bits, const int32_t *ids, int32_t n, int32_t mn,
                    int32_t lim, bool record, bool set) {
    if (!record && mn > lim) return 0;
    if (set)
        for (int32_t k = 0; k < n; k++) set_bit(bits, ids[k]);
    if (record) {
        int32_t r = m->n_runs;
        if (r && m->run_ids[r - 1] + m->run_n[r - 1] == ids && m->run_min[r - 1] == mn) {
            m->run_n[r - 1] += n;
        } else if (r == m->cap_runs && !grow_runs(m)) {
            m->runs_lost = true;
        } else {
            m->run_ids[r] = ids;
            m->run_n[r] = n;
            m->run_min[r] = mn;
            m->n_runs++;
        }
        if (mn < m->run_lo) m->run_lo = mn;
        if (mn > m->run_hi) m->run_hi = mn;
    }
    return n;
}

/* One pass over the trie. record: every token the grammar allows, with its completion
 * length in runs; else the tokens that fit lim, with subtrees cut when none below can. */
static int32_t walk(gram_match *m, int32_t lim, bool record, uint32_t *bits) {
    const gram_vocab *v = m->v;
    const prog *p = m->p;
    const uint8_t *tb = v->tb, *cls = p->cls;
    const uint16_t *td = v->td, *maxrem = v->maxrem;
    const uint32_t *skip = v->skip, *tok_at = v->tok_at;
    const int32_t *trans = p->trans, *ids = v->tok_ids;
    const gstate *st = p->st;
    tset **view = m->view;
    int32_t count = 0, n = v->n_nodes;
    m->n_runs = 0;
    m->runs_lost = false;
    m->run_lo = GRAM_INF;
    m->run_hi = -1;
    view[0] = &m->cur;
    m->chain_of = -1;
    /* inside string content: every plain token keeps it there (or, in a counted string,
     * goes where as many bytes complete the output), and most of the vocabulary is plain:
     * its mask at once, then only the subtrees that hold other tokens are walked */
    bool root_loop = false;
    int32_t root_min = 0;
    if (m->cur.n == 1 && st[m->cur.t[0].st].next_char >= 0 && plain_chain(m, m->cur.t[0].st) &&
        m->chain[1] >= 0 && m->eq_until[1] >= m->chain_len - 1) {
        /* every plain token ends where as many bytes complete the output */
        root_min = st[m->chain[1]].min_end + (m->cur.t[0].stk ? m->cur.t[0].stk->tail : 0);
        root_loop = record || root_min <= lim;
    }
    bool groups = false;
    if (root_loop) {
        for (int32_t w = 0; w < m->words; w++) bits[w] |= v->all_plain[w];
    } else if (m->cur.n == 1 && st[m->cur.t[0].st].next_char >= 0 &&
               plain_chain(m, m->cur.t[0].st)) {
        /* a counted string: plain tokens by how many characters they have */
        groups = true;
        const cell *stk = m->cur.t[0].stk;
        int32_t tail = stk ? stk->tail : 0;
        for (int32_t c = 1; c < m->chain_len; c++) {
            int32_t y = m->chain[c], n_c = v->char_off[c + 1] - v->char_off[c];
            if (y < 0 || !n_c || (!record && st[y].min_end + tail > lim)) continue;
            const int32_t *gids = v->char_ids + v->char_off[c];
            if (c <= GROUP_MASKS) {
                const uint32_t *g = v->by_chars + (size_t)(c - 1) * (size_t)m->words;
                for (int32_t w = 0; w < m->words; w++) bits[w] |= g[w];
            } else {
                for (int32_t k = 0; k < n_c; k++) set_bit(bits, gids[k]);
            }
            count += emit(m, bits, gids, n_c, st[y].min_end + tail, lim, record, false);
        }
    }
    for (int32_t i = 0; i < n;) {
        int d = td[i];
        tset *par = view[d - 1], *out = &m->lv[d], *res;
        if (groups && v->plain_sub[i]) {
            i = (int32_t)skip[i];
            continue;
        }
        if (root_loop && v->plain_sub[i]) {
            count += emit(m, bits, ids + tok_at[i], (int32_t)(tok_at[skip[i]] - tok_at[i]),
                          root_min, lim, record, false);
            i = (int32_t)skip[i];
            continue;
        }
        if (par->n == 1 && st[par->t[0].st].next_char >= 0 && v->plain_sub[i] &&
            (tb[i] & 0xC0) != 0x80 && plain_chain(m, par->t[0].st)) {
            /* string content, and plain text below: where each token ends follows from how
             * many characters it has, without reading it */
            const cell *stk = par->t[0].stk;
            int32_t tail = stk ? stk->tail : 0, pc = v->pchars[i] - 1;
            uint32_t k0 = tok_at[i], k1 = tok_at[skip[i]];
            int32_t c0 = v->sub_cmin[i] - pc, c1 = v->sub_cmax[i] - pc;
            if (c1 < m->chain_len && m->chain[c0] >= 0 && m->eq_until[c0] >= c1) {
                count += emit(m, bits, ids + k0, (int32_t)(k1 - k0),
                              st[m->chain[c0]].min_end + tail, lim, record, true);
            } else {
                const int32_t *chain = m->chain;
                for (uint32_t k = k0; k < k1; k++) {
                    int32_t c = v->nchars[k] - pc;
                    int32_t y = c < m->chain_len ? chain[c] : -1;
                    if (y >= 0)
                        count += emit(m, bits, ids + k, 1, st[y].min_end + tail, lim, record, true);
                }
            }
            i = (int32_t)skip[i];
            continue;
        }
        if (par->n == 1) {
            /* one thread: mostly a state that reads bytes and nothing else */
            const thr *t0 = &par->t[0];
            int32_t to = trans[st[t0->st].row + cls[tb[i]]];
            if (to < 0 || st[to].min_end >= GRAM_INF) {
                i = (int32_t)skip[i];
                continue;
            }
            if (st[to].simple) {
                if (to == t0->st && !par->end) {
                    res = par;
                } else {
                    out->t[0] = (thr){to, t0->stk};
                    out->n = 1;
                    out->end = false;
                    out->min = -1;
                    res = out;
                }
            } else {
                tset_clear(out);
                m->n_vis = 0;
                closure(m, out, to, t0->stk, &m->scratch);
                res = out;
            }
        } else {
            advance(m, par, tb[i], out, &m->scratch, false);
            res = out;
        }
        if (!res->n && !res->end) {
            i = (int32_t)skip[i];
            continue;
        }
        view[d] = res;
        if (!record && tset_min(p, res) - (int32_t)maxrem[i] > lim) {
            i = (int32_t)skip[i];
            continue;
        }
        if (groups) {
            /* the plain ones are in their groups */
            for (uint32_t k = tok_at[i]; k < tok_at[i + 1]; k++)
                if (v->nchars[k] == NOT_PLAIN)
                    count += emit(m, bits, ids + k, 1, tset_min(p, res), lim, record, true);
        } else if (tok_at[i] != tok_at[i + 1]) {
            count += emit(m, bits, ids + tok_at[i], (int32_t)(tok_at[i + 1] - tok_at[i]),
                          tset_min(p, res), lim, record, true);
        }
        i++;
    }
    return count;
}

/* The state after token t's bytes from the current one, in m->tmp; NULL when t cannot come. */
static tset *feed(gram_match *m, int32_t t, bool lit_only) {
    const gram_vocab *v = m->v;
    const tset *in = &m->cur;
    tset *out = NULL;
    for (uint32_t i = v->off[t]; i < v->off[t + 1]; i++) {
        out = &m->tmp[(i - v->off[t]) & 1];
        advance(m, in, (uint8_t)v->bytes[i], out, &m->scratch, lit_only);
        if (!out->n && !out->end) return NULL;
        in = out;
    }
    return out;
}

int32_t gram_match_mask(gram_match *m, int32_t budget, uint32_t *allowed) {
    memset(allowed, 0, (size_t)m->words * sizeof *allowed);
    if (budget <= 0) return 0;
    int32_t lim = budget - 1, count = 0;
    const gram_vocab *v = m->v;
    if (!m->eos_seen && m->cur.n) {
        arena_reset(&m->scratch);
        centry *e = m->cache_limit ? cache_find(m) : NULL;
        if (e && lim >= e->floor) {
            m->hits++;
            count = cache_fill(m, e, lim, allowed);
        } else if (e || !m->cache_limit) {
            m->misses++;
            count = walk(m, lim, false, allowed);
        } else {
            m->misses++;
            int32_t n = walk(m, -1, true, allowed);
            if (m->runs_lost) { /* the lengths are not all known: the plain way */
                memset(allowed, 0, (size_t)m->words * sizeof *allowed);
                arena_reset(&m->scratch);
                count = walk(m, lim, false, allowed);
            } else {
                count = cache_put(m, allowed, n, lim);
            }
        }
        /* special tokens only where a literal holds their text */
        for (int32_t i = 0; i < m->n_spec; i++) {
            tset *s = feed(m, m->spec[i], true);
            if (s && tset_min(m->p, s) <= lim) {
                set_bit(allowed, m->spec[i]);
                count++;
            }
        }
        arena_trim(&m->scratch, 12);
    }
    if (m->eos_seen || m->cur.end)
        for (int i = 0; i < v->n_eos; i++)
            if (!(allowed[v->eos[i] >> 5] >> (v->eos[i] & 31) & 1)) {
                set_bit(allowed, v->eos[i]);
                count++;
            }
    return count;
}

int gram_match_accept(gram_match *m, int32_t t) {
    const gram_vocab *v = m->v;
    if (t < 0 || t >= v->n_vocab) return -1;
    int kind = v->kind[t];
    if (kind == TK_EOS) {
        if (!m->eos_seen && !m->cur.end) return -1;
        m->eos_seen = true;
        return 0;
    }
    if (m->eos_seen || kind == TK_NONE) return -1;
    if (kind == TK_SPECIAL) {
        bool cand = false;
        for (int32_t i = 0; i < m->n_spec && !cand; i++) cand = m->spec[i] == t;
        if (!cand) return -1;
    }
    arena_reset(&m->scratch);
    tset *s = feed(m, t, kind == TK_SPECIAL);
    if (!s || tset_min(m->p, s) >= GRAM_INF) return -1;
    return commit(m, s);
}

gram_status gram_match_status(const gram_match *m) {
    return m->eos_seen ? GRAM_ENDED : status_of(&m->cur);
}

int32_t gram_match_min_bytes(const gram_match *m) {
    return m->eos_seen ? 0 : m->cur.min;
}

void gram_match_set_cache(gram_match *m, size_t bytes) {
    m->cache_limit = bytes;
    if (!bytes)
        while (m->lru_tail >= 0) cache_remove(m, m->lru_tail);
    cache_shrink(m);
}

void gram_match_cache_stats(const gram_match *m, int64_t *hits, int64_t *misses, size_t *bytes) {
    if (hits) *hits = m->hits;
    if (misses) *misses = m->misses;
    if (bytes) *bytes = m->cache_bytes;
}

/* ---- life ----------------------------------------------------------------------------------- */

static bool contains(const char *hay, size_t hn, const char *needle, size_t nn) {
    for (size_t i = 0; i + nn <= hn; i++)
        if (!memcmp(hay + i, needle, nn)) return true;
    return false;
}

void gram_match_free(gram_match *m) {
    if (!m) return;
    arena_free(&m->ar[0]);
    arena_free(&m->ar[1]);
    arena_free(&m->scratch);
    free(m->cur.t);
    free(m->tmp[0].t);
    free(m->tmp[1].t);
    if (m->lv)
        for (int i = 0; i <= m->v->max_depth; i++) free(m->lv[i].t);
    free(m->lv);
    free(m->view);
    free(m->vis);
    free(m->key);
    free(m->run_ids);
    free(m->run_n);
    free(m->run_min);
    free(m->spec);
    free(m->chain);
    free(m->eq_until);
    free(m->map_old);
    free(m->map_new);
    for (int32_t i = 0; i < m->n_ce; i++) entry_free(&m->ce[i]);
    free(m->ce);
    free(m);
}

gram_match *gram_match_new(const gram *g, const gram_vocab *v) {
    if (!g || !v || !g->p) return NULL;
    gram_match *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->p = g->p;
    m->v = v;
    m->words = (v->n_vocab + 31) / 32;
    m->lru_head = m->lru_tail = m->free_ce = -1;
    for (int i = 0; i < N_BUCKETS; i++) m->buckets[i] = -1;
    m->cache_limit = (size_t)8 << 20;
    m->lv = calloc((size_t)v->max_depth + 1, sizeof *m->lv);
    m->view = calloc((size_t)v->max_depth + 1, sizeof *m->view);
    m->spec = malloc((size_t)(v->n_special ? v->n_special : 1) * sizeof *m->spec);
    m->chain = malloc(((size_t)v->max_chars + 2) * sizeof *m->chain);
    m->eq_until = malloc(((size_t)v->max_chars + 2) * sizeof *m->eq_until);
    if (!m->lv || !m->view || !m->spec || !m->chain || !m->eq_until) goto fail;
    for (int i = 0; i <= v->max_depth; i++)
        if (!tset_reserve(m, &m->lv[i], 4)) goto fail;
    for (int32_t i = 0; i < v->n_special; i++) {
        int32_t id = v->special[i];
        const char *s = v->bytes + v->off[id];
        size_t n = v->off[id + 1] - v->off[id];
        for (int k = 0; k < m->p->n_lit_text; k++)
            if (contains(m->p->lit_text[k], m->p->lit_len[k], s, n)) {
                m->spec[m->n_spec++] = id;
                break;
            }
    }
    tset start = {0};
    tset_clear(&start);
    closure(m, &start, m->p->start, NULL, &m->scratch);
    if (m->oom || commit(m, &start)) {
        free(start.t);
        goto fail;
    }
    free(start.t);
    return m;
fail:
    gram_match_free(m);
    return NULL;
}
