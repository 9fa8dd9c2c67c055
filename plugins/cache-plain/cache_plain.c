/* The plain cache plugin: keys and values stored as they are computed, in f32 or f16,
 * one [capacity, kv_heads, head_dim] tensor per sequence and layer on the backend, in the
 * rows kv_seqs.h places them (every position, or a ring for a sliding window). Attention
 * runs as the backend's own attention op, which knows both layouts. Recurrent state and
 * snapshots as seq_state.h keeps them. */
#include "lmhost/lmhost.h"
#include "kv_copy.h"
#include "kv_seqs.h"
#include "seq_state.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef kv_layer layer_kv;
typedef kv_seq seq;

struct lmh_cache {
    const lmh_backend_api *be;
    lmh_backend *b;
    lmh_dtype dtype;
    int32_t n_layers;
    lmh_layer_state *layers;
    lmh_recurrent_state *rec; /* NULL: no layer keeps recurrent state */
    int32_t max_len;
    kv_seqs t;
    uint64_t bytes;
    uint64_t read;       /* bytes_read() */
    uint32_t host_minor; /* the host's ABI minor: attention sinks from 1.10 on */
};

static const char *const formats[] = {"f32", "f16", NULL};

static uint64_t layer_bytes(const lmh_cache *c, int32_t l, int32_t cap) {
    const lmh_layer_state *s = &c->layers[l];
    return (uint64_t)cap * (uint64_t)s->n_kv_heads * (uint64_t)(s->head_dim_k + s->head_dim_v) *
           lmh_dtype_size(c->dtype);
}

/* A position's bytes in layer l: [kv_heads, head_dim] as stored. */
static uint64_t k_row_bytes(const lmh_cache *c, int32_t l) {
    return (uint64_t)c->layers[l].n_kv_heads * (uint64_t)c->layers[l].head_dim_k *
           lmh_dtype_size(c->dtype);
}

static uint64_t v_row_bytes(const lmh_cache *c, int32_t l) {
    return (uint64_t)c->layers[l].n_kv_heads * (uint64_t)c->layers[l].head_dim_v *
           lmh_dtype_size(c->dtype);
}

static int create(const lmh_host_api *host, const lmh_backend_api *be, lmh_backend *b,
                  const lmh_cache_config *cfg, lmh_cache **out, char *err, size_t err_len) {
    lmh_dtype dt = LMH_F32;
    if (cfg->format && strcmp(cfg->format, "f16") == 0)
        dt = LMH_F16;
    else if (cfg->format && strcmp(cfg->format, "f32") != 0) {
        snprintf(err, err_len, "format '%s' is not one of f32, f16", cfg->format);
        return LMH_EINVAL;
    }
    /* (ABI 1.8) settings: the plain formats have none; read only where the host's struct has
     * the field */
    if (cfg->size >= offsetof(lmh_cache_config, options) + sizeof cfg->options && cfg->options &&
        *cfg->options) {
        snprintf(err, err_len, "format %s takes no settings (got '%s')",
                 dt == LMH_F16 ? "f16" : "f32", cfg->options);
        return LMH_EINVAL;
    }
    lmh_cache *c = calloc(1, sizeof *c);
    if (!c) return LMH_ENOMEM;
    int rc = rec_config(cfg, &c->rec, err, err_len);
    c->layers = calloc((size_t)cfg->n_layers, sizeof *c->layers);
    if (rc != LMH_OK || !c->layers) {
        free(c->rec);
        free(c->layers);
        free(c);
        return rc != LMH_OK ? rc : LMH_ENOMEM;
    }
    memcpy(c->layers, cfg->layers, (size_t)cfg->n_layers * sizeof *c->layers);
    c->be = be;
    c->host_minor = host ? host->abi_minor : 0;
    c->b = b;
    c->dtype = dt;
    c->n_layers = cfg->n_layers;
    c->max_len = cfg->max_seq_len;
    kv_seqs_init(&c->t, c->layers, c->rec, c->n_layers);
    *out = c;
    return LMH_OK;
}

