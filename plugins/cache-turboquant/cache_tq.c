/* The TurboQuant cache plugin (specs/turboquant.md): keys and values of a head stored per
 * block of 128 values (64 for heads of 64) as Lloyd-Max codes of the block's randomly
 * rotated direction and fp16 norms. Formats:
 *   tq3: keys 3-bit codes + 1-bit QJL signs of the residual + |k| + |residual| (68 bytes a
 *        block of 128: 4.25 bits a value), values 3-bit codes + corrected norm (50 bytes:
 *        3.125 bits); K+V 4.34x smaller than f16;
 *   tq4: 4-bit codes and a corrected norm for both (keys 68 bytes with 2 spare, values 66).
 * Settings (--cache tq3,key=value,...): hot=256 start=2048 step=256 (the newest `hot` rows
 * stay f16; nothing is compressed until a sequence is longer than `start`; then every
 * `step` rows past the hot window are encoded together) and qjl=on|off (off: attention
 * reads tq3's keys without the QJL term, for A/B runs). Defaults are the spec's (§13).
 *
 * Decode attention runs on the codes (tq_kernels.h): the query is rotated once, scored
 * against the centroids of each row's codes, values summed in the rotated basis and rotated
 * back once a chunk; nothing is decompressed. Prefill (several query rows) decodes the
 * stored rows into f32 and runs the backend's attention op, as the group-quantized cache
 * does. Layers the codes do not fit (head sizes other than 64 or multiples of 128, and
 * sliding-window layers, whose memory the window bounds already) keep plain f16 rows. */
#include "lmhost/lmhost.h"
#include "kv_copy.h"
#include "kv_seqs.h"
#include "seq_state.h"
#include "tq_kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef HAVE_SPIRV
#include "spv_tq_attend.h"
#include "spv_tq_attend4.h"
#include "spv_tq_decode.h"
#include "spv_tq_encode.h"
#include "spv_tq_merge.h"
#include "spv_tq_move.h"
#define SPIRV(n) .spirv = spv_##n, .spirv_bytes = sizeof spv_##n
#else
#define SPIRV(n) .spirv = NULL
#endif

/* Decode attention's two builds (the same function on a CPU): query heads 8 at a time, or 4
 * where a K/V head has no more (fewer registers); added when first used (attend_ready). */
enum { K_ENCODE, K_DECODE, K_MOVE, K_MERGE, K_ATTEND, K_ATTEND4, K_COUNT };
static const lmh_kernel_desc kernel_descs[K_COUNT] = {
    {sizeof(lmh_kernel_desc), "cache-tq encode", tq_encode_cpu, SPIRV(tq_encode)},
    {sizeof(lmh_kernel_desc), "cache-tq decode", tq_decode_cpu, SPIRV(tq_decode)},
    {sizeof(lmh_kernel_desc), "cache-tq move", tq_move_cpu, SPIRV(tq_move)},
    {sizeof(lmh_kernel_desc), "cache-tq attend_merge", tq_merge_cpu, SPIRV(tq_merge)},
    {sizeof(lmh_kernel_desc), "cache-tq attend", tq_attend_cpu, SPIRV(tq_attend)},
    {sizeof(lmh_kernel_desc), "cache-tq attend4", tq_attend_cpu, SPIRV(tq_attend4)},
};

enum {
    ATT_MAXCH = 1024, /* chunks of one decode attention, at most (the merge's) */
    COLD_MIN = 64,    /* rows of a compressed store when first made */
};

typedef kv_layer layer_kv;
typedef kv_seq seq;

struct lmh_cache {
    const lmh_host_api *host;
    const lmh_backend_api *be;
    lmh_backend *b;
    lmh_kernel *kern[K_COUNT];
    uint8_t refused[K_COUNT]; /* attend builds the backend refused (attend_ready) */
    int32_t bits;
    int qjl;                  /* tq3: keys carry QJL signs */
    int use_qjl;              /* and attention counts them (qjl=on) */
    int32_t hot, start, step; /* the hot window's policy */
    int32_t n_layers;
    lmh_layer_state *layers;
    lmh_recurrent_state *rec;
    tq_side *ks, *vs; /* per layer; m == 0: the layer keeps f16 rows */
    int32_t max_len;
    kv_seqs t;
    uint64_t bytes, read;
    lmh_tensor *fk, *fv, *part; /* scratch shared by layers and sequences */
    size_t fk_floats, fv_floats, part_floats;
};

static const char *const formats[] = {"tq3", "tq4", NULL};

static int is_tq(const lmh_cache *c, int32_t l) {
    return c->ks[l].m > 0;
}

/* ---- settings ---- */

static int parse_int(const char *v, int32_t lo, int32_t hi, int32_t *out) {
    char *end;
    long x = strtol(v, &end, 10);
    if (end == v || *end || x < lo || x > hi) return -1;
    *out = (int32_t)x;
    return 0;
}

static int parse_options(lmh_cache *c, const char *opts, char *err, size_t err_len) {
    char buf[256];
    if (!opts || !*opts) return LMH_OK;
    if (strlen(opts) >= sizeof buf) {
        snprintf(err, err_len, "settings too long");
        return LMH_EINVAL;
    }
    strcpy(buf, opts);
    for (char *save = NULL, *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq) {
            snprintf(err, err_len, "setting '%s' is not key=value (keys: hot, start, step, qjl)",
                     kv);
            return LMH_EINVAL;
        }
        *eq = 0;
        const char *v = eq + 1;
        int bad = 0;
        if (strcmp(kv, "hot") == 0)
            bad = parse_int(v, 0, 1 << 20, &c->hot);
        else if (strcmp(kv, "start") == 0)
            bad = parse_int(v, 0, INT32_MAX, &c->start);
        else if (strcmp(kv, "step") == 0)
            bad = parse_int(v, 1, 1 << 20, &c->step);
        else if (strcmp(kv, "qjl") == 0) {
            if (strcmp(v, "on") == 0 && !c->qjl) {
                snprintf(err, err_len, "qjl=on: tq4 keys carry no QJL signs");
                return LMH_EINVAL;
            }
            bad = strcmp(v, "on") != 0 && strcmp(v, "off") != 0;
            c->use_qjl = c->qjl && strcmp(v, "on") == 0;
        } else {
            snprintf(err, err_len, "unknown setting '%s' (keys: hot, start, step, qjl)", kv);
            return LMH_EINVAL;
        }
        if (bad) {
            snprintf(err, err_len, "bad value '%s' for %s", v, kv);
            return LMH_EINVAL;
        }
    }
    return LMH_OK;
}

