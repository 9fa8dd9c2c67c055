/* What the cache plugins share (header only, each plugin its own copy of the code): the
 * table of sequences with a pair of K/V tensors a layer, and where rows go. Layers that see
 * the whole sequence keep every position in order, in a tensor grown by doubling; sliding-
 * window layers keep a ring of window - 1 + (rows of the largest step) positions, so
 * their memory stays bounded however long the sequence grows. Row r of a ring holds the
 * largest position p appended so far with p % cap == r, as LMH_OP_ATTENTION reads it. The
 * tensors' format and what a row's bytes are belong to the plugin. */
#ifndef LMHOST_CACHE_KV_SEQS_H
#define LMHOST_CACHE_KV_SEQS_H

#include "lmhost/lmhost.h"

#include <stdlib.h>

typedef struct kv_layer {
    lmh_tensor *k, *v;
    int32_t cap; /* rows allocated */
    int32_t pos; /* positions appended so far (the sequence length for this layer) */
    /* Recurrent state (rec_state.h): a tensor a buffer, made at its first use, and the
     * positions each buffer has taken. */
    lmh_tensor *st[LMH_MAX_STATE_BUFS];
    int32_t st_pos[LMH_MAX_STATE_BUFS];
    int st_stale; /* trimmed below what the state holds: unusable until state_load */
    int st_zero;  /* trimmed to 0: the tensors are zeroed before their next use */
    /* A compressed store a plugin may keep beside k and v for positions [0, cpos)
     * (cache-turboquant: older rows as codes, k and v then a ring of the newest). */
    lmh_tensor *ck, *cv;
    int32_t ccap, cpos;
} kv_layer;

typedef struct kv_seq {
    uint64_t id;
    kv_layer *layers;
} kv_seq;

typedef struct kv_seqs {
    const lmh_layer_state *layers;  /* the cache's copy */
    const lmh_recurrent_state *rec; /* the cache's copy of each layer's recurrent state, or NULL */
    int32_t n_layers;
    int32_t first_kv;  /* the layer whose length is the sequence's length; -1: none */
    int32_t first_rec; /* the first layer with recurrent state, which says it where no layer
                          keeps keys and values; -1: none */
    kv_seq *seqs;
    int32_t n, cap;
} kv_seqs;

static inline void kv_seqs_init(kv_seqs *t, const lmh_layer_state *layers,
                                const lmh_recurrent_state *rec, int32_t n_layers) {
    *t = (kv_seqs){
        .layers = layers, .rec = rec, .n_layers = n_layers, .first_kv = -1, .first_rec = -1};
    for (int32_t l = 0; l < n_layers && t->first_kv < 0; l++)
        if (layers[l].kind == LMH_STATE_KV) t->first_kv = l;
    for (int32_t l = 0; rec && l < n_layers && t->first_rec < 0; l++)
        if (rec[l].n_bufs > 0) t->first_rec = l;
}

/* Rows held: every position, or the ring's capacity once it has wrapped. */
static inline int32_t kv_rows_held(const kv_layer *kv) {
    return kv->pos < kv->cap ? kv->pos : kv->cap;
}

/* The stored rows that a step's n queries can see, each once. The queries are the step's
 * rows, the last n positions appended: with a window, the first sees window - 1 before
 * its own; a ring holds no more than that anyway. */
static inline int32_t kv_rows_seen(const kv_layer *kv, int32_t n, int32_t window) {
    int32_t first = kv->pos - kv_rows_held(kv);
    if (window > 0 && kv->pos - n - (window - 1) > first) first = kv->pos - n - (window - 1);
    return first < 0 ? kv->pos : kv->pos - first;
}

/* Whether (seq, layer) holds positions [first, first + n): the last kv_rows_held of those
 * appended (a ring's older rows are overwritten), as read_rows needs them. */
static inline int kv_holds(const kv_layer *kv, int32_t first, int32_t n) {
    return first >= 0 && n >= 0 && first >= kv->pos - kv_rows_held(kv) && first <= kv->pos - n;
}

/* The row that holds position p. */
static inline int32_t kv_slot(const lmh_layer_state *st, const kv_layer *kv, int32_t p) {
    return st->window > 0 ? p % kv->cap : p;
}

static inline kv_seq *kv_find(kv_seqs *t, uint64_t id) {
    for (int32_t i = 0; i < t->n; i++)
        if (t->seqs[i].id == id) return &t->seqs[i];
    return NULL;
}

static inline int kv_seq_add(kv_seqs *t, uint64_t id) {
    if (kv_find(t, id)) return LMH_EINVAL;
    if (t->n == t->cap) {
        int32_t cap = t->cap ? t->cap * 2 : 8;
        kv_seq *n = (kv_seq *)realloc(t->seqs, (size_t)cap * sizeof *n);
        if (!n) return LMH_ENOMEM;
        t->seqs = n;
        t->cap = cap;
    }
    kv_seq *s = &t->seqs[t->n];
    s->id = id;
    s->layers = (kv_layer *)calloc((size_t)t->n_layers + 1, sizeof *s->layers);
    if (!s->layers) return LMH_ENOMEM;
    t->n++;
    return LMH_OK;
}