static void free_seq(lmh_cache *c, seq *s) {
    for (int32_t l = 0; l < c->n_layers; l++) {
        layer_kv *kv = &s->layers[l];
        if (kv->k) c->be->tensor_free(c->b, kv->k);
        if (kv->v) c->be->tensor_free(c->b, kv->v);
        c->bytes -= kv->k ? layer_bytes(c, l, kv->cap) : 0;
        c->bytes -= rec_free_layer(c->be, c->b, &c->t, kv, l);
    }
}

static void destroy(lmh_cache *c) {
    if (!c) return;
    while (c->t.n) {
        free_seq(c, &c->t.seqs[0]);
        kv_seq_drop(&c->t, &c->t.seqs[0]);
    }
    free(c->t.seqs);
    free(c->layers);
    free(c->rec);
    free(c);
}

static int seq_add(lmh_cache *c, uint64_t id) {
    return kv_seq_add(&c->t, id);
}

static void seq_remove(lmh_cache *c, uint64_t id) {
    seq *s = kv_find(&c->t, id);
    if (!s) return;
    free_seq(c, s);
    kv_seq_drop(&c->t, s);
}

static int32_t seq_len(lmh_cache *c, uint64_t id) {
    return kv_seq_len(&c->t, id);
}

static int seq_trim(lmh_cache *c, uint64_t id, int32_t len) {
    return kv_seq_trim(&c->t, id, len);
}

/* Copies rows [from, from + n) of src into rows [at, at + n) of dst (converting the
 * dtype where they differ). */
static int copy_rows(lmh_cache *c, lmh_tensor *dst, int32_t at, lmh_tensor *src, int32_t from,
                     int32_t n) {
    return kv_copy_rows(c->be, c->b, dst, at, src, from, n);
}

/* Reallocates (seq, layer) to `cap` rows and moves the positions still needed there. */
static int grow(lmh_cache *c, int32_t l, layer_kv *kv, int32_t cap) {
    const lmh_layer_state *st = &c->layers[l];
    int64_t kne[3] = {cap, st->n_kv_heads, st->head_dim_k};
    int64_t vne[3] = {cap, st->n_kv_heads, st->head_dim_v};
    lmh_tensor *k = c->be->tensor_new(c->b, c->dtype, 3, kne, 0);
    lmh_tensor *v = c->be->tensor_new(c->b, c->dtype, 3, vne, 0);
    if (!k || !v) {
        if (k) c->be->tensor_free(c->b, k);
        if (v) c->be->tensor_free(c->b, v);
        return LMH_ENOMEM;
    }
    int rc = LMH_OK;
    if (kv->k) {
        rc = kv_keep(c, copy_rows, st, kv, k, v, cap);
        c->be->tensor_free(c->b, kv->k);
        c->be->tensor_free(c->b, kv->v);
        c->bytes -= layer_bytes(c, l, kv->cap);
    }
    kv->k = k;
    kv->v = v;
    kv->cap = cap;
    c->bytes += layer_bytes(c, l, cap);
    return rc;
}

static int append(lmh_cache *c, uint64_t id, int32_t l, lmh_tensor *k, lmh_tensor *v) {
    seq *s = kv_find(&c->t, id);
    if (!s || l < 0 || l >= c->n_layers || c->layers[l].kind != LMH_STATE_KV) return LMH_EINVAL;
    const lmh_layer_state *st = &c->layers[l];
    if (k->ndim != 3 || v->ndim != 3 || k->ne[0] != v->ne[0] || k->ne[1] != st->n_kv_heads ||
        v->ne[1] != st->n_kv_heads || k->ne[2] != st->head_dim_k || v->ne[2] != st->head_dim_v)
        return LMH_ESHAPE;
    layer_kv *kv = &s->layers[l];
    int32_t n = (int32_t)k->ne[0];
    if (c->max_len > 0 && kv->pos + n > c->max_len) return LMH_ENOMEM;
    int32_t cap = kv_capacity_for(st, kv, n, c->max_len);
    int rc = cap ? grow(c, l, kv, cap) : LMH_OK;
    if (st->window > 0) { /* from the ring's row for pos on, wrapping to row 0 */
        int32_t s0 = kv->pos % kv->cap, first = kv->cap - s0 < n ? kv->cap - s0 : n;
        if (rc == LMH_OK) rc = copy_rows(c, kv->k, s0, k, 0, first);
        if (rc == LMH_OK) rc = copy_rows(c, kv->v, s0, v, 0, first);
        if (rc == LMH_OK) rc = copy_rows(c, kv->k, 0, k, first, n - first);
        if (rc == LMH_OK) rc = copy_rows(c, kv->v, 0, v, first, n - first);
    } else {
        if (rc == LMH_OK) rc = copy_rows(c, kv->k, kv->pos, k, 0, n);
        if (rc == LMH_OK) rc = copy_rows(c, kv->v, kv->pos, v, 0, n);
    }
    if (rc == LMH_OK) kv->pos += n;
    return rc;
}