/* The codes' geometry for a head of hd values; m 0 where they do not fit. */
static tq_side make_side(int32_t hd, int32_t bits, int qjl) {
    tq_side s = {.hd = hd, .m = tq_block(hd)};
    if (!s.m || hd > TQ_ATT_D) return (tq_side){.hd = hd};
    s.nb = hd / s.m;
    s.cw = bits * s.m / 32;
    s.sw = qjl ? s.m / 32 : 0;
    s.kw = s.cw + s.sw + 1;
    return s;
}

/* Bytes one position takes in layer l: keys, values (all K/V heads). */
static void row_bytes(lmh_cache *c, int32_t l, uint64_t *k, uint64_t *v) {
    const lmh_layer_state *st = &c->layers[l];
    *k = *v = 0;
    if (l < 0 || l >= c->n_layers || st->kind != LMH_STATE_KV) return;
    uint64_t h = (uint64_t)st->n_kv_heads;
    if (!is_tq(c, l)) {
        *k = h * (uint64_t)st->head_dim_k * 2;
        *v = h * (uint64_t)st->head_dim_v * 2;
        return;
    }
    *k = h * (uint64_t)c->ks[l].nb * (uint64_t)c->ks[l].kw * 4;
    *v = h * (uint64_t)c->vs[l].nb * ((uint64_t)c->vs[l].cw * 4 + 2);
}

static uint64_t f16_row(const lmh_cache *c, int32_t l) {
    const lmh_layer_state *st = &c->layers[l];
    return (uint64_t)st->n_kv_heads * (uint64_t)(st->head_dim_k + st->head_dim_v) * 2;
}

/* Bytes (seq, layer) holds: its f16 rows (all, or the hot ring) and its compressed store */
static uint64_t layer_held(lmh_cache *c, int32_t l, const layer_kv *kv) {
    uint64_t n = kv->k ? (uint64_t)kv->cap * f16_row(c, l) : 0, k, v;
    if (kv->ck) {
        row_bytes(c, l, &k, &v);
        n += (uint64_t)kv->ccap * (k + v);
    }
    return n;
}

static int create(const lmh_host_api *host, const lmh_backend_api *be, lmh_backend *b,
                  const lmh_cache_config *cfg, lmh_cache **out, char *err, size_t err_len) {
    int32_t bits = 3;
    if (cfg->format && strcmp(cfg->format, "tq4") == 0)
        bits = 4;
    else if (cfg->format && strcmp(cfg->format, "tq3") != 0) {
        snprintf(err, err_len, "format '%s' is not one of tq3, tq4", cfg->format);
        return LMH_EINVAL;
    }
    if (be->size < offsetof(lmh_backend_api, kernel_run) + sizeof be->kernel_run ||
        !be->kernel_add || !be->kernel_run) {
        snprintf(err, err_len, "the backend runs no plugin kernels (plugin ABI 1.6)");
        return LMH_EUNSUPPORTED;
    }
    lmh_cache *c = calloc(1, sizeof *c);
    if (!c) return LMH_ENOMEM;
    c->bits = bits;
    c->qjl = c->use_qjl = bits == 3;
    c->hot = 256;
    c->start = 2048;
    c->step = 256;
    int has_opts = cfg->size >= offsetof(lmh_cache_config, options) + sizeof cfg->options;
    int rc = parse_options(c, has_opts ? cfg->options : NULL, err, err_len);
    if (rc == LMH_OK && cfg->size >= offsetof(lmh_cache_config, flags) + sizeof cfg->flags &&
        (cfg->flags & LMH_CACHE_SETTLED)) {
        c->hot = c->start = 0; /* every row encoded when appended */
        c->step = 1;
    }
    if (rc == LMH_OK) rc = rec_config(cfg, &c->rec, err, err_len);
    c->layers = calloc((size_t)cfg->n_layers + 1, sizeof *c->layers);
    c->ks = calloc((size_t)cfg->n_layers + 1, sizeof *c->ks);
    c->vs = calloc((size_t)cfg->n_layers + 1, sizeof *c->vs);
    if (rc != LMH_OK || !c->layers || !c->ks || !c->vs) goto fail;
    memcpy(c->layers, cfg->layers, (size_t)cfg->n_layers * sizeof *c->layers);
    c->host = host;
    c->be = be;
    c->b = b;
    c->n_layers = cfg->n_layers;
    c->max_len = cfg->max_seq_len;
    kv_seqs_init(&c->t, c->layers, c->rec, c->n_layers);
    int n_tq = 0, n_plain = 0, why_window = 0;
    int32_t odd = 0;
    for (int32_t l = 0; l < c->n_layers; l++) {
        const lmh_layer_state *st = &c->layers[l];
        if (st->kind != LMH_STATE_KV) continue;
        tq_side k = make_side(st->head_dim_k, bits, c->qjl), v = make_side(st->head_dim_v, bits, 0);
        if (st->window == 0 && k.m && v.m) {
            c->ks[l] = k;
            c->vs[l] = v;
            n_tq++;
        } else {
            n_plain++;
            why_window |= st->window > 0;
            if (!k.m) odd = st->head_dim_k;
            if (!v.m) odd = st->head_dim_v;
        }
    }
    if (n_plain && host && host->log) /* once a cache: the layers the codes do not take */
        host->log(LMH_LOG_INFO,
                  "cache turboquant: %d of %d attention layers keep f16 rows (%s%s%s)", n_plain,
                  n_plain + n_tq, odd ? "head sizes other than 64 or a multiple of 128" : "",
                  odd && why_window ? "; " : "", why_window ? "sliding-window layers" : "");
    for (int i = 0; i < K_ATTEND && rc == LMH_OK; i++)
        rc = be->kernel_add(b, &kernel_descs[i], &c->kern[i], err, err_len);
    if (rc != LMH_OK) goto fail;
    *out = c;
    return LMH_OK;
fail:
    free(c->rec);
    free(c->layers);
    free(c->ks);
    free(c->vs);
    free(c);
    return rc != LMH_OK ? rc : LMH_ENOMEM;
}

