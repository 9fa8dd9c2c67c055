/* What the cache plugins keep of a sequence besides appending keys and values (header only,
 * like kv_seqs.h): recurrent state, and snapshots of the whole sequence.
 *
 * Recurrent state: one f32 tensor a sequence, layer and buffer on the cache's backend, made
 * and zeroed at its first use, handed to the recurrent ops in their state operand
 * (lmh_cache_api.recur). Every format keeps it in f32: it is read and rewritten whole at
 * every step, so a rounded format's error would compound along the sequence rather than
 * stay put as a K/V row's does.
 *
 * A snapshot (state_save / state_load) is the same bytes from any backend: a header (magic,
 * version, whether it has K/V rows, the length), then layer by layer the recurrent
 * buffers' values and, with K/V rows, the first position and count of the rows the layer
 * holds, their keys, then their values, each row as the plugin stores it (seq_rows_fn
 * moves them). */
#ifndef LMHOST_CACHE_SEQ_STATE_H
#define LMHOST_CACHE_SEQ_STATE_H

#include "kv_seqs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REC_MAGIC   0x53484d4cu /* "LMHS" */
#define REC_VERSION 1u

/* The layers' recurrent state from the cache's configuration, checked and copied into
 * *out (NULL when no layer has any). Returns LMH_OK or an error with err set. */
static inline int rec_config(const lmh_cache_config *cfg, lmh_recurrent_state **out, char *err,
                             size_t err_len) {
    *out = NULL;
    if (cfg->size < offsetof(lmh_cache_config, recurrent) + sizeof cfg->recurrent ||
        !cfg->recurrent)
        return LMH_OK;
    int any = 0;
    for (int32_t l = 0; l < cfg->n_layers; l++) {
        const lmh_recurrent_state *r = &cfg->recurrent[l];
        if (r->n_bufs < 0 || r->n_bufs > LMH_MAX_STATE_BUFS) {
            snprintf(err, err_len, "layer %d: %d recurrent state buffers", l, r->n_bufs);
            return LMH_EINVAL;
        }
        for (int32_t b = 0; b < r->n_bufs; b++) {
            const lmh_state_buf *sb = &r->buf[b];
            int ok = sb->dtype == LMH_F32 && sb->ndim >= 1 && sb->ndim <= LMH_MAX_DIMS;
            for (int i = 0; ok && i < sb->ndim; i++) ok = sb->ne[i] > 0 && sb->ne[i] < (1 << 30);
            if (ok) ok = lmh_state_buf_elems(sb) < ((int64_t)1 << 31);
            if (!ok) {
                snprintf(err, err_len,
                         "layer %d: recurrent state buffer %d is not an f32 tensor "
                         "of 1 to 4 positive dimensions under 2^31 elements",
                         l, b);
                return LMH_EINVAL;
            }
        }
        any |= r->n_bufs > 0;
    }
    if (!any) return LMH_OK;
    *out = (lmh_recurrent_state *)malloc((size_t)cfg->n_layers * sizeof **out);
    if (!*out) return LMH_ENOMEM;
    memcpy(*out, cfg->recurrent, (size_t)cfg->n_layers * sizeof **out);
    return LMH_OK;
}

static inline uint64_t rec_buf_bytes(const lmh_state_buf *sb) {
    return (uint64_t)lmh_state_buf_elems(sb) * sizeof(float);
}

/* Bytes of one sequence's recurrent state in layer l, and in all layers. */
static inline uint64_t rec_layer_bytes(const kv_seqs *t, int32_t l) {
    uint64_t n = 0;
    for (int32_t b = 0; t->rec && b < t->rec[l].n_bufs; b++) n += rec_buf_bytes(&t->rec[l].buf[b]);
    return n;
}

static inline uint64_t rec_seq_bytes(const kv_seqs *t) {
    uint64_t n = 0;
    for (int32_t l = 0; l < t->n_layers; l++) n += rec_layer_bytes(t, l);
    return n;
}

