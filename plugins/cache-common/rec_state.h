/* Recurrent state as the cache plugins keep it (header only, like kv_seqs.h): one f32
 * tensor a sequence, layer and buffer on the cache's backend, made and zeroed at its first
 * use, handed to the recurrent ops in their state operand (lmh_cache_api.recur). It is
 * kept in f32 by every format: it is read and rewritten whole at every step, so a rounded
 * format's error would compound along the sequence rather than stay put as a K/V row's.
 *
 * A snapshot (state_save / state_load) is a header of four u32 words (magic, version,
 * buffers, f32 values) and then every buffer's values, layers in order and a layer's
 * buffers in order: the same bytes from any backend. */
#ifndef LMHOST_CACHE_REC_STATE_H
#define LMHOST_CACHE_REC_STATE_H

#include "kv_seqs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REC_MAGIC 0x53484d4cu /* "LMHS" */
#define REC_VERSION 1u
#define REC_HEADER 16u

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
                snprintf(err, err_len, "layer %d: recurrent state buffer %d is not an f32 tensor "
                         "of 1 to 4 positive dimensions under 2^31 elements", l, b);
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

/* Bytes of one sequence's recurrent state, all layers. */
static inline uint64_t rec_seq_bytes(const kv_seqs *t) {
    uint64_t n = 0;
    for (int32_t l = 0; t->rec && l < t->n_layers; l++)
        for (int32_t b = 0; b < t->rec[l].n_bufs; b++) n += rec_buf_bytes(&t->rec[l].buf[b]);
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
static inline uint64_t rec_free_layer(const lmh_backend_api *be, lmh_backend *bk,
                                      const kv_seqs *t, kv_layer *kv, int32_t l) {
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

/* lmh_cache_api.state_size */
static inline uint64_t rec_state_size(const kv_seqs *t) {
    return t->rec ? REC_HEADER + rec_seq_bytes(t) : 0;
}

/* lmh_cache_api.state_save */
static inline int rec_save(const lmh_backend_api *be, lmh_backend *bk, kv_seqs *t, uint64_t id,
                           void *dst, uint64_t n, uint64_t *held) {
    kv_seq *s = kv_find(t, id);
    if (!s || !t->rec || n != rec_state_size(t)) return LMH_EINVAL;
    uint8_t *o = (uint8_t *)dst + REC_HEADER;
    uint32_t nb = 0;
    for (int32_t l = 0; l < t->n_layers; l++) {
        kv_layer *kv = &s->layers[l];
        if (!t->rec[l].n_bufs) continue;
        if (kv->st_stale) return LMH_EINVAL;
        int rc = rec_ready(be, bk, t, kv, l, held); /* a layer not run yet holds zeros */
        for (int32_t b = 0; rc == LMH_OK && b < t->rec[l].n_bufs; b++, nb++) {
            uint64_t bytes = rec_buf_bytes(&t->rec[l].buf[b]);
            rc = be->download(bk, kv->st[b], 0, o, (size_t)bytes);
            o += bytes;
        }
        if (rc != LMH_OK) return rc;
    }
    uint32_t h[4] = {REC_MAGIC, REC_VERSION, nb, (uint32_t)((n - REC_HEADER) / sizeof(float))};
    memcpy(dst, h, sizeof h);
    return LMH_OK;
}

/* lmh_cache_api.state_load */
static inline int rec_load(const lmh_backend_api *be, lmh_backend *bk, kv_seqs *t, uint64_t id,
                           int32_t len, const void *src, uint64_t n, uint64_t *held) {
    kv_seq *s = kv_find(t, id);
    if (!s || !t->rec || len < 0 || n != rec_state_size(t)) return LMH_EINVAL;
    uint32_t h[4], nb = 0;
    memcpy(h, src, sizeof h);
    for (int32_t l = 0; l < t->n_layers; l++) nb += (uint32_t)t->rec[l].n_bufs;
    if (h[0] != REC_MAGIC || h[1] != REC_VERSION || h[2] != nb ||
        (uint64_t)h[3] * sizeof(float) != n - REC_HEADER)
        return LMH_EINVAL;
    /* attention layers must hold every row below len, and can give up the rest */
    for (int32_t l = 0; l < t->n_layers; l++) {
        const kv_layer *kv = &s->layers[l];
        if (t->layers[l].kind != LMH_STATE_KV) continue;
        if (kv->pos < len) return LMH_EINVAL;
        if (t->layers[l].window > 0 && len > 0 && len < kv->pos && kv->pos > kv->cap)
            return LMH_EUNSUPPORTED;
    }
    const uint8_t *p = (const uint8_t *)src + REC_HEADER;
    int rc = LMH_OK;
    for (int32_t l = 0; l < t->n_layers && rc == LMH_OK; l++) {
        kv_layer *kv = &s->layers[l];
        for (int32_t b = 0; b < t->rec[l].n_bufs && rc == LMH_OK; b++) {
            const lmh_state_buf *sb = &t->rec[l].buf[b];
            if (!kv->st[b]) {
                kv->st[b] = be->tensor_new(bk, LMH_F32, sb->ndim, sb->ne, 0);
                if (!kv->st[b]) {
                    rc = LMH_ENOMEM;
                    break;
                }
                *held += rec_buf_bytes(sb);
            }
            rc = be->upload(bk, kv->st[b], 0, p, (size_t)rec_buf_bytes(sb));
            p += rec_buf_bytes(sb);
        }
    }
    /* all or nothing: a failed load leaves the state unusable, not half of it restored */
    for (int32_t l = 0; l < t->n_layers; l++) {
        kv_layer *kv = &s->layers[l];
        for (int32_t b = 0; b < t->rec[l].n_bufs; b++) kv->st_pos[b] = len;
        if (t->rec[l].n_bufs) kv->st_stale = rc != LMH_OK && len > 0;
        kv->st_zero = rc != LMH_OK && len == 0 && t->rec[l].n_bufs;
        if (rc == LMH_OK && t->layers[l].kind == LMH_STATE_KV && kv->pos > len) kv->pos = len;
    }
    return rc;
}

#endif