static void free_layer(lmh_cache *c, int32_t l, layer_kv *kv) {
    c->bytes -= layer_held(c, l, kv);
    lmh_tensor *ts[4] = {kv->k, kv->v, kv->ck, kv->cv};
    for (int i = 0; i < 4; i++)
        if (ts[i]) c->be->tensor_free(c->b, ts[i]);
    kv->k = kv->v = kv->ck = kv->cv = NULL;
    kv->cap = kv->ccap = 0;
}

static void free_seq(lmh_cache *c, seq *s) {
    for (int32_t l = 0; l < c->n_layers; l++) {
        free_layer(c, l, &s->layers[l]);
        c->bytes -= rec_free_layer(c->be, c->b, &c->t, &s->layers[l], l);
    }
}

static void destroy(lmh_cache *c) {
    if (!c) return;
    while (c->t.n) {
        free_seq(c, &c->t.seqs[0]);
        kv_seq_drop(&c->t, &c->t.seqs[0]);
    }
    lmh_tensor *ts[3] = {c->fk, c->fv, c->part};
    for (int i = 0; i < 3; i++)
        if (ts[i]) c->be->tensor_free(c->b, ts[i]);
    free(c->t.seqs);
    free(c->layers);
    free(c->rec);
    free(c->ks);
    free(c->vs);
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
    int rc = kv_seq_trim(&c->t, id, len);
    seq *s = kv_find(&c->t, id);
    if (rc == LMH_OK && s) /* records are per row: a shorter length drops the rows past it */
        for (int32_t l = 0; l < c->n_layers; l++)
            if (s->layers[l].cpos > len) s->layers[l].cpos = len;
    return rc;
}

/* ---- moving rows ---- */

/* Runs kernel k over `items` (params[0]), `per` a workgroup, with tensors t[0..n). */
static int run(lmh_cache *c, int k, lmh_tensor *const *t, int n, uint32_t writes, uint64_t items,
               uint32_t per, const uint32_t *params, int n_params) {
    if (items == 0) return LMH_OK;
    if (items > UINT32_MAX - TQ_WG) return LMH_EINVAL;
    lmh_kernel_call call = {.n_tensors = (uint32_t)n, .writes = writes};
    for (int i = 0; i < n; i++) call.t[i] = t[i];
    call.params[0] = (uint32_t)items;
    memcpy(call.params + 1, params, (size_t)n_params * 4);
    call.groups = (uint32_t)((items + per - 1) / per);
    return c->be->kernel_run(c->b, c->kern[k], &call);
}

/* Copies rows [from, from + n) of src into rows [at, at + n) of dst, f16 or f32 rows of
 * [kv_heads, hd] (converting where the dtypes differ), through the backend's copy op. */
static int copy_rows(lmh_cache *c, lmh_tensor *dst, int32_t at, lmh_tensor *src, int32_t from,
                     int32_t n) {
    return kv_copy_rows(c->be, c->b, dst, at, src, from, n);
}

/* Positions [p0, p0 + n) between a ring of rcap rows (position p in row p % rcap) and rows
 * [at, at + n) of flat storage, run by run: to_ring 1 copies flat -> ring. */
static int ring_rows(lmh_cache *c, lmh_tensor *ring, int32_t rcap, int32_t p0, lmh_tensor *flat,
                     int32_t at, int32_t n, int to_ring) {
    for (int32_t i = 0; i < n;) {
        int32_t slot = (p0 + i) % rcap, len = n - i < rcap - slot ? n - i : rcap - slot;
        int rc = to_ring ? copy_rows(c, ring, slot, flat, at + i, len)
                         : copy_rows(c, flat, at + i, ring, slot, len);
        if (rc != LMH_OK) return rc;
        i += len;
    }
    return LMH_OK;
}

/* A layer's f16 rows to `cap` rows, keeping those still needed: as the plain cache keeps
 * them (kv_keep) for a layer the codes do not take, or positions [cpos, pos) of the hot
 * ring (row p % cap) for one they do. */
static int f16_resize(lmh_cache *c, int32_t l, layer_kv *kv, int32_t cap) {
    const lmh_layer_state *st = &c->layers[l];
    int64_t kne[3] = {cap, st->n_kv_heads, st->head_dim_k};
    int64_t vne[3] = {cap, st->n_kv_heads, st->head_dim_v};
    lmh_tensor *k = c->be->tensor_new(c->b, LMH_F16, 3, kne, 0);
    lmh_tensor *v = c->be->tensor_new(c->b, LMH_F16, 3, vne, 0);
    if (!k || !v) {
        if (k) c->be->tensor_free(c->b, k);
        if (v) c->be->tensor_free(c->b, v);
        return LMH_ENOMEM;
    }
    int rc = LMH_OK;
    if (kv->k && !is_tq(c, l)) rc = kv_keep(c, copy_rows, st, kv, k, v, cap);
    for (int32_t p = kv->cpos; kv->k && is_tq(c, l) && p < kv->pos && rc == LMH_OK;) {
        int32_t so = p % kv->cap, sn = p % cap, n = kv->pos - p;
        if (n > kv->cap - so) n = kv->cap - so;
        if (n > cap - sn) n = cap - sn;
        rc = copy_rows(c, k, sn, kv->k, so, n);
        if (rc == LMH_OK) rc = copy_rows(c, v, sn, kv->v, so, n);
        p += n;
    }
    if (kv->k) {
        c->be->tensor_free(c->b, kv->k);
        c->be->tensor_free(c->b, kv->v);
        c->bytes -= (uint64_t)kv->cap * f16_row(c, l);
    }
    kv->k = k;
    kv->v = v;
    kv->cap = cap;
    c->bytes += (uint64_t)cap * f16_row(c, l);
    return rc;
}

/* Words of one plane [from, from + n) of every head between two stores (move kernel). */
static int move_plane(lmh_cache *c, lmh_tensor *dst, lmh_tensor *src, uint64_t n, uint64_t from,
                      uint64_t to, uint64_t src_head, uint64_t dst_head, uint32_t heads) {
    if ((heads - 1) * (dst_head > src_head ? dst_head : src_head) + n > UINT32_MAX - TQ_WG)
        return LMH_ENOMEM;
    uint32_t p[5] = {(uint32_t)from, (uint32_t)to, (uint32_t)src_head, (uint32_t)dst_head, heads};
    lmh_tensor *t[2] = {src, dst};
    return run(c, K_MOVE, t, 2, 2u, n, TQ_WG, p, 5);
}