/* Takes s out of the table (its tensors already freed). */
static inline void kv_seq_drop(kv_seqs *t, kv_seq *s) {
    free(s->layers);
    *s = t->seqs[--t->n];
}

static inline int32_t kv_seq_len(kv_seqs *t, uint64_t id) {
    kv_seq *s = kv_find(t, id);
    if (!s) return -1;
    if (t->first_kv >= 0) return s->layers[t->first_kv].pos;
    return t->first_rec < 0 ? 0 : s->layers[t->first_rec].st_pos[0];
}

/* Whether (seq, layer) can go back to length len: a ring that has wrapped overwrote older
 * positions, and going back needs the window - 1 positions before len still there (they
 * are after a step of n rows on a ring of window - 1 + n: speculative decoding's rejected
 * proposals). Rows older than those may be stale afterwards; nothing reads them. */
static inline int kv_can_trim(const lmh_layer_state *st, const kv_layer *kv, int32_t len) {
    if (st->window <= 0 || len <= 0 || len >= kv->pos || kv->pos <= kv->cap) return 1;
    int32_t need = len - (st->window - 1);
    return (need > 0 ? need : 0) >= kv->pos - kv->cap;
}

static inline int kv_seq_trim(kv_seqs *t, uint64_t id, int32_t len) {
    kv_seq *s = kv_find(t, id);
    if (!s || len < 0) return LMH_EINVAL;
    /* Check every layer before changing any. */
    for (int32_t l = 0; l < t->n_layers; l++)
        if (!kv_can_trim(&t->layers[l], &s->layers[l], len)) return LMH_EUNSUPPORTED;
    for (int32_t l = 0; l < t->n_layers; l++) {
        kv_layer *kv = &s->layers[l];
        if (kv->pos > len) kv->pos = len;
        /* recurrent state cannot go back: to 0 it starts over, elsewhere it waits for a
         * state_load */
        for (int32_t b = 0; t->rec && b < t->rec[l].n_bufs; b++)
            if (kv->st_pos[b] > len) {
                kv->st_pos[b] = len;
                if (len == 0)
                    kv->st_zero = 1;
                else
                    kv->st_stale = 1;
            }
        if (len == 0) kv->st_stale = 0;
    }
    return LMH_OK;
}

/* The capacity (seq, layer) is to have before appending n rows, or 0 where it keeps its
 * own: a ring grows to hold window - 1 + n and shrinks back to the window when decoding
 * after a long step; a full layer doubles (up to max_len where that is set). */
static inline int32_t kv_capacity_for(const lmh_layer_state *st, const kv_layer *kv, int32_t n,
                                      int32_t max_len) {
    if (st->window > 0) {
        int32_t need = st->window - 1 + n;
        if (kv->cap < need) return need > st->window ? need : st->window;
        if (n == 1 && kv->cap > st->window) return st->window;
        return 0;
    }
    if (kv->pos + n <= kv->cap) return 0;
    int32_t cap = kv->cap ? kv->cap : 16;
    while (cap < kv->pos + n) cap = cap > (1 << 29) ? kv->pos + n : cap * 2;
    if (max_len > 0 && cap > max_len) cap = max_len;
    return cap;
}

/* A plugin's copy of rows [from, from + n) of src into rows [at, at + n) of dst. */
typedef int (*kv_copy_fn)(lmh_cache *c, lmh_tensor *dst, int32_t at, lmh_tensor *src, int32_t from,
                          int32_t n);

/* Moves the positions still needed from a layer's tensors (old) to new ones k, v of ncap
 * rows (with the same pos), through the plugin's copy: all of a full layer; a ring's last
 * window - 1, each to its row in the new ring. */
static inline int kv_keep(lmh_cache *c, kv_copy_fn copy, const lmh_layer_state *st,
                          const kv_layer *old, lmh_tensor *k, lmh_tensor *v, int32_t ncap) {
    if (st->window == 0) {
        int rc = copy(c, k, 0, old->k, 0, old->pos);
        return rc == LMH_OK ? copy(c, v, 0, old->v, 0, old->pos) : rc;
    }
    kv_layer nk = {.cap = ncap, .pos = old->pos};
    int32_t first = old->pos - (st->window - 1);
    if (first < old->pos - kv_rows_held(old)) first = old->pos - kv_rows_held(old);
    if (first < 0) first = 0;
    int rc = LMH_OK;
    for (int32_t p = first; p < old->pos && rc == LMH_OK; p++) {
        rc = copy(c, k, kv_slot(st, &nk, p), old->k, kv_slot(st, old, p), 1);
        if (rc == LMH_OK) rc = copy(c, v, kv_slot(st, &nk, p), old->v, kv_slot(st, old, p), 1);
    }
    return rc;
}

/* lmh_cache_api.layer_rows: the rows (seq, layer) holds, -1 for an unknown one. */
static inline int32_t kv_layer_rows(kv_seqs *t, uint64_t id, int32_t l) {
    kv_seq *s = kv_find(t, id);
    if (!s || l < 0 || l >= t->n_layers) return -1;
    return kv_rows_held(&s->layers[l]);
}

#endif