/* Bytes the layer's state tensors hold now. */
static inline uint64_t rec_layer_held(const kv_seqs *t, const kv_layer *kv, int32_t l) {
    uint64_t n = 0;
    for (int32_t b = 0; t->rec && b < t->rec[l].n_bufs; b++)
        if (kv->st[b]) n += rec_buf_bytes(&t->rec[l].buf[b]);
    return n;
}

static inline int rec_zero(const lmh_backend_api *be, lmh_backend *bk, lmh_tensor *x,
                           uint64_t bytes) {
    static const float zeros[4096];
    for (uint64_t o = 0; o < bytes; o += sizeof zeros) {
        uint64_t n = bytes - o < sizeof zeros ? bytes - o : sizeof zeros;
        int rc = be->upload(bk, x, (size_t)o, zeros, (size_t)n);
        if (rc != LMH_OK) return rc;
    }
    return LMH_OK;
}

/* Frees a layer's state tensors; returns the bytes they held. */
static inline uint64_t rec_free_layer(const lmh_backend_api *be, lmh_backend *bk, const kv_seqs *t,
                                      kv_layer *kv, int32_t l) {
    uint64_t n = rec_layer_held(t, kv, l);
    for (int32_t b = 0; b < LMH_MAX_STATE_BUFS; b++) {
        if (kv->st[b]) be->tensor_free(bk, kv->st[b]);
        kv->st[b] = NULL;
    }
    return n;
}

/* Makes (or zeroes, after a trim to 0) the layer's state tensors. *held grows by what is
 * made. */
static inline int rec_ready(const lmh_backend_api *be, lmh_backend *bk, const kv_seqs *t,
                            kv_layer *kv, int32_t l, uint64_t *held) {
    const lmh_recurrent_state *r = &t->rec[l];
    for (int32_t b = 0; b < r->n_bufs; b++) {
        const lmh_state_buf *sb = &r->buf[b];
        int fresh = !kv->st[b];
        if (fresh) {
            kv->st[b] = be->tensor_new(bk, LMH_F32, sb->ndim, sb->ne, 0);
            if (!kv->st[b]) return LMH_ENOMEM;
            *held += rec_buf_bytes(sb);
        }
        if (fresh || kv->st_zero) {
            int rc = rec_zero(be, bk, kv->st[b], rec_buf_bytes(sb));
            if (rc != LMH_OK) return rc;
        }
    }
    kv->st_zero = 0;
    return LMH_OK;
}

/* lmh_cache_api.recur: the op with (seq, layer)'s buffer `buf` as its state operand. */
static inline int rec_recur(const lmh_backend_api *be, lmh_backend *bk, kv_seqs *t, uint64_t id,
                            int32_t l, int32_t buf, const lmh_op *op, uint64_t *held,
                            uint64_t *read) {
    kv_seq *s = kv_find(t, id);
    int slot = op ? lmh_op_state_src(op->code) : -1;
    if (!s || !t->rec || l < 0 || l >= t->n_layers || buf < 0 || buf >= t->rec[l].n_bufs ||
        slot < 0 || !op->dst || lmh_op_src(op, slot))
        return LMH_EINVAL;
    kv_layer *kv = &s->layers[l];
    if (kv->st_stale) return LMH_EINVAL; /* trimmed back: only a state_load mends it */
    int rc = rec_ready(be, bk, t, kv, l, held);
    if (rc != LMH_OK) return rc;
    lmh_op o = *op;
    lmh_op_set_src(&o, slot, kv->st[buf]);
    rc = be->enqueue(bk, &o);
    if (rc != LMH_OK) return rc;
    kv->st_pos[buf] += (int32_t)op->dst->ne[0];
    *read += rec_buf_bytes(&t->rec[l].buf[buf]);
    return LMH_OK;
}

/* ---- snapshots ---------------------------------------------------------------------- */