/* The compressed stores of layer l to `cap` rows (even), keeping rows [0, cpos). */
static int cold_resize(lmh_cache *c, int32_t l, layer_kv *kv, int32_t cap) {
    const tq_side *K = &c->ks[l], *V = &c->vs[l];
    uint32_t hk = (uint32_t)(c->layers[l].n_kv_heads * K->nb);
    uint32_t hv = (uint32_t)(c->layers[l].n_kv_heads * V->nb);
    uint64_t kw_head = (uint64_t)cap * (uint64_t)K->kw, vw_head = tq_v_head_words(V->cw, cap);
    if (hk * kw_head > UINT32_MAX - TQ_WG || hv * vw_head > UINT32_MAX - TQ_WG) return LMH_ENOMEM;
    int64_t kne[3] = {hk, cap, K->kw}, vne[2] = {hv, (int64_t)vw_head};
    lmh_tensor *k = c->be->tensor_new(c->b, LMH_I32, 3, kne, 0);
    lmh_tensor *v = c->be->tensor_new(c->b, LMH_I32, 2, vne, 0);
    if (!k || !v) {
        if (k) c->be->tensor_free(c->b, k);
        if (v) c->be->tensor_free(c->b, v);
        return LMH_ENOMEM;
    }
    uint64_t rk, rv;
    row_bytes(c, l, &rk, &rv);
    int rc = LMH_OK;
    if (kv->ck) {
        uint64_t n = (uint64_t)kv->cpos, oc = (uint64_t)kv->ccap, nc = (uint64_t)cap;
        uint64_t ok = oc * (uint64_t)K->kw, ov = tq_v_head_words(V->cw, kv->ccap);
        rc = move_plane(c, k, kv->ck, n * K->cw, 0, 0, ok, kw_head, hk);
        if (rc == LMH_OK && K->sw)
            rc = move_plane(c, k, kv->ck, n * K->sw, oc * K->cw, nc * K->cw, ok, kw_head, hk);
        if (rc == LMH_OK)
            rc = move_plane(c, k, kv->ck, n, oc * (K->cw + K->sw), nc * (K->cw + K->sw), ok,
                            kw_head, hk);
        if (rc == LMH_OK) rc = move_plane(c, v, kv->cv, n * V->cw, 0, 0, ov, vw_head, hv);
        if (rc == LMH_OK)
            rc = move_plane(c, v, kv->cv, (n + 1) / 2, oc * V->cw, nc * V->cw, ov, vw_head, hv);
        c->be->tensor_free(c->b, kv->ck);
        c->be->tensor_free(c->b, kv->cv);
        c->bytes -= (uint64_t)kv->ccap * (rk + rv);
    }
    kv->ck = k;
    kv->cv = v;
    kv->ccap = cap;
    c->bytes += (uint64_t)cap * (rk + rv);
    return rc;
}

/* Encodes n rows into store rows first..: from f32 rows [n, kvh, hd] (ring == NULL), or
 * from positions p0.. of the f16 ring. */
static int encode(lmh_cache *c, int32_t l, const tq_side *sd, int keys, lmh_tensor *src,
                  lmh_tensor *ring, int32_t rcap, int32_t p0, lmh_tensor *store, int32_t first,
                  int32_t n, int32_t cap) {
    uint32_t kvh = (uint32_t)c->layers[l].n_kv_heads;
    uint32_t p[11] = {kvh,
                      (uint32_t)sd->hd,
                      (uint32_t)sd->m,
                      (uint32_t)c->bits,
                      keys && c->qjl,
                      (uint32_t)keys,
                      ring != NULL,
                      (uint32_t)p0,
                      (uint32_t)rcap,
                      (uint32_t)first,
                      (uint32_t)cap};
    lmh_tensor *t[2] = {ring ? ring : src, store};
    return run(c, K_ENCODE, t, 2, 2u, (uint64_t)n * kvh * (uint64_t)sd->nb, 1, p, 11);
}

/* Decodes store rows [first, first + n) into f32 rows [n, kvh, hd] of dst. */
static int decode(lmh_cache *c, int32_t l, const tq_side *sd, int keys, lmh_tensor *store,
                  int32_t cap, int32_t first, int32_t n, lmh_tensor *dst) {
    uint32_t kvh = (uint32_t)c->layers[l].n_kv_heads;
    uint32_t p[9] = {kvh,
                     (uint32_t)sd->hd,
                     (uint32_t)sd->m,
                     (uint32_t)c->bits,
                     keys && c->qjl,
                     (uint32_t)keys,
                     (uint32_t)first,
                     (uint32_t)cap,
                     (uint32_t)c->use_qjl};
    lmh_tensor *t[2] = {store, dst};
    return run(c, K_DECODE, t, 2, 2u, (uint64_t)n * kvh * (uint64_t)sd->nb, 1, p, 9);
}

static lmh_tensor *row_view(lmh_cache *c, lmh_tensor *x, int32_t first, int32_t n) {
    int64_t ne[3] = {n, x->ne[1], x->ne[2]};
    size_t off = (size_t)first * (size_t)(x->ne[1] * x->ne[2]) * lmh_dtype_size(x->dtype);
    return c->be->tensor_view(c->b, x, off, x->dtype, 3, ne);
}

/* Appends n rows to a compressed layer: the rows past the hot window are encoded (those
 * already in the ring from it, new ones straight from k, v), the rest go to the ring. */