/* Whether t is f32 [n, heads, hd]: what read_rows writes. */
static int f32_rows(const lmh_tensor *t, int32_t n, int32_t heads, int32_t hd) {
    return t && t->dtype == LMH_F32 && t->ndim == 3 && t->ne[0] == n && t->ne[1] == heads &&
           t->ne[2] == hd;
}

static int read_rows(lmh_cache *c, uint64_t id, int32_t l, int32_t first, int32_t n, lmh_tensor *k,
                     lmh_tensor *v) {
    seq *s = kv_find(&c->t, id);
    if (!s || l < 0 || l >= c->n_layers || c->layers[l].kind != LMH_STATE_KV) return LMH_EINVAL;
    const lmh_layer_state *st = &c->layers[l];
    layer_kv *kv = &s->layers[l];
    if (!kv_holds(kv, first, n)) return LMH_EINVAL;
    if (n == 0) return LMH_OK;
    if (!f32_rows(k, n, st->n_kv_heads, st->head_dim_k) ||
        !f32_rows(v, n, st->n_kv_heads, st->head_dim_v))
        return LMH_ESHAPE;
    /* the COPY op converts f16 to f32; a ring's slots wrap at most once (n <= cap) */
    int32_t s0 = kv_slot(st, kv, first), run = kv->cap - s0 < n ? kv->cap - s0 : n;
    int rc = copy_rows(c, k, 0, kv->k, s0, run);
    if (rc == LMH_OK) rc = copy_rows(c, v, 0, kv->v, s0, run);
    if (rc == LMH_OK) rc = copy_rows(c, k, run, kv->k, 0, n - run);
    if (rc == LMH_OK) rc = copy_rows(c, v, run, kv->v, 0, n - run);
    return rc;
}

static void row_bytes(lmh_cache *c, int32_t l, uint64_t *k, uint64_t *v) {
    int kv = l >= 0 && l < c->n_layers && c->layers[l].kind == LMH_STATE_KV;
    if (k) *k = kv ? k_row_bytes(c, l) : 0;
    if (v) *v = kv ? v_row_bytes(c, l) : 0;
}

static int attend(lmh_cache *c, uint64_t id, int32_t l, lmh_tensor *q, lmh_tensor *q_pos,
                  lmh_tensor *out, const lmh_attn_params *p) {
    seq *s = kv_find(&c->t, id);
    if (!s || l < 0 || l >= c->n_layers || !s->layers[l].k) return LMH_EINVAL;
    layer_kv *kv = &s->layers[l];
    lmh_op op = {.code = LMH_OP_ATTENTION, .dst = out, .src = {q, kv->k, kv->v, q_pos}};
    op.p.i[0] = kv_rows_held(kv);
    op.p.i[1] = 0;
    op.p.i[2] = p->window;
    op.p.i[3] = c->layers[l].window > 0 ? kv->cap : 0;
    op.p.i[4] = kv->pos;
    op.p.f[0] = p->scale;
    op.p.f[1] = p->softcap;
    /* (ABI 1.10) a host built earlier passes params without sinks */
    lmh_tensor *sinks = c->host_minor >= 10 ? p->sinks : NULL;
    if (sinks) {
        op.p.i[5] = LMH_ATTN_SINKS;
        op.src_more[0] = sinks;
    }
    int rc = c->be->enqueue(c->b, &op);
    if (rc == LMH_OK) c->read += layer_bytes(c, l, kv_rows_seen(kv, (int32_t)q->ne[0], p->window));
    return rc;
}