#define SNAP_HEADER 16u

/* What a plugin brings for snapshots with K/V rows: the bytes of a layer's key and value
 * row (all K/V heads), new storage of cap rows for a layer that holds none, and the move of
 * the n rows in storage slots [slot, slot + n) between the layer's tensors and kbuf, vbuf
 * (n rows each, in slot order; save: tensors -> buffers, a sync point). */
typedef struct seq_kv_io {
    uint64_t (*k_row)(lmh_cache *c, int32_t l);
    uint64_t (*v_row)(lmh_cache *c, int32_t l);
    int (*alloc)(lmh_cache *c, int32_t l, kv_layer *kv, int32_t cap);
    int (*rows)(lmh_cache *c, int32_t l, kv_layer *kv, int32_t slot, int32_t n, void *kbuf,
                void *vbuf, int save);
    /* Optional (NULL: none): layers whose keys and values the plugin lays out itself, after
     * the layer's recurrent buffers, in place of the first position, count and rows: own()
     * says which; own_size the bytes (seq, l) takes now; own_save writes them; own_check
     * checks a snapshot's at src (avail bytes there) for a sequence of length len and says
     * how many it takes; own_load takes the layer to them (its rows in place of its own). */
    int (*own)(lmh_cache *c, int32_t l);
    uint64_t (*own_size)(lmh_cache *c, int32_t l, kv_layer *kv);
    int (*own_save)(lmh_cache *c, int32_t l, kv_layer *kv, uint8_t *dst);
    int (*own_check)(lmh_cache *c, int32_t l, const uint8_t *src, uint64_t avail, int32_t len,
                     uint64_t *used);
    int (*own_load)(lmh_cache *c, int32_t l, kv_layer *kv, const uint8_t *src, int32_t len);
} seq_kv_io;

static inline int snap_own(lmh_cache *c, const seq_kv_io *io, int32_t l) {
    return io->own && io->own(c, l);
}

/* The first position and the count of rows (seq, layer) holds. */
static inline void snap_held(const kv_layer *kv, int32_t *first, int32_t *n) {
    *n = kv_rows_held(kv);
    *first = kv->pos - *n;
}

/* lmh_cache_api.state_size */
static inline uint64_t snap_size(lmh_cache *c, const seq_kv_io *io, kv_seqs *t, uint64_t id,
                                 int with_kv) {
    kv_seq *s = kv_find(t, id);
    if (!s) return 0;
    uint64_t n = SNAP_HEADER + rec_seq_bytes(t);
    for (int32_t l = 0; with_kv && l < t->n_layers; l++) {
        if (t->layers[l].kind != LMH_STATE_KV) continue;
        if (snap_own(c, io, l)) {
            n += io->own_size(c, l, &s->layers[l]);
            continue;
        }
        int32_t first, rows;
        snap_held(&s->layers[l], &first, &rows);
        n += 8 + (uint64_t)rows * (io->k_row(c, l) + io->v_row(c, l));
    }
    return n;
}

/* Rows of positions [p0, p0 + n) of a layer, slot run by slot run (a ring wraps). */
static inline int snap_rows(lmh_cache *c, const seq_kv_io *io, const lmh_layer_state *st,
                            kv_layer *kv, int32_t l, int32_t p0, int32_t n, uint8_t *kb,
                            uint8_t *vb, int save) {
    const uint64_t kr = io->k_row(c, l), vr = io->v_row(c, l);
    for (int32_t i = 0; i < n;) {
        int32_t slot = kv_slot(st, kv, p0 + i), run = n - i;
        if (st->window > 0 && run > kv->cap - slot) run = kv->cap - slot;
        int rc = io->rows(c, l, kv, slot, run, kb + (uint64_t)i * kr, vb + (uint64_t)i * vr, save);
        if (rc != LMH_OK) return rc;
        i += run;
    }
    return LMH_OK;
}