static int append_tq(lmh_cache *c, int32_t l, layer_kv *kv, lmh_tensor *k, lmh_tensor *v,
                     int32_t n) {
    int32_t pos = kv->pos, c0 = kv->cpos, len = pos + n, c1 = c0;
    if (len > c->start && len - c->hot - c0 >= c->step) c1 = len - c->hot;
    /* the ring holds [c0, pos) until they are encoded and [c1, len) after */
    int32_t need = pos - c0 > len - c1 ? pos - c0 : len - c1, rc = LMH_OK;
    if (need > 0) {
        int32_t want = kv->cap;
        if (c1 > 0) { /* compressing: the window and a step, more only while a long step needs */
            int32_t hs = c->hot + c->step;
            if (kv->cap < need || kv->cap > (need > hs ? need : hs)) want = need > hs ? need : hs;
        } else if (kv->cap < need) {
            want = kv->cap ? kv->cap : 16;
            while (want < need) want = want > (1 << 29) ? need : want * 2;
        }
        if (want != kv->cap) rc = f16_resize(c, l, kv, want);
    }
    if (rc == LMH_OK && c1 > kv->ccap) {
        int32_t cap = kv->ccap ? kv->ccap : COLD_MIN;
        while (cap < c1) cap = cap > (1 << 29) ? (c1 + 1) & ~1 : cap * 2;
        rc = cold_resize(c, l, kv, cap);
    }
    const tq_side *K = &c->ks[l], *V = &c->vs[l];
    int32_t from_ring = (c1 < pos ? c1 : pos) - c0; /* rows encoded from the ring */
    if (rc == LMH_OK && from_ring > 0) {
        rc = encode(c, l, K, 1, NULL, kv->k, kv->cap, c0, kv->ck, c0, from_ring, kv->ccap);
        if (rc == LMH_OK)
            rc = encode(c, l, V, 0, NULL, kv->v, kv->cap, c0, kv->cv, c0, from_ring, kv->ccap);
    }
    int32_t direct = c1 > pos ? c1 - pos : 0; /* new rows encoded at once */
    if (rc == LMH_OK && direct > 0) {
        rc = encode(c, l, K, 1, k, NULL, 0, 0, kv->ck, pos, direct, kv->ccap);
        if (rc == LMH_OK) rc = encode(c, l, V, 0, v, NULL, 0, 0, kv->cv, pos, direct, kv->ccap);
    }
    if (rc == LMH_OK && n - direct > 0) {
        rc = ring_rows(c, kv->k, kv->cap, pos + direct, k, direct, n - direct, 1);
        if (rc == LMH_OK) rc = ring_rows(c, kv->v, kv->cap, pos + direct, v, direct, n - direct, 1);
    }
    if (rc == LMH_OK) {
        kv->cpos = c1;
        kv->pos = len;
    }
    return rc;
}

static int append(lmh_cache *c, uint64_t id, int32_t l, lmh_tensor *k, lmh_tensor *v) {
    seq *s = kv_find(&c->t, id);
    if (!s || l < 0 || l >= c->n_layers || c->layers[l].kind != LMH_STATE_KV) return LMH_EINVAL;
    const lmh_layer_state *st = &c->layers[l];
    if (k->ndim != 3 || v->ndim != 3 || k->dtype != LMH_F32 || v->dtype != LMH_F32 ||
        k->ne[0] != v->ne[0] || k->ne[1] != st->n_kv_heads || v->ne[1] != st->n_kv_heads ||
        k->ne[2] != st->head_dim_k || v->ne[2] != st->head_dim_v)
        return LMH_ESHAPE;
    layer_kv *kv = &s->layers[l];
    int32_t n = (int32_t)k->ne[0];
    if (c->max_len > 0 && kv->pos + n > c->max_len) return LMH_ENOMEM;
    if (is_tq(c, l)) return append_tq(c, l, kv, k, v, n);
    int32_t cap = kv_capacity_for(st, kv, n, c->max_len);
    int rc = cap ? f16_resize(c, l, kv, cap) : LMH_OK;
    if (rc == LMH_OK)
        rc = ring_rows(c, kv->k, st->window > 0 ? kv->cap : INT32_MAX, kv->pos, k, 0, n, 1);
    if (rc == LMH_OK)
        rc = ring_rows(c, kv->v, st->window > 0 ? kv->cap : INT32_MAX, kv->pos, v, 0, n, 1);
    if (rc == LMH_OK) kv->pos += n;
    return rc;
}

/* ---- attention ---- */

static lmh_tensor *f32_room(lmh_cache *c, lmh_tensor **buf, size_t *have, int64_t rows,
                            int64_t heads, int64_t hd) {
    return kv_f32_room(c->be, c->b, buf, have, rows, heads, hd);
}

/* Positions [first, first + n) of a compressed layer as f32 rows of kd and vd (decoded
 * below cpos, converted from the ring at and above it). */
static int rows_f32(lmh_cache *c, int32_t l, layer_kv *kv, int32_t first, int32_t n, lmh_tensor *kd,
                    lmh_tensor *vd) {
    int32_t nc = first < kv->cpos ? (kv->cpos - first < n ? kv->cpos - first : n) : 0;
    int rc = LMH_OK;
    if (nc > 0) {
        lmh_tensor *a = row_view(c, kd, 0, nc), *b = row_view(c, vd, 0, nc);
        rc = a && b ? decode(c, l, &c->ks[l], 1, kv->ck, kv->ccap, first, nc, a) : LMH_ENOMEM;
        if (rc == LMH_OK) rc = decode(c, l, &c->vs[l], 0, kv->cv, kv->ccap, first, nc, b);
        if (a) c->be->tensor_free(c->b, a);
        if (b) c->be->tensor_free(c->b, b);
    }
    if (rc == LMH_OK && n > nc) {
        rc = ring_rows(c, kv->k, kv->cap, first + nc, kd, nc, n - nc, 0);
        if (rc == LMH_OK) rc = ring_rows(c, kv->v, kv->cap, first + nc, vd, nc, n - nc, 0);
    }
    return rc;
}

/* Rows a chunk of decode attention: about 256 workgroups in all, in blocks of 64 rows */
static uint32_t chunk_rows(uint32_t rows, uint32_t kvh) {
    uint64_t want = ((uint64_t)rows * kvh + 255) / 256;
    uint32_t chunk = (uint32_t)((want + TQ_ATT_ROWS - 1) / TQ_ATT_ROWS * TQ_ATT_ROWS);
    if (chunk < TQ_ATT_ROWS) chunk = TQ_ATT_ROWS;
    while ((rows + chunk - 1) / chunk + 1 > ATT_MAXCH) chunk *= 2;
    return chunk;
}

/* Whether attend's build kern runs here, made ready on first use. A backend may refuse one
 * (a device with less shared memory than it takes): decode then reads decoded rows, as
 * prefill does, and the refusal is logged once. */
