#include "prefix_cache.h"

#include <stdlib.h>
#include <string.h>

typedef struct pc_entry {
    int cache;
    int32_t n; /* tokens held (the snapshot's length) */
    int32_t *tok;
    uint64_t head;  /* hash of the first PC_MIN_TOKENS tokens */
    uint64_t bytes; /* the snapshot's and the tokens' */
    uint64_t used;  /* the pc's clock at the last insert or hit */
    engine_snapshot *sn;
    uint64_t seq; /* parked: the engine's sequence that holds the state */
} pc_entry;

struct prefix_cache {
    pc_entry *e;
    int32_t n, cap;
    int cut;
    engine *park;
    uint64_t clock;
    pc_stats st;
};

/* FNV-1a over the first PC_MIN_TOKENS ids: an entry whose head differs cannot serve */
static uint64_t head_hash(const int32_t *tok) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < PC_MIN_TOKENS; i++) {
        h ^= (uint32_t)tok[i];
        h *= 1099511628211ull;
    }
    return h;
}

prefix_cache *pc_new(uint64_t budget, int cut, engine *park) {
    prefix_cache *pc = calloc(1, sizeof *pc);
    if (!pc) return NULL;
    pc->cut = cut;
    pc->park = park;
    pc->st.budget = budget;
    return pc;
}

/* Takes entry i out; `keep`: its parked sequence is the caller's now (else removed). */
static void take(prefix_cache *pc, int32_t i, int keep) {
    pc_entry *x = &pc->e[i];
    pc->st.bytes -= x->bytes;
    engine_snapshot_free(x->sn);
    if (x->seq && !keep) engine_seq_remove(pc->park, x->seq);
    free(x->tok);
    pc->e[i] = pc->e[--pc->n];
    pc->st.entries = (uint64_t)pc->n;
}

static void drop(prefix_cache *pc, int32_t i) {
    take(pc, i, 0);
}

int pc_parks(const prefix_cache *pc) {
    return pc && pc->park;
}

int pc_evict(prefix_cache *pc) {
    if (!pc || !pc->n) return 0;
    int32_t lru = 0;
    for (int32_t i = 1; i < pc->n; i++)
        if (pc->e[i].used < pc->e[lru].used) lru = i;
    drop(pc, lru);
    pc->st.evictions++;
    return 1;
}

void pc_clear(prefix_cache *pc) {
    while (pc && pc->n) drop(pc, pc->n - 1);
}

void pc_free(prefix_cache *pc) {
    if (!pc) return;
    pc_clear(pc);
    free(pc->e);
    free(pc);
}

static int32_t common(const int32_t *a, int32_t na, const int32_t *b, int32_t nb) {
    int32_t n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

int pc_find(prefix_cache *pc, int cache, const int32_t *tok, int32_t n, pc_hit *hit) {
    *hit = (pc_hit){0};
    if (!pc || n <= PC_MIN_TOKENS) return 0;
    uint64_t h = head_hash(tok);
    int32_t best = -1, best_use = 0;
    for (int32_t i = 0; i < pc->n; i++) {
        const pc_entry *x = &pc->e[i];
        if (x->cache != cache || x->head != h) continue;
        int32_t m = common(x->tok, x->n, tok, n - 1);
        /* a state that cannot be cut back serves only a prompt that extends it whole */
        int32_t u = pc->cut ? m : m == x->n ? m : 0;
        if (u >= PC_MIN_TOKENS && u > best_use) best = i, best_use = u;
    }
    if (best < 0) {
        pc->st.misses++;
        return 0;
    }
    pc->e[best].used = ++pc->clock;
    pc->st.hits++;
    pc->st.reused_tokens += (uint64_t)best_use;
    *hit = (pc_hit){.sn = pc->e[best].sn, .seq = pc->e[best].seq, .use = best_use};
    if (hit->seq) take(pc, best, 1); /* a parked sequence goes on as the new request's */
    return 1;
}

/* Makes room for an entry of n tokens tok and `bytes`, dropping the ones it makes redundant
 * and then the least recently used; adds it. 0, or -1 when it cannot be kept. */
static int add(prefix_cache *pc, int cache, const int32_t *tok, int32_t n, uint64_t bytes,
               engine_snapshot *sn, uint64_t seq) {
    if (!pc || n < PC_MIN_TOKENS || bytes > pc->st.budget) return -1;
    /* entries this one holds whole (where cutting back serves their prompts) or repeats */
    for (int32_t i = 0; i < pc->n;) {
        const pc_entry *x = &pc->e[i];
        int same = x->cache == cache && x->n <= n && common(x->tok, x->n, tok, n) == x->n;
        if (same && (pc->cut || x->n == n))
            drop(pc, i);
        else
            i++;
    }
    /* room: the least recently used go first */
    while (pc->n && pc->st.bytes + bytes > pc->st.budget) pc_evict(pc);
    if (pc->n == pc->cap) {
        int32_t cap = pc->cap ? 2 * pc->cap : 16;
        pc_entry *e = realloc(pc->e, (size_t)cap * sizeof *e);
        if (!e) return -1;
        pc->e = e;
        pc->cap = cap;
    }
    int32_t *copy = malloc((size_t)n * sizeof *copy);
    if (!copy) return -1;
    memcpy(copy, tok, (size_t)n * sizeof *copy);
    pc->e[pc->n++] = (pc_entry){.cache = cache,
                                .n = n,
                                .tok = copy,
                                .head = head_hash(tok),
                                .bytes = bytes,
                                .used = ++pc->clock,
                                .sn = sn,
                                .seq = seq};
    pc->st.bytes += bytes;
    pc->st.inserts++;
    pc->st.entries = (uint64_t)pc->n;
    return 0;
}

void pc_insert(prefix_cache *pc, int cache, const int32_t *tok, engine_snapshot *sn) {
    int32_t n = sn ? engine_snapshot_len(sn) : 0;
    uint64_t bytes = sn ? engine_snapshot_bytes(sn) + (uint64_t)n * sizeof *tok : 0;
    if (add(pc, cache, tok, n, bytes, sn, 0)) engine_snapshot_free(sn);
}

void pc_park(prefix_cache *pc, int cache, const int32_t *tok, int32_t n, uint64_t seq,
             uint64_t bytes) {
    if (!pc || !pc->park) return;
    if (add(pc, cache, tok, n, bytes + (uint64_t)n * sizeof *tok, NULL, seq))
        engine_seq_remove(pc->park, seq);
}

void pc_get_stats(const prefix_cache *pc, pc_stats *st) {
    if (pc)
        *st = pc->st;
    else
        memset(st, 0, sizeof *st);
}