/* lmh_cache_api.state_save */
static inline int snap_save(lmh_cache *c, const seq_kv_io *io, const lmh_backend_api *be,
                            lmh_backend *bk, kv_seqs *t, uint64_t id, int with_kv, void *dst,
                            uint64_t n, uint64_t *held) {
    kv_seq *s = kv_find(t, id);
    if (!s || n != snap_size(c, io, t, id, with_kv)) return LMH_EINVAL;
    int32_t len = kv_seq_len(t, id);
    uint8_t *o = (uint8_t *)dst + SNAP_HEADER;
    for (int32_t l = 0; l < t->n_layers; l++) {
        kv_layer *kv = &s->layers[l];
        if (t->rec && t->rec[l].n_bufs) {
            if (kv->st_stale) return LMH_EINVAL;        /* trimmed back: nothing sound to save */
            int rc = rec_ready(be, bk, t, kv, l, held); /* a layer not run yet holds zeros */
            for (int32_t b = 0; rc == LMH_OK && b < t->rec[l].n_bufs; b++) {
                uint64_t bytes = rec_buf_bytes(&t->rec[l].buf[b]);
                rc = be->download(bk, kv->st[b], 0, o, (size_t)bytes);
                o += bytes;
            }
            if (rc != LMH_OK) return rc;
        }
        if (!with_kv || t->layers[l].kind != LMH_STATE_KV) continue;
        if (snap_own(c, io, l)) {
            uint64_t bytes = io->own_size(c, l, kv);
            int rc = io->own_save(c, l, kv, o);
            if (rc != LMH_OK) return rc;
            o += bytes;
            continue;
        }
        int32_t first, rows;
        snap_held(kv, &first, &rows);
        memcpy(o, &first, 4);
        memcpy(o + 4, &rows, 4);
        o += 8;
        uint8_t *kb = o, *vb = o + (uint64_t)rows * io->k_row(c, l);
        int rc = rows ? snap_rows(c, io, &t->layers[l], kv, l, first, rows, kb, vb, 1) : LMH_OK;
        if (rc != LMH_OK) return rc;
        o = vb + (uint64_t)rows * io->v_row(c, l);
    }
    uint32_t h[4] = {REC_MAGIC, REC_VERSION, (uint32_t)(with_kv != 0), (uint32_t)len};
    memcpy(dst, h, sizeof h);
    return LMH_OK;
}

/* Checks a snapshot's layout against this cache's layers and, without K/V rows, that the
 * sequence still holds the rows below its length; sets *len and *with_kv. */
static inline int snap_check(lmh_cache *c, const seq_kv_io *io, const kv_seqs *t, const kv_seq *s,
                             const uint8_t *src, uint64_t n, int32_t *len, int *with_kv) {
    uint32_t h[4];
    if (n < SNAP_HEADER) return LMH_EINVAL;
    memcpy(h, src, sizeof h);
    if (h[0] != REC_MAGIC || h[1] != REC_VERSION || h[2] > 1 || h[3] > INT32_MAX) return LMH_EINVAL;
    *with_kv = (int)h[2];
    *len = (int32_t)h[3];
    uint64_t o = SNAP_HEADER;
    for (int32_t l = 0; l < t->n_layers; l++) {
        o += t->rec ? rec_layer_bytes(t, l) : 0;
        if (t->layers[l].kind != LMH_STATE_KV) continue;
        if (!*with_kv) {
            const kv_layer *kv = &s->layers[l];
            if (kv->pos < *len) return LMH_EINVAL;
            if (!kv_can_trim(&t->layers[l], kv, *len)) return LMH_EUNSUPPORTED;
            continue;
        }
        if (snap_own(c, io, l)) {
            uint64_t used = 0;
            if (o > n || io->own_check(c, l, src + o, n - o, *len, &used) != LMH_OK)
                return LMH_EINVAL;
            o += used;
            continue;
        }
        int32_t first, rows;
        if (o + 8 > n) return LMH_EINVAL;
        memcpy(&first, src + o, 4);
        memcpy(&rows, src + o + 4, 4);
        if (first < 0 || rows < 0 || (int64_t)first + rows != *len ||
            (t->layers[l].window == 0 && first != 0))
            return LMH_EINVAL;
        o += 8 + (uint64_t)rows * (io->k_row(c, l) + io->v_row(c, l));
    }
    return o == n ? LMH_OK : LMH_EINVAL;
}