static int attend_ready(lmh_cache *c, int kern) {
    if (c->kern[kern]) return 1;
    if (c->refused[kern]) return 0;
    char err[256] = "";
    int rc = c->be->kernel_add(c->b, &kernel_descs[kern], &c->kern[kern], err, sizeof err);
    if (rc == LMH_OK && c->kern[kern]) return 1;
    c->refused[kern] = 1;
    if (c->host && c->host->log)
        c->host->log(LMH_LOG_WARN, "cache turboquant: %s; decode reads decoded rows instead", err);
    return 0;
}

/* The layer's attention sinks (ABI 1.10): a host built earlier passes params without them. */
static lmh_tensor *attn_sinks(const lmh_cache *c, const lmh_attn_params *p) {
    return c->host && c->host->abi_minor >= 10 ? p->sinks : NULL;
}

static int attend_codes(lmh_cache *c, int32_t l, int kern, layer_kv *kv, lmh_tensor *q,
                        lmh_tensor *out, const lmh_attn_params *p) {
    const lmh_layer_state *st = &c->layers[l];
    uint32_t heads = (uint32_t)q->ne[1], kvh = (uint32_t)st->n_kv_heads;
    uint32_t c0 = (uint32_t)kv->cpos, pos = (uint32_t)kv->pos, dv = (uint32_t)st->head_dim_v;
    uint32_t chunk = chunk_rows(pos, kvh), ncc = (c0 + chunk - 1) / chunk;
    uint32_t nch = ncc + (pos - c0 + chunk - 1) / chunk;
    lmh_tensor *part = f32_room(c, &c->part, &c->part_floats, heads, nch, dv + 2);
    if (!part) return LMH_ENOMEM;
    /* a layer with nothing in one of its parts still binds a tensor there */
    lmh_tensor *t[6] = {q,
                        kv->ck ? kv->ck : part,
                        kv->cv ? kv->cv : part,
                        kv->k ? kv->k : part,
                        kv->v ? kv->v : part,
                        part};
    uint32_t v[15] = {heads,
                      kvh,
                      (uint32_t)st->head_dim_k,
                      dv,
                      (uint32_t)c->bits,
                      (uint32_t)c->qjl,
                      c0,
                      pos,
                      (uint32_t)kv->cap,
                      (uint32_t)kv->ccap,
                      0,
                      0,
                      chunk,
                      ncc,
                      (uint32_t)c->use_qjl};
    memcpy(&v[10], &p->scale, 4);
    memcpy(&v[11], &p->softcap, 4);
    int rc = run(c, kern, t, 6, 1u << 5, (uint64_t)kvh * nch, 1, v, 15);
    /* the merge, with the layer's sinks where it has them */
    lmh_tensor *sinks = attn_sinks(c, p);
    uint32_t m[3] = {nch, dv, sinks != NULL};
    lmh_tensor *t2[3] = {part, out, sinks};
    if (rc == LMH_OK) rc = run(c, K_MERGE, t2, sinks ? 3 : 2, 2u, heads, 1, m, 3);
    c->be->tensor_free(c->b, part);
    return rc;
}

static int attend(lmh_cache *c, uint64_t id, int32_t l, lmh_tensor *q, lmh_tensor *q_pos,
                  lmh_tensor *out, const lmh_attn_params *p) {
    seq *s = kv_find(&c->t, id);
    if (!s || l < 0 || l >= c->n_layers || c->layers[l].kind != LMH_STATE_KV) return LMH_EINVAL;
    layer_kv *kv = &s->layers[l];
    const lmh_layer_state *st = &c->layers[l];
    int32_t nq = (int32_t)q->ne[0];
    if (!is_tq(c, l)) {
        if (!kv->k) return LMH_EINVAL;
        lmh_op op = {.code = LMH_OP_ATTENTION, .dst = out, .src = {q, kv->k, kv->v, q_pos}};
        op.p.i[0] = kv_rows_held(kv);
        op.p.i[2] = p->window;
        op.p.i[3] = st->window > 0 ? kv->cap : 0;
        op.p.i[4] = kv->pos;
        op.p.f[0] = p->scale;
        op.p.f[1] = p->softcap;
        if ((op.src_more[0] = attn_sinks(c, p))) op.p.i[5] = LMH_ATTN_SINKS;
        int rc = c->be->enqueue(c->b, &op);
        if (rc == LMH_OK) c->read += f16_row(c, l) * (uint64_t)kv_rows_seen(kv, nq, p->window);
        return rc;
    }
    if (kv->pos == 0) return LMH_EINVAL;
    uint64_t rk, rv;
    row_bytes(c, l, &rk, &rv);
    int64_t G = q->ne[1] / st->n_kv_heads;
    int rc;
    int kern = G <= 4 ? K_ATTEND4 : K_ATTEND;
    if (kv->cpos == 0 && kv->pos <= kv->cap) {
        /* nothing encoded yet and the ring not wrapped: its rows are positions 0.. in
         * order, as the f16 cache keeps them, so the backend's attention reads them as it
         * reads that cache's (short prompts cost what they cost there) */
        lmh_op op = {.code = LMH_OP_ATTENTION, .dst = out, .src = {q, kv->k, kv->v, q_pos}};
        op.p.i[0] = kv->pos;
        op.p.i[2] = p->window;
        op.p.i[4] = kv->pos;
        op.p.f[0] = p->scale;
        op.p.f[1] = p->softcap;
        if ((op.src_more[0] = attn_sinks(c, p))) op.p.i[5] = LMH_ATTN_SINKS;
        rc = c->be->enqueue(c->b, &op);
    } else if (nq == 1 && q->ndim == 3 && q->dtype == LMH_F32 && p->window == 0 && G >= 1 &&
               G <= TQ_ATT_G && G * st->n_kv_heads == q->ne[1] && q->ne[2] == st->head_dim_k &&
               attend_ready(c, kern)) {
        rc = attend_codes(c, l, kern, kv, q, out, p);
    } else { /* several query rows: the stored rows in f32, then the backend's attention */
        lmh_tensor *fk =
            f32_room(c, &c->fk, &c->fk_floats, kv->pos, st->n_kv_heads, st->head_dim_k);
        lmh_tensor *fv =
            fk ? f32_room(c, &c->fv, &c->fv_floats, kv->pos, st->n_kv_heads, st->head_dim_v) : NULL;
        rc = fk && fv ? rows_f32(c, l, kv, 0, kv->pos, fk, fv) : LMH_ENOMEM;
        if (rc == LMH_OK) {
            lmh_op op = {.code = LMH_OP_ATTENTION, .dst = out, .src = {q, fk, fv, q_pos}};
            op.p.i[0] = kv->pos;
            op.p.i[2] = p->window;
            op.p.i[4] = kv->pos;
            op.p.f[0] = p->scale;
            op.p.f[1] = p->softcap;
            if ((op.src_more[0] = attn_sinks(c, p))) op.p.i[5] = LMH_ATTN_SINKS;
            rc = c->be->enqueue(c->b, &op);
        }
        if (fk) c->be->tensor_free(c->b, fk);
        if (fv) c->be->tensor_free(c->b, fv);
    }
    if (rc == LMH_OK)
        c->read += (uint64_t)kv->cpos * (rk + rv) + (uint64_t)(kv->pos - kv->cpos) * f16_row(c, l);
    return rc;
}