static uint64_t bytes(lmh_cache *c) {
    return c->bytes;
}

static uint64_t seq_bytes(lmh_cache *c, uint64_t id) {
    seq *s = kv_find(&c->t, id);
    uint64_t n = 0;
    if (s)
        for (int32_t l = 0; l < c->n_layers; l++) {
            if (s->layers[l].k) n += layer_bytes(c, l, s->layers[l].cap);
            n += rec_layer_held(&c->t, &s->layers[l], l);
        }
    return n;
}

static uint64_t bytes_read(lmh_cache *c) {
    return c->read;
}

static int32_t layer_rows(lmh_cache *c, uint64_t id, int32_t l) {
    return kv_layer_rows(&c->t, id, l);
}

static int recur(lmh_cache *c, uint64_t id, int32_t l, int32_t buf, const lmh_op *op) {
    return rec_recur(c->be, c->b, &c->t, id, l, buf, op, &c->bytes, &c->read);
}

/* ---- snapshots (seq_state.h): a row is [kv_heads, head_dim] as stored ---- */

static uint64_t k_row(lmh_cache *c, int32_t l) {
    return k_row_bytes(c, l);
}

static uint64_t v_row(lmh_cache *c, int32_t l) {
    return v_row_bytes(c, l);
}

static int rows_io(lmh_cache *c, int32_t l, layer_kv *kv, int32_t slot, int32_t n, void *kb,
                   void *vb, int save) {
    size_t ko = (size_t)slot * k_row(c, l), vo = (size_t)slot * v_row(c, l);
    size_t kn = (size_t)n * k_row(c, l), vn = (size_t)n * v_row(c, l);
    int rc =
        save ? c->be->download(c->b, kv->k, ko, kb, kn) : c->be->upload(c->b, kv->k, ko, kb, kn);
    if (rc == LMH_OK)
        rc = save ? c->be->download(c->b, kv->v, vo, vb, vn)
                  : c->be->upload(c->b, kv->v, vo, vb, vn);
    return rc;
}

static const seq_kv_io kv_io = {.k_row = k_row, .v_row = v_row, .alloc = grow, .rows = rows_io};

static uint64_t state_size(lmh_cache *c, uint64_t id, int with_kv) {
    return snap_size(c, &kv_io, &c->t, id, with_kv);
}

static int state_save(lmh_cache *c, uint64_t id, int with_kv, void *dst, uint64_t n) {
    return snap_save(c, &kv_io, c->be, c->b, &c->t, id, with_kv, dst, n, &c->bytes);
}

static int state_load(lmh_cache *c, uint64_t id, const void *src, uint64_t n) {
    return snap_load(c, &kv_io, c->be, c->b, &c->t, id, src, n, &c->bytes);
}

static const lmh_cache_api api = {
    .size = sizeof(lmh_cache_api),
    .formats = formats,
    .create = create,
    .destroy = destroy,
    .seq_add = seq_add,
    .seq_remove = seq_remove,
    .seq_trim = seq_trim,
    .seq_len = seq_len,
    .append = append,
    .attend = attend,
    .bytes = bytes,
    .seq_bytes = seq_bytes,
    .layer_rows = layer_rows,
    .bytes_read = bytes_read,
    .recur = recur,
    .state_size = state_size,
    .state_save = state_save,
    .state_load = state_load,
    .read_rows = read_rows,
    .row_bytes = row_bytes,
};

static const lmh_plugin_info info = {
    LMH_PLUGIN_HEADER,
    .kind = LMH_KIND_CACHE,
    .name = "plain",
    .version = "0.1.0",
    .summary = "keys and values as computed, f32 or f16, per sequence and layer",
    .init = NULL,
    .api = &api,
};

LMH_EXPORT const lmh_plugin_info *lmhost_plugin_entry(void) {
    return &info;
}