/* lmh_cache_api.state_load */
static inline int snap_load(lmh_cache *c, const seq_kv_io *io, const lmh_backend_api *be,
                            lmh_backend *bk, kv_seqs *t, uint64_t id, const void *src, uint64_t n,
                            uint64_t *held) {
    kv_seq *s = kv_find(t, id);
    int32_t len;
    int with_kv;
    if (!s) return LMH_EINVAL;
    int rc = snap_check(c, io, t, s, (const uint8_t *)src, n, &len, &with_kv);
    if (rc != LMH_OK) return rc;
    const uint8_t *p = (const uint8_t *)src + SNAP_HEADER;
    for (int32_t l = 0; l < t->n_layers && rc == LMH_OK; l++) {
        kv_layer *kv = &s->layers[l];
        for (int32_t b = 0; t->rec && b < t->rec[l].n_bufs && rc == LMH_OK; b++) {
            const lmh_state_buf *sb = &t->rec[l].buf[b];
            if (!kv->st[b]) {
                if (!(kv->st[b] = be->tensor_new(bk, LMH_F32, sb->ndim, sb->ne, 0))) {
                    rc = LMH_ENOMEM;
                    break;
                }
                *held += rec_buf_bytes(sb);
            }
            rc = be->upload(bk, kv->st[b], 0, p, (size_t)rec_buf_bytes(sb));
            p += rec_buf_bytes(sb);
        }
        if (rc != LMH_OK || !with_kv || t->layers[l].kind != LMH_STATE_KV) continue;
        if (snap_own(c, io, l)) { /* checked whole by snap_check */
            uint64_t used = 0;
            rc = io->own_check(c, l, p, n - (uint64_t)(p - (const uint8_t *)src), len, &used);
            if (rc == LMH_OK) rc = io->own_load(c, l, kv, p, len);
            p += used;
            continue;
        }
        const lmh_layer_state *st = &t->layers[l];
        int32_t first, rows;
        memcpy(&first, p, 4);
        memcpy(&rows, p + 4, 4);
        p += 8;
        /* storage for the rows, laid out as appends would have left them */
        int32_t cap =
            st->window > 0 ? (rows > st->window ? rows : st->window) : (rows > 16 ? rows : 16);
        if (!kv->k || kv->cap < cap) rc = io->alloc(c, l, kv, cap);
        kv->pos = len;
        if (rc == LMH_OK && rows)
            rc = snap_rows(c, io, st, kv, l, first, rows, (uint8_t *)p,
                           (uint8_t *)p + (uint64_t)rows * io->k_row(c, l), 0);
        p += (uint64_t)rows * (io->k_row(c, l) + io->v_row(c, l));
    }
    /* all or nothing: a failed load leaves the sequence unusable, not half restored */
    for (int32_t l = 0; l < t->n_layers; l++) {
        kv_layer *kv = &s->layers[l];
        for (int32_t b = 0; t->rec && b < t->rec[l].n_bufs; b++) kv->st_pos[b] = len;
        int has_rec = t->rec && t->rec[l].n_bufs;
        kv->st_stale = has_rec && rc != LMH_OK && len > 0;
        kv->st_zero = has_rec && rc != LMH_OK && len == 0;
        if (t->layers[l].kind == LMH_STATE_KV) {
            if (rc != LMH_OK && with_kv) kv->pos = 0;
            if (kv->pos > len) kv->pos = len;
        }
    }
    return rc;
}

#endif