static int read_rows(lmh_cache *c, uint64_t id, int32_t l, int32_t first, int32_t n, lmh_tensor *k,
                     lmh_tensor *v) {
    seq *s = kv_find(&c->t, id);
    if (!s || l < 0 || l >= c->n_layers || c->layers[l].kind != LMH_STATE_KV || first < 0 || n < 0)
        return LMH_EINVAL;
    const lmh_layer_state *st = &c->layers[l];
    layer_kv *kv = &s->layers[l];
    if (k->ndim != 3 || v->ndim != 3 || k->dtype != LMH_F32 || v->dtype != LMH_F32 ||
        k->ne[0] < n || v->ne[0] < n || k->ne[1] != st->n_kv_heads || v->ne[1] != st->n_kv_heads ||
        k->ne[2] != st->head_dim_k || v->ne[2] != st->head_dim_v)
        return LMH_ESHAPE;
    if (n == 0) return LMH_OK;
    if ((int64_t)first + n > kv->pos) return LMH_EINVAL;
    if (is_tq(c, l)) return rows_f32(c, l, kv, first, n, k, v);
    if (first < kv->pos - kv_rows_held(kv)) return LMH_EINVAL; /* past a window's ring */
    int32_t rcap = st->window > 0 ? kv->cap : INT32_MAX;
    int rc = ring_rows(c, kv->k, rcap, first, k, 0, n, 0);
    return rc == LMH_OK ? ring_rows(c, kv->v, rcap, first, v, 0, n, 0) : rc;
}

static uint64_t bytes(lmh_cache *c) {
    return c->bytes;
}

static uint64_t seq_bytes(lmh_cache *c, uint64_t id) {
    seq *s = kv_find(&c->t, id);
    uint64_t n = 0;
    if (s)
        for (int32_t l = 0; l < c->n_layers; l++)
            n += layer_held(c, l, &s->layers[l]) + rec_layer_held(&c->t, &s->layers[l], l);
    return n;
}

static uint64_t bytes_read(lmh_cache *c) {
    return c->read;
}

static int32_t layer_rows(lmh_cache *c, uint64_t id, int32_t l) {
    seq *s = kv_find(&c->t, id);
    if (s && l >= 0 && l < c->n_layers && is_tq(c, l)) return s->layers[l].pos;
    return kv_layer_rows(&c->t, id, l);
}

static int recur(lmh_cache *c, uint64_t id, int32_t l, int32_t buf, const lmh_op *op) {
    return rec_recur(c->be, c->b, &c->t, id, l, buf, op, &c->bytes, &c->read);
}

/* ---- snapshots (seq_state.h): f16 layers' rows as the f16 cache keeps them; a layer
 * holding codes lays out its own (own_*): its first position (0), its length and the
 * rows encoded, then the codes of those rows as the planes hold them, virtual head by
 * virtual head (keys: codes, signs, norm words; values: codes, then the fp16 norms), then
 * the hot rows as f16, keys then values. The same bytes from any backend. ---- */

static uint64_t k_row(lmh_cache *c, int32_t l) {
    return (uint64_t)c->layers[l].n_kv_heads * (uint64_t)c->layers[l].head_dim_k * 2;
}

static uint64_t v_row(lmh_cache *c, int32_t l) {
    return (uint64_t)c->layers[l].n_kv_heads * (uint64_t)c->layers[l].head_dim_v * 2;
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

static int own(lmh_cache *c, int32_t l) {
    return is_tq(c, l);
}

static uint64_t own_bytes(lmh_cache *c, int32_t l, int32_t len, int32_t cpos) {
    uint64_t rk, rv;
    row_bytes(c, l, &rk, &rv);
    return 12 + (uint64_t)cpos * (rk + rv) + (uint64_t)(len - cpos) * (k_row(c, l) + v_row(c, l));
}

static uint64_t own_size(lmh_cache *c, int32_t l, kv_layer *kv) {
    return own_bytes(c, l, kv->pos, kv->cpos);
}

/* The hot rows [cpos, pos) between the ring and n rows of keys at kb, values at vb. */
static int hot_io(lmh_cache *c, int32_t l, layer_kv *kv, uint8_t *kb, uint8_t *vb, int save) {
    for (int32_t p = kv->cpos; p < kv->pos;) {
        int32_t slot = p % kv->cap,
                run = kv->pos - p < kv->cap - slot ? kv->pos - p : kv->cap - slot;
        int rc = rows_io(c, l, kv, slot, run, kb + (uint64_t)(p - kv->cpos) * k_row(c, l),
                         vb + (uint64_t)(p - kv->cpos) * v_row(c, l), save);
        if (rc != LMH_OK) return rc;
        p += run;
    }
    return LMH_OK;
}

/* Rows [0, n) of the planes of a compressed store (whole tensor image img, cap rows a
 * head) to or from their snapshot layout at buf; returns the bytes of that layout. */
static uint64_t planes_io(const tq_side *sd, int keys, uint32_t heads, int32_t cap, int32_t n,
                          uint32_t *img, uint8_t *buf, int save) {
    uint64_t o = 0, cw = (uint64_t)sd->cw, sw = keys ? (uint64_t)sd->sw : 0;
    uint64_t head = keys ? (uint64_t)cap * (uint64_t)sd->kw : tq_v_head_words(sd->cw, cap);
    for (uint32_t h = 0; h < heads; h++) {
        uint32_t *base = img + h * head;
        struct {
            void *at;
            uint64_t bytes;
        } part[3] = {{base, (uint64_t)n * cw * 4},
                     {base + (uint64_t)cap * cw, keys ? (uint64_t)n * sw * 4 : (uint64_t)n * 2},
                     {base + (uint64_t)cap * (cw + sw), keys ? (uint64_t)n * 4 : 0}};
        for (int i = 0; i < 3; i++) {
            if (save)
                memcpy(buf + o, part[i].at, part[i].bytes);
            else
                memcpy(part[i].at, buf + o, part[i].bytes);
            o += part[i].bytes;
        }
    }
    return o;
}

static int own_save(lmh_cache *c, int32_t l, kv_layer *kv, uint8_t *dst) {
    int32_t h3[3] = {0, kv->pos, kv->cpos};
    memcpy(dst, h3, sizeof h3);
    uint8_t *o = dst + sizeof h3;
    uint32_t kvh = (uint32_t)c->layers[l].n_kv_heads;
    for (int keys = 1; keys >= 0 && kv->cpos > 0; keys--) {
        const tq_side *sd = keys ? &c->ks[l] : &c->vs[l];
        lmh_tensor *t = keys ? kv->ck : kv->cv;
        uint32_t heads = kvh * (uint32_t)sd->nb;
        uint64_t head =
            keys ? (uint64_t)kv->ccap * (uint64_t)sd->kw : tq_v_head_words(sd->cw, kv->ccap);
        uint32_t *img = malloc(heads * head * 4);
        if (!img) return LMH_ENOMEM;
        int rc = c->be->download(c->b, t, 0, img, heads * head * 4);
        if (rc == LMH_OK) o += planes_io(sd, keys, heads, kv->ccap, kv->cpos, img, o, 1);
        free(img);
        if (rc != LMH_OK) return rc;
    }
    return hot_io(c, l, kv, o, o + (uint64_t)(kv->pos - kv->cpos) * k_row(c, l), 1);
}

static int own_check(lmh_cache *c, int32_t l, const uint8_t *src, uint64_t avail, int32_t len,
                     uint64_t *used) {
    int32_t h3[3];
    if (avail < sizeof h3) return LMH_EINVAL;
    memcpy(h3, src, sizeof h3);
    if (h3[0] != 0 || h3[1] != len || h3[2] < 0 || h3[2] > len) return LMH_EINVAL;
    *used = own_bytes(c, l, len, h3[2]);
    return *used <= avail ? LMH_OK : LMH_EINVAL;
}

static int own_load(lmh_cache *c, int32_t l, kv_layer *kv, const uint8_t *src, int32_t len) {
    int32_t h3[3];
    memcpy(h3, src, sizeof h3);
    const uint8_t *p = src + sizeof h3;
    int32_t cpos = h3[2], hot = len - cpos;
    free_layer(c, l, kv); /* the snapshot's rows in place of the layer's own */
    kv->pos = kv->cpos = 0;
    uint32_t kvh = (uint32_t)c->layers[l].n_kv_heads;
    int rc = LMH_OK;
    if (cpos > 0) {
        int32_t cap = COLD_MIN;
        while (cap < cpos) cap = cap > (1 << 29) ? (cpos + 1) & ~1 : cap * 2;
        rc = cold_resize(c, l, kv, cap);
        for (int keys = 1; keys >= 0 && rc == LMH_OK; keys--) {
            const tq_side *sd = keys ? &c->ks[l] : &c->vs[l];
            uint32_t heads = kvh * (uint32_t)sd->nb;
            uint64_t head = keys ? (uint64_t)cap * (uint64_t)sd->kw : tq_v_head_words(sd->cw, cap);
            uint32_t *img = calloc(heads * head, 4);
            if (!img) return LMH_ENOMEM;
            p += planes_io(sd, keys, heads, cap, cpos, img, (uint8_t *)p, 0);
            rc = c->be->upload(c->b, keys ? kv->ck : kv->cv, 0, img, heads * head * 4);
            free(img);
        }
    }
    if (rc == LMH_OK && hot > 0) {
        int32_t hs = c->hot + c->step, cap = hot > hs ? hot : hs;
        rc = f16_resize(c, l, kv, cap < 16 ? 16 : cap);
    }
    kv->cpos = cpos;
    kv->pos = len;
    if (rc == LMH_OK && hot > 0)
        rc = hot_io(c, l, kv, (uint8_t *)p, (uint8_t *)p + (uint64_t)hot * k_row(c, l), 0);
    return rc;
}

static const seq_kv_io kv_io = {.k_row = k_row,
                                .v_row = v_row,
                                .alloc = f16_resize,
                                .rows = rows_io,
                                .own = own,
                                .own_size = own_size,
                                .own_save = own_save,
                                .own_check = own_check,
                                .own_load = own_load};

static uint64_t state_size(lmh_cache *c, uint64_t id, int with_kv) {
    return snap_size(c, &kv_io, &c->t, id, with_kv);
}

static int state_save(lmh_cache *c, uint64_t id, int with_kv, void *dst, uint64_t n) {
    return snap_save(c, &kv_io, c->be, c->b, &c->t, id, with_kv, dst, n, &c->bytes);
}

static int state_load(lmh_cache *c, uint64_t id, const void *src, uint64_t n) {
    int rc = snap_load(c, &kv_io, c->be, c->b, &c->t, id, src, n, &c->bytes);
    seq *s = kv_find(&c->t, id);
    for (int32_t l = 0; s && l < c->n_layers; l++) /* a shorter length drops encoded rows */
        if (s->layers[l].cpos > s->layers[l].pos) s->layers[l].cpos = s->layers[l].pos;
    return rc;
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
    .name = "turboquant",
    .version = "0.1.0",
    .summary = "keys and values as rotated Lloyd-Max codes with QJL-corrected keys "
               "(TurboQuant), attention on the codes",
    .init = NULL,
    .api = &api,
};

LMH_EXPORT const lmh_plugin_info *lmhost_plugin_entry(void) {
    return &info;
}
