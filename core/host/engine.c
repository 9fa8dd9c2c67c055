/* The engine and the host services plugins call while loading and running a model.
 *
 * Placement: every layer maps to a backend slot: all to one; with --devices, contiguous
 * shares to an instance of the backend on each device; with --gpu-layers N, the first N
 * (split so) and the rest to the CPU backend. Embeddings go with the first layer and the
 * output head with the last. Plugins hold host tensors
 * (placement.h), so an activation crossing from one slot to the next is copied on use
 * and nothing in the architecture plugins knows about the split. */
#include "engine.h"
#include "cache_spec.h"
#include "expert_stream.h"
#include "util.h"
#include "log.h"
#include "model_dir.h"
#include "placement.h"
#include "rope_config.h"
#include "sampler.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct lmh_load_ctx {
    engine *e;
    char err[1024];
    int failed;
};

typedef struct seg {
    uint64_t seq;
    int32_t r0, n;
    int ci; /* the sequence's cache (engine.caches) */
} seg;

struct lmh_fwd {
    engine *e;
    int32_t n_rows; /* the pass's rows */
    htensor **tmp;  /* scratch tensors and views, freed after the pass (views first) */
    int n_tmp, cap_tmp;
    seg *segs;
    int n_segs;
    htensor *positions;
    int failed;
    int oom; /* the failure was memory running out (engine_step answers LMH_ENOMEM) */
    char err[512];
    /* engine_trace: the layer of the last op enqueued and its result; at the next layer's
     * first op that result is copied into traced[layer] */
    int32_t last_layer;
    lmh_tensor *last_dst;
    lmh_tensor **traced;
    /* engine_embed: the step's logits, which no op computes (a tensor without backend
     * memory), and a copy of the last product's input into them (the hidden states) */
    lmh_tensor *emb_logits;
    htensor *emb_hidden;
    int32_t n_out;
    /* streamed experts: the expert ids last read back for their products, valid until an
     * op writes that tensor again */
    htensor *xs_ids_of;
    int32_t *xs_ids, *xs_map;
    size_t xs_ids_cap;
    /* the routing of the next streamed layer, predicted from this one's router input
     * (predict_next), and the last matrix product enqueued (a router's, when a route reads it) */
    htensor *pred_ids;
    int32_t pred_layer, last_mm_layer;
    int predicting, predict_pass; /* predict_pass: this pass predicts (xs_predict_ok) */
    lmh_op last_mm;
};

/* A step started by engine_step_start whose picks the caller has not taken yet. */
typedef struct pend_step {
    htensor *ids;    /* the picks on the output backend (NULL: already on the host) */
    int32_t *host;   /* the picks on the host, when they were read at once */
    int32_t n;       /* output rows */
    uint64_t ticket; /* the output backend's download_start, 0 for none */
} pend_step;

/* A cache in use: a cache plugin, format and settings, with an instance on each backend
 * slot for the layers placed there. Every sequence lives in one. */
typedef struct ecache {
    cache_spec spec;
    const lmh_cache_api *api; /* NULL: the entry is free */
    char key[256];            /* "plugin:format,settings": specs with one key are one cache */
    char name[ENGINE_CACHE_NAME];
    lmh_cache *c[PL_MAX_SLOTS];
    int n_seqs;
} ecache;

typedef struct seq_ent {
    uint64_t seq;
    int ci;
    int32_t prompt_end; /* engine_seq_prompt's: the prompt fed over several steps ends here */
    int32_t moe_k;      /* engine_seq_moe_top_k's; 0: the engine's */
} seq_ent;

struct engine {
    const registry *reg;
    model_dir *md;
    const plugin *arch_p;
    const lmh_arch_api *arch;
    pl_slot slots[PL_MAX_SLOTS];
    int n_slots;
    /* [0] is engine_opts.cache's, open while the engine is; the others open on demand */
    ecache caches[ENGINE_MAX_CACHES];
    seq_ent *seqs; /* sequences alive and their caches (few: a linear search is enough) */
    int n_seqs, cap_seqs;
    int32_t *local[PL_MAX_SLOTS]; /* global layer -> the slot cache's layer, or -1 */
    int32_t *layer_slot;
    int input_slot, output_slot;
    int gpu_layers; /* -1: every layer on the devices' backends */
    int n_dev;      /* slots [0, n_dev) hold the devices' backends */
    int device[ENGINE_MAX_DEVICES];
    double share[ENGINE_MAX_DEVICES]; /* engine_opts.tensor_split; all 0: by free memory */
    lmh_backend_opts bopts;
    lmh_model *model;
    int32_t n_layers, vocab, first_kv;
    int32_t first_state; /* the first layer that keeps anything: its cache says the length */
    lmh_layer_state *layers;
    lmh_recurrent_state *rec; /* per layer (ABI 1.7), n_bufs 0 where none */
    int n_rec;                /* layers with recurrent state */
    htensor **weights;        /* tensors handed to the architecture plugin */
    int n_weights, cap_weights;
    uint64_t weight_bytes;
    /* engine_opts.progress while engine_open loads (NULL after), the checkpoint's bytes */
    void (*progress)(void *ctx, uint64_t done, uint64_t total);
    void *progress_ctx;
    uint64_t load_total;
    uint64_t mm_flops; /* 2 x the multiply-adds of the matrix products enqueued so far */
    int max_seq_len;
    char chain[1280];
    char precision[16];                 /* engine_precision */
    pend_step pend[ENGINE_MAX_PENDING]; /* started steps, oldest first */
    int n_pend;
    int pooling; /* engine_embed_pooling's; -1 with pool_err where malformed */
    char pool_err[512];
    int trace;           /* engine_trace */
    float **trace_data;  /* per layer, the last traced step's rows (NULL where none) */
    int64_t *trace_dims; /* per layer: rows, width */
    /* mixtures of experts: declare_moe's numbers (0 without), engine_opts.moe_top_k, and
     * the experts streamed from disk (NULL unless engine_opts.stream_experts) */
    int32_t moe_experts, moe_top_k, moe_k_default;
    xs_store *xs;
    struct xs_router *routers; /* per layer, with xs: its router as the last pass ran it */
};

/* A layer's router: its product (weight, bias, parameters) and routing op, without the pass's
 * tensors, and the experts it chooses among and keeps. */
typedef struct xs_router {
    lmh_op mm, route;
    int64_t n_experts, k;
    int set;
} xs_router;

/* Passes of at most this many rows predict the next layer's routing (decode steps): a long
 * prefill needs most experts anyway. */
#ifndef XS_PREDICT_ROWS
#define XS_PREDICT_ROWS 8
#endif

static int slot_of(const engine *e, int32_t layer) {
    if (layer == LMH_LAYER_INPUT) return e->input_slot;
    if (layer == LMH_LAYER_OUTPUT) return e->output_slot;
    if (layer >= 0 && layer < e->n_layers && e->layer_slot) return e->layer_slot[layer];
    return 0;
}

/* Starts a backend instance in slot `s` on `device`: plugin `name`, with its options after a
 * colon ("vulkan:max-memory=4G"). */
static int start_backend(engine *e, int s, const char *name, int device, char *err,
                         size_t err_len) {
    pl_slot *sl = &e->slots[s];
    const plugin *p = NULL;
    lmh_backend_opts bo = e->bopts;
    bo.device = device;
    if (registry_backend_start(e->reg, name, &bo, &p, &sl->b, err, err_len) != 0) {
        memset(sl, 0, sizeof *sl);
        return -1;
    }
    sl->plugin = p;
    sl->api = p->info->api;
    return 0;
}

static void stop_backend(engine *e, int s) {
    if (e->slots[s].b) e->slots[s].api->destroy(e->slots[s].b);
    memset(&e->slots[s], 0, sizeof e->slots[s]);
}

/* ---- load-time services ---------------------------------------------------------- */

/* engine_opts.progress with the weight bytes loaded so far. */
static void load_progress(engine *e) {
    if (e->progress)
        e->progress(e->progress_ctx,
                    e->weight_bytes < e->load_total ? e->weight_bytes : e->load_total,
                    e->load_total);
}

static void host_log(int level, const char *fmt, ...) {
    if (level > log_level) return;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    log_msg(level, "%s", buf);
}

static int host_fail(lmh_load_ctx *ld, const char *fmt, ...) {
    if (!ld->failed) { /* keep the first, most specific message */
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ld->err, sizeof ld->err, fmt, ap);
        va_end(ap);
        ld->failed = 1;
    }
    return LMH_EINVAL;
}

static json_object *cfg_get(lmh_load_ctx *ld, const char *path) {
    return cfg_lookup(md_config(ld->e->md), path);
}

static int host_cfg_int(lmh_load_ctx *ld, const char *path, int64_t *out) {
    json_object *o = cfg_get(ld, path);
    if (!o) return LMH_ENOTFOUND;
    if (json_object_is_type(o, json_type_int)) {
        errno = 0;
        *out = json_object_get_int64(o);
        return LMH_OK;
    }
    if (json_object_is_type(o, json_type_double)) { /* 4096.0 is fine, 4096.5 is not */
        double d = json_object_get_double(o);
        if (d == (double)(int64_t)d) {
            *out = (int64_t)d;
            return LMH_OK;
        }
    }
    return LMH_ETYPE;
}

static int host_cfg_float(lmh_load_ctx *ld, const char *path, double *out) {
    json_object *o = cfg_get(ld, path);
    if (!o) return LMH_ENOTFOUND;
    if (!json_object_is_type(o, json_type_int) && !json_object_is_type(o, json_type_double))
        return LMH_ETYPE;
    *out = json_object_get_double(o);
    return LMH_OK;
}

static int host_cfg_bool(lmh_load_ctx *ld, const char *path, int *out) {
    json_object *o = cfg_get(ld, path);
    if (!o) return LMH_ENOTFOUND;
    if (!json_object_is_type(o, json_type_boolean)) return LMH_ETYPE;
    *out = json_object_get_boolean(o);
    return LMH_OK;
}

static int host_cfg_str(lmh_load_ctx *ld, const char *path, const char **out) {
    json_object *o = cfg_get(ld, path);
    if (!o) return LMH_ENOTFOUND;
    if (!json_object_is_type(o, json_type_string)) return LMH_ETYPE;
    *out = json_object_get_string(o);
    return LMH_OK;
}

static int host_cfg_len(lmh_load_ctx *ld, const char *path, int64_t *out) {
    json_object *o = cfg_get(ld, path);
    if (!o) return LMH_ENOTFOUND;
    if (!json_object_is_type(o, json_type_array)) return LMH_ETYPE;
    *out = (int64_t)json_object_array_length(o);
    return LMH_OK;
}

/* The language model's settings: the root of config.json, or its text_config where a
 * multimodal checkpoint nests them there. */
static json_object *text_config(const engine *e) {
    json_object *root = md_config(e->md), *t = cfg_lookup(root, "text_config");
    if (t && json_object_is_type(t, json_type_object) && !cfg_lookup(root, "rope_parameters") &&
        !cfg_lookup(root, "rope_theta") && !cfg_lookup(root, "hidden_size"))
        return t;
    return root;
}

static int host_rope_freqs(lmh_load_ctx *ld, const char *layer_type, int32_t rot_dims,
                           float *inv_freq, lmh_rope_info *info) {
    char err[512];
    if (rope_compute(text_config(ld->e), layer_type, rot_dims, inv_freq, info, err, sizeof err) !=
        0)
        return host_fail(ld, "%s", err);
    return LMH_OK;
}

static int host_rope_type(lmh_load_ctx *ld, const char *layer_type, const char **out) {
    const char *t = rope_type_name(text_config(ld->e), layer_type);
    if (!t) return LMH_ETYPE;
    *out = t;
    return LMH_OK;
}

static int host_rope_setting(lmh_load_ctx *ld, const char *layer_type, const char *key,
                             double *out) {
    char err[256];
    int rc = rope_setting(text_config(ld->e), layer_type, key, out, err, sizeof err);
    return rc < 0 ? LMH_ETYPE : rc ? LMH_ENOTFOUND : LMH_OK;
}

/* The first layer of each device's share of layers [0, n) (first[n_dev] = n): contiguous
 * shares in proportion to --tensor-split, else to each device's free memory (evenly where a
 * backend cannot tell), by largest remainders, at least one layer each. */
static int split_layers(engine *e, int32_t n, int32_t *first, char *err, size_t err_len) {
    const int nd = e->n_dev;
    double w[ENGINE_MAX_DEVICES], sum = 0;
    int by_memory = 1;
    for (int d = 0; d < nd; d++) by_memory &= e->share[d] <= 0;
    for (int d = 0; d < nd; d++) {
        w[d] = e->share[d];
        const lmh_backend_api *api = e->slots[d].api;
        uint64_t fr = 0, tot = 0;
        if (by_memory &&
            api->size >= offsetof(lmh_backend_api, device_memory) + sizeof api->device_memory &&
            api->device_memory && api->device_memory(e->slots[d].b, &fr, &tot) == LMH_OK)
            w[d] = (double)fr;
        else if (by_memory)
            w[d] = 1;
        sum += w[d];
    }
    if (n < nd) return errf(err, err_len, "%d layers cannot be split over %d devices", n, nd);
    if (!(sum > 0)) { /* every device says it has nothing free: evenly, and let loading tell */
        for (int d = 0; d < nd; d++) w[d] = 1;
        sum = nd;
    }
    int32_t cnt[ENGINE_MAX_DEVICES], given = 0;
    double rem[ENGINE_MAX_DEVICES];
    for (int d = 0; d < nd; d++) {
        double q = (double)n * w[d] / sum;
        cnt[d] = (int32_t)q;
        rem[d] = q - cnt[d];
        given += cnt[d];
    }
    while (given < n) { /* the largest remainders get the layers left */
        int best = 0;
        for (int d = 1; d < nd; d++)
            if (rem[d] > rem[best]) best = d;
        cnt[best]++;
        rem[best] = -1;
        given++;
    }
    for (int d = 0; d < nd; d++) /* every device one layer at least, from the largest */
        while (cnt[d] == 0) {
            int big = 0;
            for (int k = 1; k < nd; k++)
                if (cnt[k] > cnt[big]) big = k;
            cnt[big]--;
            cnt[d]++;
        }
    first[0] = 0;
    for (int d = 0; d < nd; d++) first[d + 1] = first[d] + cnt[d];
    log_msg(LMH_LOG_INFO, "layers split over %d devices (%s):", nd,
            by_memory ? "by free memory" : "by --tensor-split");
    for (int d = 0; d < nd; d++)
        log_msg(LMH_LOG_INFO, "  device %d: layers %d-%d (%.1f%%)", e->device[d], first[d],
                first[d + 1] - 1, 100.0 * w[d] / sum);
    return 0;
}

static int host_declare_model(lmh_load_ctx *ld, int32_t n_layers, int32_t vocab) {
    engine *e = ld->e;
    if (n_layers <= 0 || n_layers > 100000)
        return host_fail(ld, "config.json: bad layer count %d", n_layers);
    if (vocab <= 0) return host_fail(ld, "config.json: bad vocab_size %d", vocab);
    if (e->layers) return host_fail(ld, "declare_model called twice");
    e->layers = calloc((size_t)n_layers, sizeof *e->layers);
    e->rec = calloc((size_t)n_layers, sizeof *e->rec);
    if (!e->layers || !e->rec) return host_fail(ld, "out of memory");
    e->n_layers = n_layers;
    e->vocab = vocab;
    e->layer_slot = calloc((size_t)n_layers, sizeof *e->layer_slot);
    if (!e->layer_slot) return host_fail(ld, "out of memory");
    int32_t on_dev = e->gpu_layers >= 0 && e->gpu_layers < n_layers ? e->gpu_layers : n_layers;
    if (on_dev < n_layers) {
        /* the rest of the layers go to the CPU backend, in a slot of their own */
        char err[512];
        const int c = e->n_dev;
        if (e->n_slots <= c && start_backend(e, c, "cpu", 0, err, sizeof err) != 0)
            return host_fail(ld, "--gpu-layers: %s", err);
        e->n_slots = c + 1;
        for (int32_t l = on_dev; l < n_layers; l++) e->layer_slot[l] = c;
    }
    if (e->n_dev > 1) {
        int32_t first[ENGINE_MAX_DEVICES + 1];
        char err[512];
        if (split_layers(e, on_dev, first, err, sizeof err) != 0) return host_fail(ld, "%s", err);
        for (int d = 0; d < e->n_dev; d++)
            for (int32_t l = first[d]; l < first[d + 1]; l++) e->layer_slot[l] = d;
    }
    e->input_slot = e->layer_slot[0];
    e->output_slot = e->layer_slot[n_layers - 1];
    return LMH_OK;
}

static int host_declare_layer(lmh_load_ctx *ld, int32_t layer, const lmh_layer_state *st) {
    engine *e = ld->e;
    if (!e->layers) return host_fail(ld, "declare_layer before declare_model");
    if (layer < 0 || layer >= e->n_layers)
        return host_fail(ld, "declare_layer: layer %d out of range", layer);
    if (st->kind == LMH_STATE_KV &&
        (st->n_kv_heads <= 0 || st->head_dim_k <= 0 || st->head_dim_v <= 0 || st->window < 0))
        return host_fail(ld, "layer %d: bad attention state (kv heads %d, head dims %d/%d)", layer,
                         st->n_kv_heads, st->head_dim_k, st->head_dim_v);
    e->layers[layer] = *st;
    return LMH_OK;
}

static int host_declare_moe(lmh_load_ctx *ld, int32_t n_experts, int32_t top_k) {
    engine *e = ld->e;
    if (n_experts < 1 || top_k < 1 || top_k > n_experts)
        return host_fail(ld, "declare_moe: %d of %d experts", top_k, n_experts);
    if (e->moe_experts && (e->moe_experts != n_experts || e->moe_top_k != top_k))
        return host_fail(ld, "declare_moe: %d of %d experts, then %d of %d", e->moe_top_k,
                         e->moe_experts, top_k, n_experts);
    e->moe_experts = n_experts;
    e->moe_top_k = top_k;
    return LMH_OK;
}

static int host_declare_recurrent(lmh_load_ctx *ld, int32_t layer, const lmh_recurrent_state *st) {
    engine *e = ld->e;
    if (!e->layers) return host_fail(ld, "declare_recurrent before declare_model");
    if (layer < 0 || layer >= e->n_layers)
        return host_fail(ld, "declare_recurrent: layer %d out of range", layer);
    if (!st || st->size < sizeof *st || st->n_bufs < 1 || st->n_bufs > LMH_MAX_STATE_BUFS)
        return host_fail(ld, "layer %d: recurrent state needs 1 to %d buffers", layer,
                         LMH_MAX_STATE_BUFS);
    uint64_t bytes = 0;
    for (int32_t b = 0; b < st->n_bufs; b++) {
        const lmh_state_buf *sb = &st->buf[b];
        int ok = sb->dtype == LMH_F32 && sb->ndim >= 1 && sb->ndim <= LMH_MAX_DIMS;
        for (int i = 0; ok && i < sb->ndim; i++) ok = sb->ne[i] > 0 && sb->ne[i] < (1 << 30);
        if (!ok)
            return host_fail(ld,
                             "layer %d: recurrent state buffer %d must be f32 with 1 to %d "
                             "positive dimensions",
                             layer, b, LMH_MAX_DIMS);
        bytes += (uint64_t)lmh_state_buf_elems(sb) * sizeof(float);
    }
    if (bytes > ((uint64_t)1 << 33))
        return host_fail(ld, "layer %d: %llu bytes of recurrent state a sequence", layer,
                         (unsigned long long)bytes);
    if (!e->rec[layer].n_bufs) e->n_rec++;
    e->rec[layer] = *st;
    return LMH_OK;
}

static void shape_str(char *buf, size_t len, int32_t ndim, const int64_t *ne);

/* An MLX affine-quantized weight: X.weight (uint32 codes) with X.scales and X.biases. */
typedef struct qweight {
    const st_tensor *w, *scales, *biases;
    int bits, group;
    int32_t ndim;
    int64_t ne[LMH_MAX_DIMS]; /* logical: the packed width times 32 / bits */
    int mx;                   /* microscaled (mx_of): w the blocks, scales e8m0 bytes, no biases */
} qweight;

static int get_small_int(json_object *o, const char *key, int *out) {
    json_object *v = json_object_object_get(o, key);
    if (!v) return 0;
    if (!json_object_is_type(v, json_type_int)) return -1;
    int64_t x = json_object_get_int64(v);
    if (x < 0 || x > 1024) return -1;
    *out = (int)x;
    return 1;
}

/* Whether checkpoint tensor `name` is quantized: 1 (q filled), 0 (a plain tensor), or -1
 * after fail() for a malformed one. Settings: config.json "quantization" (or
 * "quantization_config"), with per-module overrides keyed by the module path holding
 * their own group_size/bits, or false for "not quantized". */
static int quant_of(lmh_load_ctx *ld, const char *name, qweight *q) {
    model_dir *md = ld->e->md;
    const st_tensor *t = md_find(md, name);
    size_t len = strlen(name);
    if (!t || len < 8 || len > 400 || strcmp(name + len - 7, ".weight") != 0) return 0;
    char base[408], sn[416], bn[416];
    snprintf(base, sizeof base, "%.*s", (int)(len - 7), name);
    snprintf(sn, sizeof sn, "%s.scales", base);
    snprintf(bn, sizeof bn, "%s.biases", base);
    const st_tensor *sc = md_find(md, sn), *bi = md_find(md, bn);
    if (!sc && !bi) return 0;
    json_object *cfg = md_config(md), *qc = cfg_lookup(cfg, "quantization");
    if (!qc) qc = cfg_lookup(cfg, "quantization_config");
    if (!qc || !json_object_is_type(qc, json_type_object)) {
        host_fail(ld, "tensor %s has %s beside it but config.json has no \"quantization\"", name,
                  sc ? sn : bn);
        return -1;
    }
    json_object *mode = json_object_object_get(qc, "mode");
    if (mode) {
        const char *m =
            json_object_is_type(mode, json_type_string) ? json_object_get_string(mode) : "";
        if (!strcmp(m, "mxfp4") || !strcmp(m, "nvfp4") || !strcmp(m, "mxfp8")) {
            host_fail(ld,
                      "config.json: quantization mode \"%s\" is not supported yet (only "
                      "\"affine\")",
                      m);
            return -1;
        }
        if (strcmp(m, "affine") != 0) {
            host_fail(ld, "config.json: unknown quantization mode \"%s\" (known: affine)", m);
            return -1;
        }
    }
    int bits = 0, group = 0;
    if (get_small_int(qc, "bits", &bits) != 1 || get_small_int(qc, "group_size", &group) != 1) {
        host_fail(ld, "config.json: quantization needs integer \"bits\" and \"group_size\"");
        return -1;
    }
    json_object *ov = json_object_object_get(qc, base);
    if (ov && json_object_is_type(ov, json_type_boolean)) {
        if (!json_object_get_boolean(ov)) return 0; /* this module is not quantized */
    } else if (ov && json_object_is_type(ov, json_type_object)) {
        if (get_small_int(ov, "bits", &bits) < 0 || get_small_int(ov, "group_size", &group) < 0) {
            host_fail(ld,
                      "config.json: quantization override for %s has a bad bits or "
                      "group_size",
                      base);
            return -1;
        }
    } else if (ov) {
        host_fail(ld, "config.json: quantization override for %s must be an object or false", base);
        return -1;
    }
    if (lmh_quant_dtype(bits) == LMH_DTYPE_COUNT || (group != 32 && group != 64 && group != 128)) {
        host_fail(ld,
                  "tensor %s: %d-bit groups of %d are not supported (bits 2, 3, 4, 5, 6, 8; "
                  "group_size 32, 64, 128)",
                  name, bits, group);
        return -1;
    }
    if (!sc || !bi) {
        host_fail(ld, "quantized tensor %s lacks %s", name, sc ? bn : sn);
        return -1;
    }
    if (t->dtype != LMH_U32) {
        host_fail(ld, "quantized tensor %s has dtype %s; packed weights must be u32", name,
                  lmh_dtype_name(t->dtype));
        return -1;
    }
    if ((sc->dtype != LMH_F32 && sc->dtype != LMH_F16 && sc->dtype != LMH_BF16) ||
        bi->dtype != sc->dtype) {
        host_fail(ld,
                  "quantized tensor %s: scales (%s) and biases (%s) must both be f32, f16 "
                  "or bf16",
                  name, lmh_dtype_name(sc->dtype), lmh_dtype_name(bi->dtype));
        return -1;
    }
    if (t->ndim != 2 && t->ndim != 3) {
        host_fail(ld, "quantized tensor %s has %d dimensions; 2 or 3 ([E,] out, packed)", name,
                  t->ndim);
        return -1;
    }
    int64_t in = t->ne[t->ndim - 1] * 32 / bits;
    int same = sc->ndim == t->ndim && bi->ndim == t->ndim && in > 0 && in % group == 0;
    for (int i = 0; same && i < t->ndim - 1; i++)
        same = sc->ne[i] == t->ne[i] && bi->ne[i] == t->ne[i] && t->ne[i] > 0;
    if (same) same = sc->ne[t->ndim - 1] == in / group && bi->ne[t->ndim - 1] == in / group;
    if (!same) {
        char ws[128], ss[128], bs[128];
        shape_str(ws, sizeof ws, t->ndim, t->ne);
        shape_str(ss, sizeof ss, sc->ndim, sc->ne);
        shape_str(bs, sizeof bs, bi->ndim, bi->ne);
        host_fail(ld,
                  "quantized tensor %s %s (%d-bit, groups of %d) does not match its scales "
                  "%s and biases %s",
                  name, ws, bits, group, ss, bs);
        return -1;
    }
    *q = (qweight){
        .w = t, .scales = sc, .biases = bi, .bits = bits, .group = group, .ndim = t->ndim};
    memcpy(q->ne, t->ne, sizeof q->ne);
    q->ne[t->ndim - 1] = in;
    return 1;
}

/* Whether checkpoint tensor `name` is stored as microscaled 4-bit blocks, name_blocks (u8
 * [.., out, in / 32, 16]) with name_scales (u8 [.., out, in / 32]) beside it, config.json's
 * "quantization_config" saying "quant_method": "mxfp4": 1 (q filled with the logical shape
 * [.., out, in]), 0 (no such pair), or -1 after fail() for a malformed one. */
static int mx_of(lmh_load_ctx *ld, const char *name, qweight *q) {
    model_dir *md = ld->e->md;
    size_t len = strlen(name);
    if (len > 400) return 0;
    char bn[416], sn[416];
    snprintf(bn, sizeof bn, "%s_blocks", name);
    snprintf(sn, sizeof sn, "%s_scales", name);
    const st_tensor *bt = md_find(md, bn), *sc = md_find(md, sn);
    if (!bt && !sc) return 0;
    if (!bt || !sc) {
        host_fail(ld, "microscaled tensor %s lacks %s", bt ? bn : sn, bt ? sn : bn);
        return -1;
    }
    json_object *qc = cfg_lookup(md_config(md), "quantization_config");
    json_object *qm = qc && json_object_is_type(qc, json_type_object)
                          ? json_object_object_get(qc, "quant_method")
                          : NULL;
    if (!qm || !json_object_is_type(qm, json_type_string) ||
        strcmp(json_object_get_string(qm), "mxfp4") != 0) {
        host_fail(ld,
                  "tensors %s and %s need config.json \"quantization_config\" with "
                  "\"quant_method\": \"mxfp4\"",
                  bn, sn);
        return -1;
    }
    int same = bt->dtype == LMH_U8 && sc->dtype == LMH_U8 && (bt->ndim == 3 || bt->ndim == 4) &&
               sc->ndim == bt->ndim - 1 && bt->ne[bt->ndim - 1] == 16;
    for (int i = 0; same && i < sc->ndim; i++) same = sc->ne[i] == bt->ne[i] && sc->ne[i] > 0;
    if (!same) {
        char bs[128], ss[128];
        shape_str(bs, sizeof bs, bt->ndim, bt->ne);
        shape_str(ss, sizeof ss, sc->ndim, sc->ne);
        host_fail(ld,
                  "microscaled tensor %s: blocks %s (%s) and scales %s (%s) must be u8 "
                  "[.., out, in/32, 16] and [.., out, in/32]",
                  name, bs, lmh_dtype_name(bt->dtype), ss, lmh_dtype_name(sc->dtype));
        return -1;
    }
    *q = (qweight){.w = bt, .scales = sc, .bits = 4, .group = 32, .ndim = sc->ndim, .mx = 1};
    memcpy(q->ne, sc->ne, sizeof q->ne);
    q->ne[sc->ndim - 1] = sc->ne[sc->ndim - 1] * 32;
    return 1;
}

/* A packed weight of either kind: quant_of, then mx_of (whose X has no tensor of its own). */
static int packed_of(lmh_load_ctx *ld, const char *name, qweight *q) {
    int rc = quant_of(ld, name, q);
    return rc ? rc : mx_of(ld, name, q);
}

static int host_weight_info(lmh_load_ctx *ld, const char *name, lmh_weight_info *out) {
    const st_tensor *t = md_find(ld->e->md, name);
    qweight q;
    if (!t) {
        int rc = mx_of(ld, name, &q);
        if (rc < 0) return LMH_ETYPE;
        if (!rc) return LMH_ENOTFOUND;
        out->dtype = LMH_MXFP4;
        out->ndim = q.ndim;
        memcpy(out->ne, q.ne, sizeof out->ne);
        return LMH_OK;
    }
    int rc = quant_of(ld, name, &q);
    if (rc < 0) return LMH_ETYPE;
    out->dtype = rc ? lmh_quant_dtype(q.bits) : t->dtype;
    out->ndim = t->ndim;
    memcpy(out->ne, rc ? q.ne : t->ne, sizeof out->ne);
    return LMH_OK;
}

static void shape_str(char *buf, size_t len, int32_t ndim, const int64_t *ne) {
    size_t o = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? ", " : "", (long long)ne[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
}

static htensor *track_weight(engine *e, htensor *t) {
    if (!t) return NULL;
    if (e->n_weights == e->cap_weights) {
        int cap = e->cap_weights ? e->cap_weights * 2 : 64;
        htensor **n = realloc(e->weights, (size_t)cap * sizeof *n);
        if (!n) return NULL;
        e->weights = n;
        e->cap_weights = cap;
    }
    e->weights[e->n_weights++] = t;
    return t;
}

/* A weight on the backend of `layer`: the mapped file itself where the backend computes
 * from host memory (no copy at load), else a device copy. */
static lmh_tensor *make_weight_from(lmh_load_ctx *ld, int32_t layer, lmh_dtype dt, int32_t ndim,
                                    const int64_t *ne, const void *data, const char *what,
                                    int lend) {
    engine *e = ld->e;
    int s = slot_of(e, layer);
    pl_slot *sl = &e->slots[s];
    size_t bytes = lmh_dtype_size(dt);
    for (int i = 0; i < ndim; i++) bytes *= (size_t)ne[i];
    /* (a file whose header length is not a multiple of 8 leaves data misaligned: copy it) */
    int aligned = ((uintptr_t)data % (lmh_dtype_size(dt) ? lmh_dtype_size(dt) : 1)) == 0;
    lmh_tensor *p = lend && sl->api->tensor_wrap && aligned
                        ? sl->api->tensor_wrap(sl->b, dt, ndim, ne, data)
                        : NULL;
    if (!p) {
        p = sl->api->tensor_new(sl->b, dt, ndim, ne, LMH_TENSOR_WEIGHT);
        if (!p) {
            host_fail(ld, "out of %s memory loading %s (%zu bytes)", sl->plugin->info->name, what,
                      bytes);
            return NULL;
        }
        if (sl->api->upload(sl->b, p, 0, data, bytes) != 0) {
            sl->api->tensor_free(sl->b, p);
            host_fail(ld, "upload of %s failed", what);
            return NULL;
        }
    }
    htensor *t = track_weight(e, pl_adopt(p, s, 1));
    if (!t) {
        sl->api->tensor_free(sl->b, p);
        host_fail(ld, "out of memory");
        return NULL;
    }
    e->weight_bytes += bytes;
    load_progress(e);
    return &t->pub;
}

static lmh_tensor *make_weight(lmh_load_ctx *ld, int32_t layer, lmh_dtype dt, int32_t ndim,
                               const int64_t *ne, const void *data, const char *what) {
    return make_weight_from(ld, layer, dt, ndim, ne, data, what, 1);
}

static const st_tensor *find_checked(lmh_load_ctx *ld, const char *name, int32_t ndim,
                                     const int64_t *ne) {
    const st_tensor *t = md_find(ld->e->md, name);
    if (!t) {
        host_fail(ld, "missing tensor %s in %s", name, md_path(ld->e->md));
        return NULL;
    }
    if (ndim > 0) {
        int same = t->ndim == ndim;
        for (int i = 0; same && i < ndim; i++) same = t->ne[i] == ne[i];
        if (!same) {
            char want[128], have[128];
            shape_str(want, sizeof want, ndim, ne);
            shape_str(have, sizeof have, t->ndim, t->ne);
            host_fail(ld, "shape mismatch for tensor %s: checkpoint has %s, config implies %s",
                      name, have, want);
            return NULL;
        }
    }
    if (t->dtype != LMH_F32 && t->dtype != LMH_F16 && t->dtype != LMH_BF16) {
        host_fail(ld, "tensor %s has dtype %s; weights must be f32, f16 or bf16", name,
                  lmh_dtype_name(t->dtype));
        return NULL;
    }
    return t;
}

/* A quantized weight on the backend of `layer`, the parts lent in place where the backend
 * can (the CPU backend keeps pointers into the mapped file). */
static lmh_tensor *make_qweight(lmh_load_ctx *ld, int32_t layer, const qweight *q,
                                const char *name) {
    engine *e = ld->e;
    int s = slot_of(e, layer);
    pl_slot *sl = &e->slots[s];
    if (sl->api->size < offsetof(lmh_backend_api, tensor_quant) + sizeof sl->api->tensor_quant ||
        !sl->api->tensor_quant || (q->mx && sl->plugin->info->abi_minor < 10)) {
        host_fail(ld, "backend %s cannot run %s weights (%s)", sl->plugin->info->name,
                  q->mx ? "microscaled 4-bit" : "quantized", name);
        return NULL;
    }
    size_t parts = (size_t)((q->w->end - q->w->begin) + (q->scales->end - q->scales->begin) +
                            (q->biases ? q->biases->end - q->biases->begin : 0));
    lmh_tensor *p =
        sl->api->tensor_quant(sl->b, q->mx ? LMH_MXFP4 : lmh_quant_dtype(q->bits), q->group,
                              q->ndim, q->ne, (const uint32_t *)q->w->data, q->scales->dtype,
                              q->scales->data, q->biases ? q->biases->data : NULL);
    if (!p) {
        host_fail(ld, "backend %s refused %s tensor %s (%zu bytes; out of memory or layout)",
                  sl->plugin->info->name, q->mx ? "microscaled 4-bit" : "quantized", name, parts);
        return NULL;
    }
    htensor *t = track_weight(e, pl_adopt(p, s, 1));
    if (!t) {
        sl->api->tensor_free(sl->b, p);
        host_fail(ld, "out of memory");
        return NULL;
    }
    t->pub.group = q->group;
    t->q = (pl_qsrc){.packed = (const uint32_t *)q->w->data,
                     .scales = q->scales->data,
                     .biases = q->biases ? q->biases->data : NULL,
                     .sb_dtype = q->scales->dtype};
    e->weight_bytes += parts;
    load_progress(e);
    return &t->pub;
}

/* ---- experts streamed from disk (engine_opts.stream_experts) ---------------------------- */

/* Whether a weight of logical shape ne is streamed: a stack of the experts the architecture
 * plugin declared (declare_moe), or any stack weight_stack makes. */
static int streams(const engine *e, int32_t ndim, const int64_t *ne, int stacked) {
    return e->xs && ndim == 3 && (stacked || (e->moe_experts && ne[0] == e->moe_experts));
}

/* Streamed experts of logical shape ne [E, out, in]: nothing is read now, only where each
 * expert's parts lie. parts[p] is part p's checkpoint tensor holding all E experts, or with
 * per_expert, parts[e * n_parts + p] expert e's alone. */
static lmh_tensor *stream_weight(lmh_load_ctx *ld, int32_t layer, lmh_dtype dt, lmh_dtype sbt,
                                 int32_t group, const int64_t *ne, int transposed, int n_parts,
                                 const st_tensor *const *parts, int per_expert, const char *name) {
    engine *e = ld->e;
    const int64_t E = ne[0];
    xs_desc d = {.layer = layer,
                 .slot = slot_of(e, layer),
                 .dtype = dt,
                 .sb_dtype = sbt,
                 .group = group,
                 .n_experts = E,
                 .out = ne[1],
                 .in = ne[2],
                 .transposed = transposed,
                 .n_parts = n_parts};
    xs_loc *loc = calloc((size_t)(E * n_parts), sizeof *loc);
    if (!loc) {
        host_fail(ld, "out of memory");
        return NULL;
    }
    for (int p = 0; p < n_parts; p++) {
        d.loc[p] = loc + p * E;
        for (int64_t x = 0; x < E; x++) {
            const st_tensor *t = parts[per_expert ? x * n_parts + p : p];
            uint64_t span = t->end - t->begin, off;
            size_t bytes = per_expert ? span : span / (uint64_t)E;
            if (!per_expert && span % (uint64_t)E) bytes = 0;
            if (!bytes || (x && bytes != d.part_bytes[p]) ||
                md_locate(e->md, t, &loc[p * E + x].path, &off) != 0) {
                free(loc);
                host_fail(ld,
                          "tensor %s cannot be streamed: its experts' bytes are not %lld "
                          "equal slices of a file",
                          t->name, (long long)E);
                return NULL;
            }
            d.part_bytes[p] = bytes;
            loc[p * E + x].off = off + (per_expert ? 0 : (uint64_t)x * bytes);
        }
    }
    char err[512];
    xs_tensor *xt = xs_add(e->xs, &d, err, sizeof err);
    free(loc);
    if (!xt) {
        host_fail(ld, "%s: %s", name, err);
        return NULL;
    }
    htensor *t = calloc(1, sizeof *t);
    if (!t || !track_weight(e, t)) {
        free(t);
        host_fail(ld, "out of memory");
        return NULL;
    }
    t->pub.dtype = dt;
    t->pub.ndim = 3;
    memcpy(t->pub.ne, ne, 3 * sizeof *ne);
    t->pub.group = group;
    t->pub.backend_priv = t;
    t->weight = 1;
    t->xs = xt;
    for (int p = 0; p < n_parts; p++) e->weight_bytes += d.part_bytes[p] * (uint64_t)E;
    load_progress(e);
    return &t->pub;
}

static lmh_tensor *stream_packed(lmh_load_ctx *ld, int32_t layer, const qweight *q,
                                 const char *name) {
    const st_tensor *parts[3] = {q->w, q->scales, q->biases};
    return stream_weight(ld, layer, q->mx ? LMH_MXFP4 : lmh_quant_dtype(q->bits), q->scales->dtype,
                         q->group, q->ne, 0, q->mx ? 2 : 3, parts, 0, name);
}

static lmh_tensor *host_weight(lmh_load_ctx *ld, int32_t layer, const char *name, int32_t ndim,
                               const int64_t *ne) {
    qweight q;
    int qr = packed_of(ld, name, &q);
    if (qr < 0) return NULL;
    if (qr) {
        int same = ndim <= 0 || q.ndim == ndim;
        for (int i = 0; same && ndim > 0 && i < ndim; i++) same = q.ne[i] == ne[i];
        if (!same) {
            char want[128], have[128];
            shape_str(want, sizeof want, ndim, ne);
            shape_str(have, sizeof have, q.ndim, q.ne);
            host_fail(ld,
                      "shape mismatch for tensor %s: checkpoint has %s (%s, %d-bit), "
                      "config implies %s",
                      name, have, q.mx ? "microscaled" : "quantized", q.bits, want);
            return NULL;
        }
        if (streams(ld->e, q.ndim, q.ne, 0)) return stream_packed(ld, layer, &q, name);
        return make_qweight(ld, layer, &q, name);
    }
    const st_tensor *t = find_checked(ld, name, ndim, ne);
    if (t && streams(ld->e, t->ndim, t->ne, 0))
        return stream_weight(ld, layer, t->dtype, LMH_F32, 0, t->ne, 0, 1, &t, 0, name);
    return t ? make_weight(ld, layer, t->dtype, t->ndim, t->ne, t->data, name) : NULL;
}

/* An input-major checkpoint tensor [.., in, out] as [.., out, in]: transposed in host
 * memory, then copied to the backend (the buffer is not the file's, so it is not lent). */
static lmh_tensor *host_weight_transposed(lmh_load_ctx *ld, int32_t layer, const char *name,
                                          int32_t ndim, const int64_t *ne) {
    qweight q;
    int qr = quant_of(ld, name, &q);
    if (qr) {
        if (qr > 0)
            host_fail(ld,
                      "tensor %s is quantized (%d-bit); only float tensors can be loaded "
                      "transposed",
                      name, q.bits);
        return NULL;
    }
    const st_tensor *t = md_find(ld->e->md, name);
    if (!t) {
        host_fail(ld, "missing tensor %s in %s", name, md_path(ld->e->md));
        return NULL;
    }
    if (t->ndim < 2) {
        host_fail(ld, "tensor %s has %d dimensions; a transposed load needs at least 2", name,
                  t->ndim);
        return NULL;
    }
    int64_t sw[LMH_MAX_DIMS]; /* the stored shape of what ne asks for */
    if (ndim > 0) {
        if (ndim < 2 || ndim > LMH_MAX_DIMS) {
            host_fail(ld, "weight_transposed: bad rank %d for %s", ndim, name);
            return NULL;
        }
        memcpy(sw, ne, (size_t)ndim * sizeof *ne);
        sw[ndim - 2] = ne[ndim - 1];
        sw[ndim - 1] = ne[ndim - 2];
    }
    if (!(t = find_checked(ld, name, ndim, sw))) return NULL;
    const int32_t nd = t->ndim;
    const int64_t R = t->ne[nd - 2], C = t->ne[nd - 1];
    if (nd == 3 && streams(ld->e, 3, (int64_t[]){t->ne[0], C, R}, 0))
        return stream_weight(ld, layer, t->dtype, LMH_F32, 0, (int64_t[]){t->ne[0], C, R}, 1, 1, &t,
                             0, name);
    int64_t mats = 1;
    for (int i = 0; i < nd - 2; i++) mats *= t->ne[i];
    const size_t es = lmh_dtype_size(t->dtype), bytes = (size_t)(mats * R * C) * es;
    uint8_t *buf = malloc(bytes ? bytes : 1);
    if (!buf) {
        host_fail(ld, "out of memory transposing %s (%zu bytes)", name, bytes);
        return NULL;
    }
    const uint8_t *src = t->data;
    for (int64_t m = 0; m < mats; m++) {
        const uint8_t *a = src + (size_t)(m * R * C) * es;
        uint8_t *o = buf + (size_t)(m * R * C) * es;
        for (int64_t r = 0; r < R; r++)
            for (int64_t c = 0; c < C; c++)
                memcpy(o + (size_t)(c * R + r) * es, a + (size_t)(r * C + c) * es, es);
    }
    int64_t tne[LMH_MAX_DIMS];
    memcpy(tne, t->ne, sizeof tne);
    tne[nd - 2] = C;
    tne[nd - 1] = R;
    lmh_tensor *w = make_weight_from(ld, layer, t->dtype, nd, tne, buf, name, 0);
    free(buf);
    return w;
}

static lmh_tensor *host_weight_stack(lmh_load_ctx *ld, int32_t layer, const char *fmt,
                                     int32_t count, int32_t ndim, const int64_t *ne) {
    engine *e = ld->e;
    if (count <= 0 || ndim < 1 || ndim >= LMH_MAX_DIMS) {
        host_fail(ld, "weight_stack: bad count %d or rank %d", count, ndim);
        return NULL;
    }
    int s = slot_of(e, layer);
    pl_slot *sl = &e->slots[s];
    int64_t sne[LMH_MAX_DIMS] = {count};
    memcpy(sne + 1, ne, (size_t)ndim * sizeof *ne);
    if (streams(e, ndim + 1, sne, 1)) { /* each expert's tensor stays where it is */
        const st_tensor **parts = calloc((size_t)count, sizeof *parts);
        if (!parts) {
            host_fail(ld, "out of memory");
            return NULL;
        }
        lmh_tensor *w = NULL;
        int ok = 1;
        for (int32_t i = 0; ok && i < count; i++) {
            char name[512];
            snprintf(name, sizeof name, fmt, i);
            qweight q;
            int qr = quant_of(ld, name, &q);
            if (qr > 0)
                host_fail(ld,
                          "tensor %s: quantized per-expert tensors are not supported; "
                          "quantized experts must be stacked (switch_mlp)",
                          name);
            ok = !qr && (parts[i] = find_checked(ld, name, ndim, ne)) != NULL;
            if (ok && parts[i]->dtype != parts[0]->dtype) {
                host_fail(ld, "tensor %s is %s; the others of its stack are %s", name,
                          lmh_dtype_name(parts[i]->dtype), lmh_dtype_name(parts[0]->dtype));
                ok = 0;
            }
        }
        if (ok) w = stream_weight(ld, layer, parts[0]->dtype, LMH_F32, 0, sne, 0, 1, parts, 1, fmt);
        free(parts);
        return w;
    }
    lmh_tensor *p = NULL;
    size_t slice = 0;
    for (int32_t i = 0; i < count; i++) {
        char name[512];
        snprintf(name, sizeof name, fmt, i);
        qweight q;
        int qr = quant_of(ld, name, &q);
        if (qr) {
            if (qr > 0)
                host_fail(ld,
                          "tensor %s: quantized per-expert tensors are not supported; "
                          "quantized experts must be stacked (switch_mlp)",
                          name);
            goto bad;
        }
        const st_tensor *st = find_checked(ld, name, ndim, ne);
        if (!st) goto bad;
        if (!p) {
            slice = lmh_dtype_size(st->dtype);
            for (int d = 0; d < ndim; d++) slice *= (size_t)ne[d];
            p = sl->api->tensor_new(sl->b, st->dtype, ndim + 1, sne, LMH_TENSOR_WEIGHT);
            if (!p) {
                host_fail(ld, "out of backend memory stacking %s (%d x %zu bytes)", fmt, count,
                          slice);
                goto bad;
            }
        } else if (st->dtype != p->dtype) {
            host_fail(ld, "tensor %s is %s; the others of its stack are %s", name,
                      lmh_dtype_name(st->dtype), lmh_dtype_name(p->dtype));
            goto bad;
        }
        if (sl->api->upload(sl->b, p, (size_t)i * slice, st->data, slice) != 0) {
            host_fail(ld, "upload of %s failed", name);
            goto bad;
        }
    }
    htensor *t = track_weight(e, pl_adopt(p, s, 1));
    if (!t) {
        host_fail(ld, "out of memory");
        goto bad;
    }
    e->weight_bytes += slice * (size_t)count;
    load_progress(e);
    return &t->pub;
bad:
    if (p) sl->api->tensor_free(sl->b, p);
    return NULL;
}

static lmh_tensor *host_constant(lmh_load_ctx *ld, int32_t layer, lmh_dtype dtype, int32_t ndim,
                                 const int64_t *ne, const void *data) {
    if (ndim < 1 || ndim > LMH_MAX_DIMS) {
        host_fail(ld, "constant with %d dims", ndim);
        return NULL;
    }
    /* Copied: the plugin's buffer need not outlive the call, and a CPU backend must not
     * keep a pointer into it. */
    size_t bytes = lmh_dtype_size(dtype);
    for (int i = 0; i < ndim; i++) bytes *= (size_t)ne[i];
    engine *e = ld->e;
    int s = slot_of(e, layer);
    htensor *t = pl_new(e->slots, s, dtype, ndim, ne, LMH_TENSOR_WEIGHT);
    if (!t || e->slots[s].api->upload(e->slots[s].b, t->phys[s], 0, data, bytes) != 0 ||
        !track_weight(e, t)) {
        pl_free(e->slots, t);
        host_fail(ld, "cannot allocate a constant of %zu bytes", bytes);
        return NULL;
    }
    return &t->pub;
}

/* ---- forward-pass services ------------------------------------------------------- */

static void fwd_failf(lmh_fwd *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fwd_failf(lmh_fwd *f, const char *fmt, ...) {
    if (f->failed) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->err, sizeof f->err, fmt, ap);
    va_end(ap);
    f->failed = 1;
    /* every allocation failure of a pass says so ("out of memory", "out of vulkan memory") */
    f->oom = strstr(f->err, "out of") && strstr(f->err, "memory");
}

static htensor *fwd_track(lmh_fwd *f, htensor *t) {
    if (!t) return NULL;
    if (f->n_tmp == f->cap_tmp) {
        int cap = f->cap_tmp ? f->cap_tmp * 2 : 256;
        htensor **n = realloc(f->tmp, (size_t)cap * sizeof *n);
        if (!n) {
            pl_free(f->e->slots, t);
            return NULL;
        }
        f->tmp = n;
        f->cap_tmp = cap;
    }
    f->tmp[f->n_tmp++] = t;
    return t;
}

static lmh_tensor *host_fwd_tensor(lmh_fwd *f, int32_t layer, lmh_dtype dtype, int32_t ndim,
                                   const int64_t *ne) {
    if (ndim < 1 || ndim > LMH_MAX_DIMS) {
        fwd_failf(f, "scratch tensor with %d dims", ndim);
        return NULL;
    }
    htensor *t = fwd_track(f, pl_new(f->e->slots, slot_of(f->e, layer), dtype, ndim, ne, 0));
    if (!t) {
        fwd_failf(f, "out of backend memory for a %dD scratch tensor", ndim);
        return NULL;
    }
    return &t->pub;
}

static lmh_tensor *host_fwd_view(lmh_fwd *f, lmh_tensor *t, int64_t offset, int32_t ndim,
                                 const int64_t *ne) {
    if (!t) return NULL;
    if (HT(t)->xs) {
        fwd_failf(f, "experts streamed from disk cannot be viewed (only an expert product "
                     "reads them)");
        return NULL;
    }
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= ne[i];
    if (ndim < 1 || ndim > LMH_MAX_DIMS || offset < 0 || n < 0 || offset + n > lmh_nelem(t)) {
        fwd_failf(f, "view of %lld elements at %lld exceeds a tensor of %lld", (long long)n,
                  (long long)offset, (long long)lmh_nelem(t));
        return NULL;
    }
    htensor *v = fwd_track(f, pl_view(HT(t), (size_t)offset * lmh_dtype_size(t->dtype), ndim, ne));
    if (!v) fwd_failf(f, "out of memory for a view");
    return v ? &v->pub : NULL;
}

/* *op as the architecture plugin built it: one built before ABI 1.7 passes a struct that
 * ends before src_more, which is then read as empty. */
static void op_copy(const engine *e, const lmh_op *op, lmh_op *p) {
    memset(p, 0, sizeof *p);
    memcpy(p, op, e->arch_p->info->abi_minor >= 7 ? sizeof *p : offsetof(lmh_op, src_more));
}

static int host_fwd_op(lmh_fwd *f, int32_t layer, const lmh_op *op);

/* engine_trace: a layer's last result is its output (the residual stream after it, in
 * every family so far); copy it aside before the next layer's ops can overwrite it. */
static void trace_layer_end(lmh_fwd *f, int32_t next_layer) {
    const int32_t l = f->last_layer;
    lmh_tensor *d = f->last_dst;
    f->last_layer = next_layer;
    if (l < 0 || l == next_layer || !d || d->dtype != LMH_F32) return;
    lmh_tensor *t = host_fwd_tensor(f, l, LMH_F32, d->ndim, d->ne);
    lmh_op cp = {.code = LMH_OP_COPY, .dst = t, .src = {d}};
    lmh_tensor **traced = f->traced;
    f->traced = NULL; /* the copy itself is not traced */
    if (t && host_fwd_op(f, l, &cp) == LMH_OK) traced[l] = t;
    f->traced = traced;
}

/* engine_embed: the input of a product into the logits is the hidden state wanted; it is
 * copied aside (the architecture may reuse its scratch) and the product is not run. */
static int embed_take(lmh_fwd *f, int32_t layer, const lmh_op *op) {
    lmh_tensor *x = op->src[0];
    if (op->code != LMH_OP_MATMUL) return LMH_OK; /* a soft cap or scale of the logits */
    if (!x || x->dtype != LMH_F32 || x->ndim != 2 || x->ne[0] != f->n_out) {
        fwd_failf(f,
                  "embeddings: the product into the logits does not read f32 [%d, width] "
                  "hidden states",
                  f->n_out);
        return LMH_EINVAL;
    }
    lmh_tensor *t = host_fwd_tensor(f, layer, LMH_F32, 2, x->ne);
    lmh_op cp = {.code = LMH_OP_COPY, .dst = t, .src = {x}};
    if (!t || host_fwd_op(f, layer, &cp) != LMH_OK) return LMH_EINVAL;
    f->emb_hidden = HT(t); /* the last such product counts */
    return LMH_OK;
}

static htensor *ht_root(lmh_tensor *t) {
    return HT(t)->base ? HT(t)->base : HT(t);
}

/* Rows [r0, r0 + n) of a backend tensor, as a backend view (the caller frees it). */
static lmh_tensor *row_view(const pl_slot *sl, lmh_tensor *t, int32_t r0, int32_t n);

/* An expert product over experts streamed from disk: the expert ids come back to the host
 * (a sync point), the experts they name are made resident, and the product runs on the
 * resident stack with the ids mapped to its slots, over row ranges whose experts fit in
 * it (one range but in long prefills). */
static int stream_moe(lmh_fwd *f, int32_t layer, const lmh_op *op) {
    engine *e = f->e;
    htensor *w = HT(op->src[1]), *idt = op->src[2] ? HT(op->src[2]) : NULL;
    lmh_tensor *x = op->src[0], *dst = op->dst;
    const int s = slot_of(e, layer);
    const pl_slot *sl = &e->slots[s];
    if (!idt || !x || idt->pub.dtype != LMH_I32 || idt->pub.ndim != 2 ||
        x->ne[0] != idt->pub.ne[0] || dst->ndim != 3 || dst->ne[0] != x->ne[0] ||
        dst->ne[1] != idt->pub.ne[1] || dst->ne[2] != w->pub.ne[1] || x == dst) {
        fwd_failf(f, "bad operands for an expert product over streamed experts");
        return LMH_EINVAL;
    }
    const int64_t n = idt->pub.ne[0], k = idt->pub.ne[1], nk = n * k, E = xs_n_experts(w->xs);
    char why[256] = "out of memory";
    int prefetch = 0;
    if (f->xs_ids_of != idt) {
        if ((size_t)nk > f->xs_ids_cap) {
            int32_t *a = realloc(f->xs_ids, (size_t)nk * sizeof *a);
            if (a) f->xs_ids = a;
            int32_t *m = a ? realloc(f->xs_map, (size_t)nk * sizeof *m) : NULL;
            if (m) f->xs_map = m;
            if (!a || !m) {
                fwd_failf(f, "out of memory");
                return LMH_ENOMEM;
            }
            f->xs_ids_cap = (size_t)nk;
        }
        lmh_tensor *pi = pl_on_why(e->slots, idt, s, 0, why, sizeof why);
        if (!pi || sl->api->download(sl->b, pi, 0, f->xs_ids, (size_t)nk * sizeof(int32_t))) {
            fwd_failf(f, "reading the expert ids back failed: %s", pi ? "download" : why);
            return LMH_EINVAL;
        }
        f->xs_ids_of = idt;
        prefetch = f->pred_ids != NULL;
    }
    lmh_tensor *px = pl_on_why(e->slots, HT(x), s, 0, why, sizeof why);
    lmh_tensor *pd = px ? pl_on_why(e->slots, HT(dst), s, 1, why, sizeof why) : NULL;
    uint32_t *seen = calloc((size_t)E, sizeof *seen);
    if (!px || !pd || !seen) {
        free(seen);
        fwd_failf(f, "cannot place the operands of moe_matmul on %s: %s", sl->plugin->info->name,
                  why);
        f->oom = 1;
        return LMH_ENOMEM;
    }
    const int32_t cap = xs_slots(w->xs);
    int rc = LMH_OK;
    for (int64_t r0 = 0, chunk = 1; r0 < n && rc == LMH_OK; chunk++) {
        int64_t r1 = r0, distinct = 0;
        for (; r1 < n; r1++) { /* the rows whose experts, with those before, fit the stack */
            int64_t add = 0;
            for (int64_t j = 0; j < k; j++) {
                int32_t id = f->xs_ids[r1 * k + j];
                if (id < 0 || id >= E) {
                    add = -1;
                    break;
                }
                if (seen[id] != (uint32_t)chunk) {
                    seen[id] = (uint32_t)chunk;
                    add++;
                }
            }
            if (add < 0) {
                r1 = r0;
                break;
            }
            if (distinct + add > cap && r1 > r0) break; /* the next range's (a new stamp) */
            distinct += add;
        }
        if (r1 == r0) r1 = r0 + 1; /* bad ids or one row past the stack: xs_resident says */
        char err[512];
        lmh_tensor *stack = xs_resident(e->xs, w->xs, e->slots, f->xs_ids + r0 * k, (r1 - r0) * k,
                                        f->xs_map + r0 * k, err, sizeof err);
        if (!stack) {
            fwd_failf(f, "%s", err);
            rc = LMH_EINVAL;
            break;
        }
        if (prefetch) { /* the next layer's predicted experts, read after this one's */
            prefetch = 0;
            htensor *pt = f->pred_ids;
            const int64_t pn = lmh_nelem(&pt->pub);
            int32_t *pid = malloc((size_t)pn * sizeof *pid);
            lmh_tensor *pp = pl_on_why(e->slots, pt, s, 0, why, sizeof why);
            if (pid && pp && !sl->api->download(sl->b, pp, 0, pid, (size_t)pn * sizeof *pid))
                xs_prefetch(e->xs, f->pred_layer, s, pid, pn);
            free(pid);
            f->pred_ids = NULL;
        }
        const int whole = r0 == 0 && r1 == n;
        int64_t mne[2] = {r1 - r0, k};
        lmh_tensor *mid = sl->api->tensor_new(sl->b, LMH_I32, 2, mne, 0);
        lmh_tensor *vx = whole ? px : row_view(sl, px, (int32_t)r0, (int32_t)(r1 - r0));
        lmh_tensor *vd = whole ? pd : row_view(sl, pd, (int32_t)r0, (int32_t)(r1 - r0));
        lmh_op p;
        op_copy(e, op, &p);
        p.src[0] = vx;
        p.src[1] = stack;
        p.src[2] = mid;
        p.dst = vd;
        if (!mid || !vx || !vd ||
            sl->api->upload(sl->b, mid, 0, f->xs_map + r0 * k,
                            (size_t)((r1 - r0) * k) * sizeof(int32_t))) {
            fwd_failf(f, "out of %s memory for an expert product", sl->plugin->info->name);
            f->oom = 1;
            rc = LMH_ENOMEM;
        } else if ((rc = sl->api->enqueue(sl->b, &p)) != LMH_OK) {
            fwd_failf(f, "backend %s cannot run op moe_matmul over streamed experts (%d)",
                      sl->plugin->info->name, rc);
        }
        if (!whole && vx) sl->api->tensor_free(sl->b, vx);
        if (!whole && vd) sl->api->tensor_free(sl->b, vd);
        if (mid) sl->api->tensor_free(sl->b, mid);
        r0 = r1;
    }
    free(seen);
    if (rc != LMH_OK) return rc;
    pl_written(HT(dst), s);
    e->mm_flops += 2 * (uint64_t)lmh_nelem(dst) * (uint64_t)lmh_inner(x);
    return LMH_OK;
}

/* Reads of the next streamed layer's experts can start before that layer routes: its router
 * applied to this layer's router input (the residual stream changes little from one layer to
 * the next) predicts its choice. Enqueued right after this layer's routing, read back with
 * it, and handed to xs_prefetch after this layer's own misses. */
static void predict_next(lmh_fwd *f, int32_t layer, const lmh_op *route) {
    engine *e = f->e;
    int32_t next = -1;
    for (int32_t l = layer + 1; l < e->n_layers && next < 0; l++)
        if (xs_layer_streams(e->xs, l)) next = l;
    if (!f->predict_pass || next < 0 || !e->routers[next].set ||
        slot_of(e, next) != slot_of(e, layer) || f->pred_ids)
        return;
    const xs_router *r = &e->routers[next];
    lmh_tensor *x = f->last_mm.src[0];
    if (!x || x->ndim != 2 || x->ne[1] != r->mm.src[1]->ne[1]) return;
    int64_t lne[2] = {x->ne[0], r->n_experts}, kne[2] = {x->ne[0], r->k};
    lmh_tensor **traced = f->traced; /* not a layer's result */
    f->traced = NULL;
    f->predicting = 1;
    lmh_tensor *lg = host_fwd_tensor(f, layer, LMH_F32, 2, lne),
               *w = host_fwd_tensor(f, layer, LMH_F32, 2, kne),
               *ids = host_fwd_tensor(f, layer, LMH_I32, 2, kne);
    lmh_op mm = r->mm, rt = r->route;
    mm.dst = lg;
    mm.src[0] = x;
    rt.dst = w;
    rt.src[0] = lg;
    rt.src[1] = ids;
    rt.src[2] = route->src[2]; /* the rows' experts per token */
    if (lg && w && ids && host_fwd_op(f, layer, &mm) == LMH_OK &&
        host_fwd_op(f, layer, &rt) == LMH_OK) {
        f->pred_ids = HT(ids);
        f->pred_layer = next;
    }
    f->predicting = 0;
    f->traced = traced;
}

/* Streamed experts: keeps each layer's router as this pass runs it, and predicts from it. */
static void track_router(lmh_fwd *f, int32_t layer, const lmh_op *op) {
    engine *e = f->e;
    if (op->code == LMH_OP_MATMUL) {
        f->last_mm = *op;
        f->last_mm_layer = layer;
        return;
    }
    if (op->code != LMH_OP_MOE_ROUTE || layer < 0 || layer >= e->n_layers ||
        f->last_mm_layer != layer || f->last_mm.dst != op->src[0] || !op->src[0] || !op->dst ||
        !f->last_mm.src[1])
        return;
    xs_router *r = &e->routers[layer];
    r->mm = f->last_mm;
    r->mm.src[0] = r->mm.dst = NULL; /* the pass's */
    r->route = *op;
    r->route.src[0] = r->route.src[1] = r->route.src[2] = r->route.dst = NULL;
    r->n_experts = op->src[0]->ne[1];
    r->k = op->dst->ne[1];
    r->set = 1;
    predict_next(f, layer, op);
}

static int host_fwd_op(lmh_fwd *f, int32_t layer, const lmh_op *op) {
    engine *e = f->e;
    if (f->failed) return LMH_EINVAL;
    if (!op->dst) {
        fwd_failf(f, "op %s without a destination", lmh_op_name(op->code));
        return LMH_EINVAL;
    }
    if (f->emb_logits && op->dst == f->emb_logits) return embed_take(f, layer, op);
    if (f->traced) {
        if (layer != f->last_layer) trace_layer_end(f, layer);
        f->last_dst = op->dst;
    }
    if (f->xs_ids_of && (ht_root(op->dst) == ht_root(&f->xs_ids_of->pub) ||
                         (op->code == LMH_OP_MOE_ROUTE && op->src[1] &&
                          ht_root(op->src[1]) == ht_root(&f->xs_ids_of->pub))))
        f->xs_ids_of = NULL; /* the ids read back are about to change */
    if (op->code == LMH_OP_MOE_MATMUL && op->src[1] && HT(op->src[1])->xs)
        return stream_moe(f, layer, op);
    int s = slot_of(e, layer);
    lmh_op p;
    op_copy(e, op, &p);
    char why[256] = "out of memory";
    const int nsrc = lmh_op_n_src(p.code);
    int in_place = 0;
    for (int i = 0; i < nsrc; i++) {
        lmh_tensor *t = lmh_op_src(&p, i), *on;
        if (!t) continue;
        if (HT(t)->xs) {
            fwd_failf(f,
                      "experts streamed from disk can only be an expert product's experts "
                      "(op %s)",
                      lmh_op_name(op->code));
            return LMH_EUNSUPPORTED;
        }
        if (!(on = pl_on_why(e->slots, HT(t), s, 0, why, sizeof why))) goto oom;
        lmh_op_set_src(&p, i, on);
        in_place |= t == op->dst;
    }
    lmh_tensor *sinks = lmh_op_attn_sinks(&p); /* (ABI 1.10) an operand past src[] */
    if (sinks) {
        if (e->slots[s].plugin->info->abi_minor < 10) {
            fwd_failf(f, "backend %s (plugin ABI 1.%u) cannot run attention sinks (ABI 1.10)",
                      e->slots[s].plugin->info->name, e->slots[s].plugin->info->abi_minor);
            return LMH_EUNSUPPORTED;
        }
        if (!(p.src_more[0] = pl_on_why(e->slots, HT(sinks), s, 0, why, sizeof why))) goto oom;
    }
    if (!(p.dst = pl_on_why(e->slots, HT(op->dst), s, !in_place, why, sizeof why))) goto oom;
    int rc = e->slots[s].api->enqueue(e->slots[s].b, &p);
    if (rc != 0) {
        fwd_failf(f, "backend %s cannot run op %s (%s)", e->slots[s].plugin->info->name,
                  lmh_op_name(op->code),
                  rc == LMH_EUNSUPPORTED ? "unsupported"
                  : rc == LMH_ENOMEM     ? "out of memory"
                                         : "bad operands");
        return rc;
    }
    pl_written(HT(op->dst), s);
    if (op->code == LMH_OP_MOE_ROUTE && op->src[1]) pl_written(HT(op->src[1]), s);
    /* dense and expert products alike: each output element is `in` multiply-adds */
    if ((op->code == LMH_OP_MATMUL || op->code == LMH_OP_MOE_MATMUL) && op->src[0])
        e->mm_flops += 2 * (uint64_t)lmh_nelem(op->dst) * (uint64_t)lmh_inner(op->src[0]);
    if (e->routers && !f->predicting) track_router(f, layer, op);
    return LMH_OK;
oom:
    fwd_failf(f, "cannot place the operands of %s on %s: %s", lmh_op_name(op->code),
              e->slots[s].plugin->info->name, why);
    f->oom = 1;
    return LMH_ENOMEM;
}

/* Rows [r0, r0 + n) of a backend tensor, as a backend view (the caller frees it). */
static lmh_tensor *row_view(const pl_slot *sl, lmh_tensor *t, int32_t r0, int32_t n) {
    int64_t ne[LMH_MAX_DIMS], row = 1;
    for (int i = 1; i < t->ndim; i++) row *= t->ne[i];
    memcpy(ne, t->ne, sizeof ne);
    ne[0] = n;
    return sl->api->tensor_view(sl->b, t, (size_t)(r0 * row) * lmh_dtype_size(t->dtype), t->dtype,
                                t->ndim, ne);
}

/* Frees the views in v[0..3) that were made (NULL where not). */
static void free_views(const pl_slot *sl, lmh_tensor *const v[3]) {
    for (int j = 0; j < 3; j++)
        if (v[j]) sl->api->tensor_free(sl->b, v[j]);
}

/* Fails the pass for cache ec's error rc on layer `layer` (held by slot s); returns rc. */
static int cache_failed(lmh_fwd *f, const ecache *ec, int32_t layer, int s, int rc) {
    engine *e = f->e;
    if (rc == LMH_ENOMEM)
        fwd_failf(f, "cache %s failed on layer %d: out of %s memory", ec->spec.p->info->name, layer,
                  e->slots[s].plugin->info->name);
    else
        fwd_failf(f, "cache %s failed on layer %d (error %d)", ec->spec.p->info->name, layer, rc);
    return rc;
}

static int host_fwd_attention(lmh_fwd *f, int32_t layer, lmh_tensor *q, lmh_tensor *k,
                              lmh_tensor *v, lmh_tensor *out, const lmh_attn_params *p) {
    engine *e = f->e;
    if (f->failed) return LMH_EINVAL;
    if (layer < 0 || layer >= e->n_layers || e->layers[layer].kind != LMH_STATE_KV) {
        fwd_failf(f, "attention on layer %d, which declared no attention state", layer);
        return LMH_EINVAL;
    }
    if (!q || !k || !v || !out || !p) return LMH_EINVAL;
    int s = slot_of(e, layer);
    const pl_slot *sl = &e->slots[s];
    lmh_tensor *pq = pl_on(e->slots, HT(q), s, 0), *pk = pl_on(e->slots, HT(k), s, 0),
               *pv = pl_on(e->slots, HT(v), s, 0), *pp = pl_on(e->slots, f->positions, s, 0),
               *po = pl_on(e->slots, HT(out), s, 0);
    if (!pq || !pk || !pv || !pp || !po) {
        fwd_failf(f, "out of backend memory for attention operands");
        return LMH_ENOMEM;
    }
    /* the arch plugin's params as it knows them: sinks from ABI 1.10 on */
    lmh_attn_params ap = {0};
    /* (an older struct ends at window: the padding before sinks is not the plugin's) */
    memcpy(&ap, p,
           e->arch_p->info->abi_minor >= 10 ? sizeof ap
                                            : offsetof(lmh_attn_params, window) + sizeof ap.window);
    if (ap.sinks) {
        const plugin *bp = sl->plugin;
        if (bp->info->abi_minor < 10) {
            fwd_failf(f,
                      "layer %d has attention sinks, which backend %s (plugin ABI 1.%u) "
                      "cannot run (ABI 1.10 added them)",
                      layer, bp->info->name, bp->info->abi_minor);
            return LMH_EUNSUPPORTED;
        }
        if (lmh_nelem(ap.sinks) != q->ne[1] || ap.sinks->dtype != LMH_F32) {
            fwd_failf(f, "layer %d: attention sinks must be f32 [%lld] (one a head)", layer,
                      (long long)q->ne[1]);
            return LMH_ESHAPE;
        }
        if (!(ap.sinks = pl_on(e->slots, HT(ap.sinks), s, 0))) {
            fwd_failf(f, "out of backend memory for attention sinks");
            return LMH_ENOMEM;
        }
        for (int i = 0; i < f->n_segs; i++) {
            const plugin *cp = e->caches[f->segs[i].ci].spec.p;
            if (cp->info->abi_minor < 10) {
                fwd_failf(f,
                          "layer %d has attention sinks, which cache plugin %s (plugin ABI "
                          "1.%u) cannot apply (ABI 1.10 added them); use a newer build",
                          layer, cp->info->name, cp->info->abi_minor);
                return LMH_EUNSUPPORTED;
            }
        }
    }
    p = &ap;
    int32_t ll = e->local[s][layer];
    /* Each sequence's rows go to its own entry of its own cache (a step may mix caches):
     * every sequence's append first, then every attend, so that a backend may run the
     * sequences' attention side by side rather than each behind its own append (on a GPU, a
     * dependent step per sequence). */
    for (int i = 0; i < f->n_segs; i++) {
        const seg *g = &f->segs[i];
        const ecache *ec = &e->caches[g->ci];
        lmh_tensor *vk = row_view(sl, pk, g->r0, g->n), *vv = row_view(sl, pv, g->r0, g->n);
        int rc = vk && vv ? ec->api->append(ec->c[s], g->seq, ll, vk, vv) : LMH_ENOMEM;
        free_views(sl, (lmh_tensor *[]){vk, vv, NULL});
        if (rc) return cache_failed(f, ec, layer, s, rc);
    }
    for (int i = 0; i < f->n_segs; i++) {
        const seg *g = &f->segs[i];
        const ecache *ec = &e->caches[g->ci];
        lmh_tensor *vq = row_view(sl, pq, g->r0, g->n), *vo = row_view(sl, po, g->r0, g->n),
                   *vp = row_view(sl, pp, g->r0, g->n);
        int rc = vq && vo && vp ? ec->api->attend(ec->c[s], g->seq, ll, vq, vp, vo, p) : LMH_ENOMEM;
        free_views(sl, (lmh_tensor *[]){vq, vo, vp});
        if (rc) return cache_failed(f, ec, layer, s, rc);
    }
    pl_written(HT(out), s);
    return LMH_OK;
}

static int has_recur(const lmh_cache_api *c) {
    return c->size >= offsetof(lmh_cache_api, state_load) + sizeof c->state_load && c->recur &&
           c->state_size && c->state_save && c->state_load;
}

static int host_fwd_recurrent(lmh_fwd *f, int32_t layer, int32_t buf, const lmh_op *op) {
    engine *e = f->e;
    if (f->failed) return LMH_EINVAL;
    if (!op || !op->dst) return LMH_EINVAL;
    const int st = lmh_op_state_src(op->code);
    if (st < 0) {
        fwd_failf(f, "fwd_recurrent: op %s keeps no state", lmh_op_name(op->code));
        return LMH_EINVAL;
    }
    if (layer < 0 || layer >= e->n_layers || buf < 0 || buf >= e->rec[layer].n_bufs) {
        fwd_failf(f, "recurrent op %s on layer %d buffer %d, which the layer did not declare",
                  lmh_op_name(op->code), layer, buf);
        return LMH_EINVAL;
    }
    if (lmh_op_src(op, st)) {
        fwd_failf(f, "recurrent op %s on layer %d: its state operand must be left NULL",
                  lmh_op_name(op->code), layer);
        return LMH_EINVAL;
    }
    int s = slot_of(e, layer);
    const pl_slot *sl = &e->slots[s];
    lmh_op p;
    op_copy(e, op, &p);
    const unsigned rows = lmh_op_row_srcs(p.code);
    char why[256] = "out of memory";
    lmh_tensor *phys[LMH_OP_MAX_OPERANDS] = {0};
    for (int i = 0; i < LMH_OP_MAX_OPERANDS; i++) {
        lmh_tensor *t = lmh_op_src(&p, i);
        if (!t) continue;
        if ((rows >> i & 1u) && t->ne[0] != op->dst->ne[0]) {
            fwd_failf(f, "recurrent op %s: operand %d has %lld rows, dst %lld",
                      lmh_op_name(op->code), i, (long long)t->ne[0], (long long)op->dst->ne[0]);
            return LMH_ESHAPE;
        }
        if (!(phys[i] = pl_on_why(e->slots, HT(t), s, 0, why, sizeof why))) goto oom;
    }
    lmh_tensor *pd = pl_on_why(e->slots, HT(op->dst), s, 1, why, sizeof why);
    if (!pd) goto oom;
    if (op->dst->ne[0] != f->n_rows) {
        fwd_failf(f, "recurrent op %s: dst has %lld rows; the pass has %d", lmh_op_name(op->code),
                  (long long)op->dst->ne[0], f->n_rows);
        return LMH_ESHAPE;
    }
    int32_t ll = e->local[s][layer];
    /* each sequence's rows with its own state, in the order of the pass */
    for (int i = 0; i < f->n_segs; i++) {
        const seg *g = &f->segs[i];
        const ecache *ec = &e->caches[g->ci];
        lmh_op o = p;
        lmh_tensor *views[LMH_OP_MAX_OPERANDS + 1] = {0};
        int ok = (views[0] = row_view(sl, pd, g->r0, g->n)) != NULL;
        o.dst = views[0];
        for (int j = 0; j < LMH_OP_MAX_OPERANDS; j++) {
            lmh_tensor *t = phys[j];
            if (t && (rows >> j & 1u))
                ok &= (t = views[j + 1] = row_view(sl, t, g->r0, g->n)) != NULL;
            lmh_op_set_src(&o, j, t);
        }
        int rc = ok ? ec->api->recur(ec->c[s], g->seq, ll, buf, &o) : LMH_ENOMEM;
        for (int j = 0; j <= LMH_OP_MAX_OPERANDS; j++)
            if (views[j]) sl->api->tensor_free(sl->b, views[j]);
        if (rc) return cache_failed(f, ec, layer, s, rc);
    }
    pl_written(HT(op->dst), s);
    return LMH_OK;
oom:
    fwd_failf(f, "cannot place the operands of %s on %s: %s", lmh_op_name(op->code),
              sl->plugin->info->name, why);
    return LMH_ENOMEM;
}

const lmh_host_api host_api = {
    .size = sizeof(lmh_host_api),
    .abi_minor = LMH_ABI_MINOR,
    .log = host_log,
    .fail = host_fail,
    .cfg_int = host_cfg_int,
    .cfg_float = host_cfg_float,
    .cfg_bool = host_cfg_bool,
    .cfg_str = host_cfg_str,
    .cfg_len = host_cfg_len,
    .rope_freqs = host_rope_freqs,
    .rope_type = host_rope_type,
    .rope_setting = host_rope_setting,
    .declare_model = host_declare_model,
    .declare_layer = host_declare_layer,
    .weight_info = host_weight_info,
    .weight = host_weight,
    .weight_stack = host_weight_stack,
    .constant = host_constant,
    .fwd_tensor = host_fwd_tensor,
    .fwd_view = host_fwd_view,
    .fwd_op = host_fwd_op,
    .fwd_attention = host_fwd_attention,
    .declare_recurrent = host_declare_recurrent,
    .fwd_recurrent = host_fwd_recurrent,
    .weight_transposed = host_weight_transposed,
    .declare_moe = host_declare_moe,
};

/* ---- engine ------------------------------------------------------------------------ */

static void cache_close(ecache *ec) {
    for (int s = 0; s < PL_MAX_SLOTS; s++)
        if (ec->c[s]) ec->api->destroy(ec->c[s]);
    memset(ec, 0, sizeof *ec);
}

static void free_caches(engine *e) {
    for (int i = 0; i < ENGINE_MAX_CACHES; i++)
        if (e->caches[i].api) cache_close(&e->caches[i]);
    for (int s = 0; s < PL_MAX_SLOTS; s++) {
        free(e->local[s]);
        e->local[s] = NULL;
    }
    free(e->seqs);
    e->seqs = NULL;
    e->n_seqs = e->cap_seqs = 0;
}

static void pend_free(engine *e, pend_step *p) {
    if (p->ticket) { /* the backend's copy ends with its wait */
        int so = e->output_slot;
        e->slots[so].api->download_wait(e->slots[so].b, p->ticket, NULL, 0);
    }
    if (p->ids) pl_free(e->slots, p->ids);
    free(p->host);
    memset(p, 0, sizeof *p);
}

void engine_close(engine *e) {
    if (!e) return;
    for (int i = 0; i < e->n_pend; i++) pend_free(e, &e->pend[i]);
    free_caches(e);
    if (e->model) e->arch->unload(e->model);
    xs_free(e->xs, e->slots);
    free(e->routers);
    for (int i = e->n_weights - 1; i >= 0; i--) pl_free(e->slots, e->weights[i]);
    free(e->weights);
    for (int s = 0; s < PL_MAX_SLOTS; s++) stop_backend(e, s);
    free(e->layers);
    free(e->rec);
    free(e->layer_slot);
    for (int32_t l = 0; e->trace_data && l < e->n_layers; l++) free(e->trace_data[l]);
    free(e->trace_data);
    free(e->trace_dims);
    md_close(e->md);
    free(e);
}

/* Each slot's map of global layers to its caches' layers (the layers placed there). */
static int make_locals(engine *e) {
    for (int s = 0; s < e->n_slots; s++) {
        if (!(e->local[s] = malloc((size_t)e->n_layers * sizeof *e->local[s]))) return -1;
        int32_t n = 0;
        for (int32_t l = 0; l < e->n_layers; l++) e->local[s][l] = e->layer_slot[l] == s ? n++ : -1;
    }
    return 0;
}

/* ec's instance on slot s for the layers of slot map_slot's layer map. Returns an LMH_E*
 * code (err set) or 0. */
static int make_cache(engine *e, ecache *ec, int s, int map_slot, char *err, size_t err_len) {
    const plugin *p = ec->spec.p;
    if (e->n_rec && !has_recur(ec->api)) {
        errf(err, err_len,
             "cache plugin %s keeps no recurrent state (built for plugin ABI 1.%u; 1.7 added "
             "it), which this model's layers need",
             p->info->name, p->info->abi_minor);
        return LMH_EUNSUPPORTED;
    }
    lmh_layer_state *ls = calloc((size_t)e->n_layers, sizeof *ls);
    lmh_recurrent_state *rs = calloc((size_t)e->n_layers, sizeof *rs);
    if (!ls || !rs) {
        free(ls);
        free(rs);
        errf(err, err_len, "out of memory");
        return LMH_ENOMEM;
    }
    int32_t n = 0;
    for (int32_t l = 0; l < e->n_layers; l++)
        if (e->local[map_slot][l] >= 0) {
            rs[n] = e->rec[l];
            ls[n++] = e->layers[l];
        }
    lmh_cache_config cc = {.size = sizeof cc,
                           .format = ec->spec.format,
                           .options = ec->spec.options[0] ? ec->spec.options : NULL,
                           .n_layers = n,
                           .layers = ls,
                           .max_seq_len = e->max_seq_len,
                           .recurrent = e->n_rec ? rs : NULL};
    char cerr[512] = "";
    int rc = ec->api->create(&host_api, e->slots[s].api, e->slots[s].b, &cc, &ec->c[s], cerr,
                             sizeof cerr);
    free(ls);
    free(rs);
    if (rc != 0 || !ec->c[s]) {
        ec->c[s] = NULL;
        errf(err, err_len, "cache %s failed to start on %s: %s", p->info->name,
             e->slots[s].plugin->info->name, cerr);
        return rc < 0 ? rc : LMH_EINVAL;
    }
    return 0;
}

/* What makes two specs one cache: "plugin:format,settings". */
static void spec_key(const cache_spec *cs, char *key, size_t len) {
    snprintf(key, len, "%s:%s,%s", cs->p->info->name, cs->format, cs->options);
}

/* Starts the cache spec cs names in *ec, on every slot; on failure nothing is left. */
static int cache_start(engine *e, ecache *ec, const cache_spec *cs, char *err, size_t err_len) {
    memset(ec, 0, sizeof *ec);
    ec->spec = *cs;
    ec->api = cs->p->info->api;
    spec_key(cs, ec->key, sizeof ec->key);
    /* the format's name, with its plugin's where that name alone means another plugin's */
    char bare[sizeof cs->format + sizeof cs->options + 8];
    cache_spec_name(cs, bare, sizeof bare);
    cache_spec chk;
    if (cache_spec_parse(e->reg, bare, &chk, NULL, 0) == 0 && chk.p == cs->p)
        snprintf(ec->name, sizeof ec->name, "%s", bare);
    else
        snprintf(ec->name, sizeof ec->name, "%.31s:%s", cs->p->info->name, bare);
    for (int s = 0; s < e->n_slots; s++) {
        int rc = make_cache(e, ec, s, s, err, err_len);
        if (rc) {
            cache_close(ec);
            return rc;
        }
    }
    return 0;
}

static int seq_find(const engine *e, uint64_t seq) {
    for (int i = 0; i < e->n_seqs; i++)
        if (e->seqs[i].seq == seq) return i;
    return -1;
}

/* The cache sequence seq lives in, or NULL. */
static ecache *cache_of(engine *e, uint64_t seq) {
    int i = seq_find(e, seq);
    return i < 0 ? NULL : &e->caches[e->seqs[i].ci];
}

/* Positions of seq in ec, as the cache of its first layer with state says. */
static int32_t ec_seq_len(const engine *e, const ecache *ec, uint64_t seq) {
    int s = e->first_state >= 0 ? e->layer_slot[e->first_state] : 0;
    return ec->api->seq_len(ec->c[s], seq);
}

/* The mode a backend took (EXACT for those built before ABI 1.9). */
static int32_t slot_precision(const pl_slot *sl) {
    const lmh_backend_api *api = sl->api;
    if (api->size < offsetof(lmh_backend_api, precision) + sizeof api->precision || !api->precision)
        return LMH_PRECISION_EXACT;
    return api->precision(sl->b);
}

static void describe_chain(engine *e) {
    e->precision[0] = 0;
    for (int s = 0; s < e->n_slots; s++) {
        const char *m = slot_precision(&e->slots[s]) == LMH_PRECISION_FAST ? "fast" : "exact";
        if (s && strcmp(e->precision, m) == 0) continue; /* "fast+fast" says nothing more */
        size_t o = strlen(e->precision);
        snprintf(e->precision + o, sizeof e->precision - o, "%s%s", s ? "+" : "", m);
    }
    char be[1024] = "";
    for (int s = 0; s < e->n_slots; s++) {
        const pl_slot *sl = &e->slots[s];
        const char *d = sl->api->describe ? sl->api->describe(sl->b) : sl->plugin->info->name;
        int32_t first = -1, last = -1;
        for (int32_t l = 0; l < e->n_layers; l++)
            if (e->layer_slot[l] == s) {
                if (first < 0) first = l;
                last = l;
            }
        size_t o = strlen(be);
        if (e->n_slots == 1)
            snprintf(be + o, sizeof be - o, "%s", d);
        else
            snprintf(be + o, sizeof be - o, "%s%s[layers %d-%d]", s ? "+" : "", d, first, last);
    }
    snprintf(e->chain, sizeof e->chain, "arch=%s backend=%s cache=%s(%s) precision=%s",
             e->arch_p->info->name, be, e->caches[0].spec.p->info->name, e->caches[0].spec.format,
             e->precision);
}

const char *engine_precision(const engine *e) {
    return e->precision;
}

/* The directory's pooling (engine_embed_pooling). A malformed one is kept as an error for
 * engine_embed to report: the model serves everything else. */
static void read_pooling(engine *e, const char *dir) {
    int mp;
    int64_t dim;
    e->pooling = ENGINE_POOL_MEAN;
    if (md_read_pooling(dir, &mp, &dim, e->pool_err, sizeof e->pool_err) != 0) {
        e->pooling = -1;
    } else if (dim && dim != engine_embed_dim(e)) {
        snprintf(e->pool_err, sizeof e->pool_err,
                 "%s: its pooling's word_embedding_dimension is %lld; the model's hidden states "
                 "have %d values",
                 dir, (long long)dim, engine_embed_dim(e));
        e->pooling = -1;
    } else if (mp != MD_POOL_NONE) {
        e->pooling = mp == MD_POOL_LAST  ? ENGINE_POOL_LAST
                     : mp == MD_POOL_CLS ? ENGINE_POOL_CLS
                                         : ENGINE_POOL_MEAN;
    }
    if (e->pooling < 0)
        log_msg(LMH_LOG_INFO, "embeddings need a pooling given: %s", e->pool_err);
    else if (mp != MD_POOL_NONE)
        log_msg(LMH_LOG_DEBUG, "embeddings pool by %s (the model's sentence-transformers pooling)",
                engine_pooling_name(e->pooling));
}

engine *engine_open(const registry *reg, const engine_opts *o, char *err, size_t err_len) {
    engine *e = calloc(1, sizeof *e);
    if (!e) {
        errf(err, err_len, "out of memory");
        return NULL;
    }
    e->reg = reg;
    e->gpu_layers = o->gpu_layers;
    e->bopts = (lmh_backend_opts){.size = sizeof e->bopts,
                                  .threads = o->threads,
                                  .device = o->device,
                                  .precision = o->precision};
    char merr[1024];
    e->md = md_open(o->model_dir, merr, sizeof merr);
    if (!e->md) {
        errf(err, err_len, "%s", merr);
        goto fail;
    }
    e->progress = o->progress;
    e->progress_ctx = o->progress_ctx;
    e->load_total = md_weight_bytes(e->md);
    load_progress(e);
    json_object *mt = cfg_lookup(md_config(e->md), "model_type");
    if (!mt || !json_object_is_type(mt, json_type_string)) {
        errf(err, err_len, "%s/config.json has no model_type string", o->model_dir);
        goto fail;
    }
    const char *model_type = json_object_get_string(mt);
    e->arch_p = registry_find_arch(reg, model_type);
    if (!e->arch_p) {
        char *known = registry_names(reg, LMH_KIND_ARCH, 1);
        errf(err, err_len, "unknown model type '%s' (known: %s)", model_type,
             known && *known ? known : "none: no architecture plugin was found");
        free(known);
        goto fail;
    }
    e->arch = e->arch_p->info->api;
    cache_spec cs;
    if (cache_spec_parse(reg, o->cache, &cs, err, err_len) != 0) goto fail;

    /* --gpu-layers 0 is the CPU backend alone */
    const char *bname = o->backend ? o->backend : "cpu";
    e->n_dev = 1;
    e->device[0] = o->device;
    if (o->n_devices > ENGINE_MAX_DEVICES) {
        errf(err, err_len, "%d devices: at most %d", o->n_devices, ENGINE_MAX_DEVICES);
        goto fail;
    }
    if (o->n_devices > 0) {
        e->n_dev = o->n_devices;
        for (int d = 0; d < e->n_dev; d++) {
            e->device[d] = o->devices[d];
            e->share[d] = o->tensor_split[d];
        }
    }
    if (e->gpu_layers == 0) {
        bname = "cpu";
        e->gpu_layers = -1;
        e->n_dev = 1;
        e->device[0] = 0;
    }
    for (int d = 0; d < e->n_dev; d++) {
        if (start_backend(e, d, bname, e->device[d], err, err_len) != 0) goto fail;
        e->n_slots = d + 1;
    }

    if (o->stream_experts) {
        uint64_t budget =
            o->expert_cache_bytes > 0 ? (uint64_t)o->expert_cache_bytes : util_mem_available() / 2;
        if (!(e->xs = xs_new(budget, 8))) { /* reads in flight: enough for an SSD's queue */
            errf(err, err_len, "out of memory");
            goto fail;
        }
    }
    lmh_load_ctx ld = {.e = e};
    if (e->arch->load(&host_api, &ld, &e->model) != 0 || ld.failed || !e->model) {
        errf(err, err_len, "%s: %s", o->model_dir,
             ld.failed ? ld.err : "architecture plugin failed without a reason");
        goto fail;
    }
    if (!e->layers) {
        errf(err, err_len, "architecture plugin %s did not declare the model",
             e->arch_p->info->name);
        goto fail;
    }
    if (o->moe_top_k && (!e->moe_top_k || o->moe_top_k > e->moe_top_k)) {
        if (e->moe_top_k)
            errf(err, err_len, "--moe-top-k %d: the model routes each token to %d experts at most",
                 o->moe_top_k, e->moe_top_k);
        else
            errf(err, err_len,
                 "--moe-top-k: architecture plugin %s declares no experts whose number a token "
                 "uses could change",
                 e->arch_p->info->name);
        goto fail;
    }
    e->moe_k_default = o->moe_top_k;
    if (e->xs) {
        xs_stats xst;
        xs_get_stats(e->xs, &xst);
        if (!xst.n_weights) {
            log_msg(LMH_LOG_WARN, "--stream-experts: %s has no stacked experts to stream",
                    o->model_dir);
            xs_free(e->xs, e->slots);
            e->xs = NULL;
        } else if (xs_plan(e->xs, e->moe_top_k, merr, sizeof merr) != 0) {
            errf(err, err_len, "%s", merr);
            goto fail;
        } else if (!(e->routers = calloc((size_t)e->n_layers, sizeof *e->routers))) {
            errf(err, err_len, "out of memory");
            goto fail;
        } else {
            log_msg(LMH_LOG_INFO,
                    "streaming %d expert weights (%.1f MiB) with %.1f MiB resident per backend",
                    xst.n_weights, (double)xst.expert_bytes / (1 << 20),
                    (double)xst.budget_bytes / (1 << 20));
        }
    }
    e->first_kv = -1;
    for (int32_t l = 0; l < e->n_layers && e->first_kv < 0; l++)
        if (e->layers[l].kind == LMH_STATE_KV) e->first_kv = l;
    e->first_state = e->first_kv;
    for (int32_t l = 0; l < e->n_layers && e->first_state < 0; l++)
        if (e->rec[l].n_bufs) e->first_state = l;

    e->max_seq_len = o->max_seq_len;
    if (!e->max_seq_len) {
        json_object *m = cfg_lookup(text_config(e), "max_position_embeddings");
        if (m && json_object_is_type(m, json_type_int)) e->max_seq_len = json_object_get_int(m);
    }
    if (make_locals(e) != 0) {
        errf(err, err_len, "out of memory");
        goto fail;
    }
    if (cache_start(e, &e->caches[0], &cs, err, err_len) != 0) goto fail;
    describe_chain(e);
    read_pooling(e, o->model_dir);
    if (e->progress) e->progress(e->progress_ctx, e->load_total, e->load_total);
    e->progress = NULL;
    return e;
fail:
    if (e->progress) e->progress(e->progress_ctx, ENGINE_LOAD_FAILED, e->load_total);
    engine_close(e);
    return NULL;
}

const char *engine_arch_file(const engine *e) {
    return e->arch_p->file;
}

int32_t engine_vocab(const engine *e) {
    return e->vocab;
}
int32_t engine_n_layers(const engine *e) {
    return e->n_layers;
}
json_object *engine_config(const engine *e) {
    return md_config(e->md);
}
const char *engine_chain(const engine *e) {
    return e->chain;
}

void engine_get_stats(engine *e, engine_stats *s) {
    memset(s, 0, sizeof *s);
    s->weight_bytes = e->weight_bytes;
    for (int32_t l = 0; l < e->n_layers; l++)
        for (int32_t b = 0; b < e->rec[l].n_bufs; b++)
            s->state_seq_bytes += (uint64_t)lmh_state_buf_elems(&e->rec[l].buf[b]) * sizeof(float);
    s->mm_flops = e->mm_flops;
    s->cache_read_counted = 1;
    for (int i = 0; i < ENGINE_MAX_CACHES; i++) {
        const ecache *ec = &e->caches[i];
        const lmh_cache_api *ca = ec->api;
        if (!ca) continue;
        int counted = ca->size >= offsetof(lmh_cache_api, bytes_read) + sizeof ca->bytes_read &&
                      ca->bytes_read;
        s->cache_read_counted &= counted;
        engine_cache_stats *cs = &s->cache[s->n_caches++];
        snprintf(cs->name, sizeof cs->name, "%s", ec->name);
        snprintf(cs->plugin, sizeof cs->plugin, "%s", ec->spec.p->info->name);
        cs->index = i;
        cs->seqs = ec->n_seqs;
        for (int sl = 0; sl < e->n_slots; sl++) {
            if (ca->bytes && ec->c[sl]) cs->bytes += ca->bytes(ec->c[sl]);
            if (counted && ec->c[sl]) cs->read_bytes += ca->bytes_read(ec->c[sl]);
        }
        s->cache_bytes += cs->bytes;
        s->cache_read_bytes += cs->read_bytes;
    }
    if (e->xs) {
        xs_stats x;
        xs_get_stats(e->xs, &x);
        s->experts = (engine_expert_stats){.streamed = 1,
                                           .budget_bytes = x.budget_bytes,
                                           .expert_bytes = x.expert_bytes,
                                           .resident_bytes = x.resident_bytes,
                                           .stack_bytes = x.stack_bytes,
                                           .hits = x.hits,
                                           .misses = x.misses,
                                           .prefetched = x.prefetched,
                                           .ahead = x.ahead,
                                           .ahead_used = x.ahead_used,
                                           .reads = x.reads,
                                           .read_bytes = x.read_bytes,
                                           .read_busy_s = x.read_busy_s,
                                           .depth_mean =
                                               x.read_busy_s > 0 ? x.depth_time / x.read_busy_s : 0,
                                           .depth_max = x.depth_max,
                                           .depth_now = x.depth_now};
    }
    for (int i = 0; i < e->n_slots; i++) {
        lmh_backend_mem m = {0};
        if (e->slots[i].api->memory) e->slots[i].api->memory(e->slots[i].b, &m);
        s->backend_bytes += m.weights + m.other;
        s->weight_read_bytes += m.weight_bytes_read;
        if (i < ENGINE_MAX_BACKENDS) {
            snprintf(s->backend[i].name, sizeof s->backend[i].name, "%s",
                     e->slots[i].plugin->info->name);
            s->backend[i].weights = m.weights;
            s->backend[i].other = m.other;
            s->backend[i].mapped = m.mapped;
            s->backend[i].device = i < e->n_dev ? e->device[i] : 0;
            s->backend[i].first_layer = s->backend[i].last_layer = -1;
            for (int32_t l = 0; l < e->n_layers; l++)
                if (e->layer_slot[l] == i) {
                    if (s->backend[i].first_layer < 0) s->backend[i].first_layer = l;
                    s->backend[i].last_layer = l;
                }
            s->n_backends = i + 1;
        }
    }
}

int engine_backend_read_bandwidth(engine *e, int i, double *bytes_per_s) {
    if (i < 0 || i >= e->n_slots) return LMH_EINVAL;
    const lmh_backend_api *api = e->slots[i].api;
    if (api->size < offsetof(lmh_backend_api, read_bandwidth) + sizeof api->read_bandwidth ||
        !api->read_bandwidth)
        return LMH_EUNSUPPORTED;
    return api->read_bandwidth(e->slots[i].b, bytes_per_s);
}

int engine_backend_compute_peak(engine *e, int i, double *flop_per_s, char *what, size_t what_len) {
    if (i < 0 || i >= e->n_slots) return LMH_EINVAL;
    const lmh_backend_api *api = e->slots[i].api;
    if (api->size < offsetof(lmh_backend_api, compute_peak) + sizeof api->compute_peak ||
        !api->compute_peak)
        return LMH_EUNSUPPORTED;
    if (what_len) what[0] = 0;
    return api->compute_peak(e->slots[i].b, flop_per_s, what, what_len);
}

int engine_cache_open(engine *e, const char *spec, char *err, size_t err_len) {
    cache_spec cs;
    if (cache_spec_parse(e->reg, spec, &cs, err, err_len) != 0) return LMH_EINVAL;
    char key[sizeof e->caches[0].key];
    spec_key(&cs, key, sizeof key);
    int room = -1;
    for (int i = 0; i < ENGINE_MAX_CACHES; i++) {
        if (e->caches[i].api && strcmp(e->caches[i].key, key) == 0) return i;
        if (!e->caches[i].api && room < 0) room = i;
    }
    /* full: a cache no sequence uses (not the default) gives way, once the new one runs */
    int idle = -1;
    for (int i = 1; i < ENGINE_MAX_CACHES && room < 0 && idle < 0; i++)
        if (!e->caches[i].n_seqs) idle = i;
    if (room < 0 && idle < 0) {
        errf(err, err_len, "cache %s: the %d caches open are all in use", spec ? spec : "plain",
             ENGINE_MAX_CACHES);
        return LMH_ENOMEM;
    }
    ecache nc;
    int rc = cache_start(e, &nc, &cs, err, err_len);
    if (rc) return rc;
    if (room < 0) {
        log_msg(LMH_LOG_INFO, "cache %s closes (no sequence uses it) to make room for %s",
                e->caches[idle].name, nc.name);
        cache_close(&e->caches[idle]);
        room = idle;
    }
    e->caches[room] = nc;
    return room;
}

int engine_seq_add_in(engine *e, uint64_t seq, int cache) {
    if (cache < 0 || cache >= ENGINE_MAX_CACHES || !e->caches[cache].api || seq_find(e, seq) >= 0)
        return LMH_EINVAL;
    if (e->n_seqs == e->cap_seqs) {
        int cap = e->cap_seqs ? e->cap_seqs * 2 : 16;
        seq_ent *n = realloc(e->seqs, (size_t)cap * sizeof *n);
        if (!n) return LMH_ENOMEM;
        e->seqs = n;
        e->cap_seqs = cap;
    }
    ecache *ec = &e->caches[cache];
    for (int s = 0; s < e->n_slots; s++) {
        int rc = ec->api->seq_add(ec->c[s], seq);
        if (rc != 0) {
            while (--s >= 0) ec->api->seq_remove(ec->c[s], seq);
            return rc;
        }
    }
    e->seqs[e->n_seqs++] = (seq_ent){.seq = seq, .ci = cache};
    ec->n_seqs++;
    return 0;
}

int32_t engine_moe_top_k(const engine *e, int32_t *n_experts) {
    if (n_experts) *n_experts = e->moe_experts;
    return e->moe_top_k;
}

int engine_seq_moe_top_k(engine *e, uint64_t seq, int32_t k) {
    if (!e->moe_top_k) return LMH_EUNSUPPORTED;
    int i = seq_find(e, seq);
    if (i < 0 || k < 0 || k > e->moe_top_k) return LMH_EINVAL;
    e->seqs[i].moe_k = k;
    return 0;
}

int engine_seq_add(engine *e, uint64_t seq) {
    return engine_seq_add_in(e, seq, 0);
}

int engine_seq_cache(const engine *e, uint64_t seq) {
    int i = seq_find(e, seq);
    return i < 0 ? -1 : e->seqs[i].ci;
}

void engine_seq_remove(engine *e, uint64_t seq) {
    int i = seq_find(e, seq);
    if (i < 0) return;
    ecache *ec = &e->caches[e->seqs[i].ci];
    for (int s = 0; s < e->n_slots; s++) ec->api->seq_remove(ec->c[s], seq);
    ec->n_seqs--;
    e->seqs[i] = e->seqs[--e->n_seqs];
}

int32_t engine_seq_len(engine *e, uint64_t seq) {
    const ecache *ec = cache_of(e, seq);
    return ec ? ec_seq_len(e, ec, seq) : -1;
}

int engine_seq_prompt(engine *e, uint64_t seq, int32_t n) {
    int i = seq_find(e, seq);
    int32_t len = engine_seq_len(e, seq);
    if (i < 0 || len < 0 || n < 0) return LMH_EINVAL;
    e->seqs[i].prompt_end = n > 0 ? len + n : 0;
    return 0;
}

int engine_seq_trim(engine *e, uint64_t seq, int32_t len) {
    ecache *ec = cache_of(e, seq);
    if (!ec) return LMH_EINVAL;
    e->seqs[seq_find(e, seq)].prompt_end = 0;
    /* recurrent state cannot go back but to 0: the caches leave it unusable until a
     * snapshot is restored, and the caller hears of it */
    int rc = e->n_rec && len > 0 && len < ec_seq_len(e, ec, seq) ? LMH_EUNSUPPORTED : 0;
    for (int s = 0; s < e->n_slots; s++) {
        int r = ec->api->seq_trim(ec->c[s], seq, len);
        if (r && !rc) rc = r;
    }
    return rc;
}

struct engine_snapshot {
    int32_t len;
    int with_kv;
    int n_slots;
    char key[256]; /* the cache's (ecache.key): state reads back only into the same */
    char name[ENGINE_CACHE_NAME];
    uint64_t bytes[PL_MAX_SLOTS];
    void *state[PL_MAX_SLOTS]; /* each slot's cache's state_save; NULL: the length alone */
};

void engine_snapshot_free(engine_snapshot *sn) {
    if (!sn) return;
    for (int s = 0; s < PL_MAX_SLOTS; s++) free(sn->state[s]);
    free(sn);
}

int32_t engine_snapshot_len(const engine_snapshot *sn) {
    return sn->len;
}

uint64_t engine_snapshot_bytes(const engine_snapshot *sn) {
    uint64_t n = 0;
    for (int s = 0; s < sn->n_slots; s++) n += sn->bytes[s];
    return n;
}

engine_snapshot *engine_seq_snapshot(engine *e, uint64_t seq, int with_kv, char *err,
                                     size_t err_len) {
    if (e->n_pend) {
        errf(err, err_len, "%d started steps are not finished", e->n_pend);
        return NULL;
    }
    ecache *ec = cache_of(e, seq);
    int32_t len = ec ? ec_seq_len(e, ec, seq) : -1;
    if (len < 0) {
        errf(err, err_len, "unknown sequence %llu", (unsigned long long)seq);
        return NULL;
    }
    const int saves = has_recur(ec->api);
    if (!saves && with_kv) {
        errf(err, err_len, "cache plugin %s takes no snapshots (plugin ABI 1.7)",
             ec->spec.p->info->name);
        return NULL;
    }
    engine_snapshot *sn = calloc(1, sizeof *sn);
    if (!sn) {
        errf(err, err_len, "out of memory");
        return NULL;
    }
    *sn = (engine_snapshot){.len = len, .with_kv = with_kv, .n_slots = e->n_slots};
    snprintf(sn->key, sizeof sn->key, "%s", ec->key);
    snprintf(sn->name, sizeof sn->name, "%s", ec->name);
    for (int s = 0; saves && s < e->n_slots; s++) {
        uint64_t n = ec->api->state_size(ec->c[s], seq, with_kv);
        int rc = n && (sn->state[s] = malloc((size_t)n))
                     ? ec->api->state_save(ec->c[s], seq, with_kv, sn->state[s], n)
                     : LMH_ENOMEM;
        if (rc != LMH_OK) {
            errf(err, err_len, "saving the state of sequence %llu failed (error %d)",
                 (unsigned long long)seq, rc);
            engine_snapshot_free(sn);
            return NULL;
        }
        sn->bytes[s] = n;
    }
    return sn;
}

int engine_seq_restore(engine *e, uint64_t seq, const engine_snapshot *sn, char *err,
                       size_t err_len) {
    if (e->n_pend) return errf(err, err_len, "%d started steps are not finished", e->n_pend);
    ecache *ec = cache_of(e, seq);
    int32_t len = ec ? ec_seq_len(e, ec, seq) : -1;
    if (len < 0) return errf(err, err_len, "unknown sequence %llu", (unsigned long long)seq);
    if (sn->state[0] && strcmp(sn->key, ec->key) != 0)
        return errf(err, err_len,
                    "the snapshot was taken in cache %s; sequence %llu lives in cache %s", sn->name,
                    (unsigned long long)seq, ec->name);
    if (sn->n_slots != e->n_slots)
        return errf(err, err_len, "the snapshot was taken over %d backends; the model runs on %d",
                    sn->n_slots, e->n_slots);
    if (!sn->with_kv && e->first_kv >= 0 && sn->len > len)
        return errf(err, err_len,
                    "the snapshot is at position %d without its keys and values; sequence %llu "
                    "holds %d positions",
                    sn->len, (unsigned long long)seq, len);
    e->seqs[seq_find(e, seq)].prompt_end = 0;
    for (int s = 0; s < e->n_slots; s++) {
        int rc = sn->state[s] ? ec->api->state_load(ec->c[s], seq, sn->state[s], sn->bytes[s])
                              : ec->api->seq_trim(ec->c[s], seq, sn->len);
        if (rc != LMH_OK)
            return errf(err, err_len, "restoring sequence %llu to position %d failed (error %d%s)",
                        (unsigned long long)seq, sn->len, rc,
                        rc == LMH_EUNSUPPORTED ? ": a sliding window has moved past it" : "");
    }
    return 0;
}

int32_t engine_layer_rows(engine *e, uint64_t seq, int32_t layer) {
    const ecache *ec = cache_of(e, seq);
    if (layer < 0 || layer >= e->n_layers || !ec) return -1;
    int s = e->layer_slot[layer];
    return ec->api->layer_rows(ec->c[s], seq, e->local[s][layer]);
}

int engine_layer_row_bytes(const engine *e, int32_t layer, uint64_t *k, uint64_t *v) {
    const ecache *ec = &e->caches[0]; /* the default cache (--cache) */
    const lmh_cache_api *ca = ec->api;
    if (layer < 0 || layer >= e->n_layers) return LMH_EINVAL;
    if (ca->size < offsetof(lmh_cache_api, row_bytes) + sizeof ca->row_bytes || !ca->row_bytes)
        return LMH_EUNSUPPORTED;
    int s = e->layer_slot[layer]; /* the cache of the backend holding the layer */
    *k = *v = 0;
    ca->row_bytes(ec->c[s], e->local[s][layer], k, v);
    return LMH_OK;
}

const char *engine_cache_plugin(const engine *e) {
    return e->caches[0].spec.p->info->name;
}

const char *engine_cache_format(const engine *e) {
    return e->caches[0].spec.format;
}

const lmh_layer_state *engine_layer_state(const engine *e, int32_t layer) {
    return layer >= 0 && layer < e->n_layers ? &e->layers[layer] : NULL;
}

const lmh_recurrent_state *engine_layer_recurrent(const engine *e, int32_t layer) {
    return layer >= 0 && layer < e->n_layers ? &e->rec[layer] : NULL;
}

static lmh_tensor *input_tensor(engine *e, lmh_fwd *f, lmh_dtype dt, int64_t n, const void *data) {
    lmh_tensor *t = host_fwd_tensor(f, LMH_LAYER_INPUT, dt, 1, &n);
    int s = e->input_slot;
    if (t && e->slots[s].api->upload(e->slots[s].b, HT(t)->phys[s], 0, data,
                                     (size_t)n * lmh_dtype_size(dt)) != 0) {
        fwd_failf(f, "upload of step inputs failed");
        return NULL;
    }
    return t;
}

/* The greedy picks of the step's output rows, made by LMH_OP_ARGMAX on the backend that
 * holds the logits, into *out (a tensor there, which the caller frees). 1 where that backend
 * does not run it (nothing done), 0 done, -1 failed (err set). */
static int device_picks(engine *e, lmh_fwd *f, lmh_tensor *logits, int32_t n_out, htensor **out,
                        char *err, size_t err_len) {
    int so = e->output_slot;
    int64_t ne[1] = {n_out};
    htensor *t = pl_new(e->slots, so, LMH_I32, 1, ne, 0);
    lmh_tensor *pl = t ? pl_on(e->slots, HT(logits), so, 0) : NULL;
    lmh_tensor *pi = pl ? pl_on(e->slots, t, so, 1) : NULL;
    lmh_op op = {.code = LMH_OP_ARGMAX, .dst = pi, .src = {pl}};
    if (!pi || !e->slots[so].api->supports(e->slots[so].b, &op)) {
        if (t) pl_free(e->slots, t);
        return 1; /* the logits path says what is wrong, if anything */
    }
    lmh_op hop = {.code = LMH_OP_ARGMAX, .dst = &t->pub, .src = {logits}};
    if (host_fwd_op(f, LMH_LAYER_OUTPUT, &hop) != LMH_OK) {
        errf(err, err_len, "picking the next tokens failed: %s", f->err);
        pl_free(e->slots, t);
        return -1;
    }
    *out = t;
    return 0;
}

static int has_download_start(const lmh_backend_api *api) {
    return api->size >= offsetof(lmh_backend_api, download_wait) + sizeof api->download_wait &&
           api->download_start && api->download_wait;
}

/* A step, as engine_step describes, or as engine_step_start does with `later` (its picks
 * left on the device, their copy to the host started) and, with `chain`, the tokens of the
 * rows being that started step's picks. */
/* Reads the layer outputs a traced pass copied aside into e->trace_data. */
static int trace_collect(engine *e, lmh_fwd *f) {
    for (int32_t l = 0; l < e->n_layers; l++) {
        free(e->trace_data[l]);
        e->trace_data[l] = NULL;
        lmh_tensor *t = f->traced[l];
        if (!t) continue;
        const int s = slot_of(e, l);
        const int64_t n = lmh_nelem(t), rows = t->ne[0];
        lmh_tensor *pt = pl_on(e->slots, HT(t), s, 0);
        float *d = malloc((size_t)n * sizeof *d);
        if (!pt || !d || e->slots[s].api->download(e->slots[s].b, pt, 0, d, (size_t)n * 4) != 0) {
            free(d);
            return -1;
        }
        e->trace_data[l] = d;
        e->trace_dims[2 * l] = rows;
        e->trace_dims[2 * l + 1] = rows ? n / rows : 0;
    }
    return 0;
}

int engine_trace(engine *e, int on) {
    if (on && !e->trace_data) {
        e->trace_data = calloc((size_t)e->n_layers, sizeof *e->trace_data);
        e->trace_dims = calloc((size_t)e->n_layers * 2, sizeof *e->trace_dims);
        if (!e->trace_data || !e->trace_dims) return -1;
    }
    e->trace = on;
    return 0;
}

const float *engine_trace_layer(const engine *e, int32_t layer, int64_t *rows, int64_t *width) {
    if (!e->trace_data || layer < 0 || layer >= e->n_layers || !e->trace_data[layer]) return NULL;
    *rows = e->trace_dims[2 * layer];
    *width = e->trace_dims[2 * layer + 1];
    return e->trace_data[layer];
}

/* engine_embed's pass: the output rows' hidden states, n_out x width floats (malloc'd). */
typedef struct embed_cap {
    float *h;
    int64_t width;
} embed_cap;

/* A tensor of the logits' shape that owns no backend memory: an embedding pass computes
 * nothing into it (host_fwd_op skips what writes it). */
static lmh_tensor *shell_tensor(lmh_fwd *f, int32_t ndim, const int64_t *ne) {
    htensor *t = calloc(1, sizeof *t);
    if (!t) {
        fwd_failf(f, "out of memory");
        return NULL;
    }
    t->pub.dtype = LMH_F32;
    t->pub.ndim = ndim;
    memcpy(t->pub.ne, ne, (size_t)ndim * sizeof *ne);
    t->pub.backend_priv = t;
    if (!fwd_track(f, t)) {
        fwd_failf(f, "out of memory");
        return NULL;
    }
    return &t->pub;
}

/* The hidden states an embedding pass copied aside, read back into emb. */
static int embed_collect(engine *e, lmh_fwd *f, embed_cap *emb, char *err, size_t err_len) {
    if (!f->emb_hidden)
        return errf(err, err_len,
                    "embeddings: architecture plugin %s computed its logits with no matrix "
                    "product of the hidden states to take them from",
                    e->arch_p->info->name);
    const int so = e->output_slot;
    const pl_slot *sl = &e->slots[so];
    lmh_tensor *t = &f->emb_hidden->pub;
    const size_t n = (size_t)lmh_nelem(t);
    lmh_tensor *pt = pl_on(e->slots, f->emb_hidden, so, 0);
    float *h = malloc((n ? n : 1) * sizeof *h);
    if (!pt || !h || sl->api->download(sl->b, pt, 0, h, n * sizeof *h) != 0) {
        free(h);
        return errf(err, err_len, "reading the hidden states back failed");
    }
    emb->h = h;
    emb->width = t->ne[1];
    return 0;
}

static int run_step(engine *e, const engine_row *rows, int32_t n_rows, const int32_t *out_rows,
                    int32_t n_out, float *logits, int32_t *ids, pend_step *later,
                    const pend_step *chain, embed_cap *emb, char *err, size_t err_len) {
    if (later) *later = (pend_step){.n = n_out};
    if (n_rows <= 0) return errf(err, err_len, "empty step");
    if (chain && chain->n != n_rows)
        return errf(err, err_len, "a chained step of %d rows after a step of %d picks", n_rows,
                    chain->n);
    lmh_fwd f = {.e = e, .n_rows = n_rows, .last_layer = LMH_LAYER_INPUT, .n_out = n_out};
    f.predict_pass = e->xs && n_rows <= XS_PREDICT_ROWS && xs_predict_ok(e->xs);
    if (e->trace && !(f.traced = calloc((size_t)e->n_layers, sizeof *f.traced))) {
        errf(err, err_len, "out of memory");
        return -1;
    }
    float *host_logits = NULL;
    htensor *picks = NULL;
    int32_t *tok = malloc((size_t)n_rows * sizeof *tok);
    int32_t *pos = malloc((size_t)n_rows * sizeof *pos);
    int32_t *ends = malloc((size_t)n_rows * sizeof *ends), *moe_k = NULL;
    f.segs = malloc((size_t)n_rows * sizeof *f.segs);
    int rc = -1;
    if (!tok || !pos || !ends || !f.segs) {
        errf(err, err_len, "out of memory");
        goto done;
    }
    for (int32_t i = 0; i < n_rows; i++) {
        if (!chain && (rows[i].token < 0 || rows[i].token >= e->vocab)) {
            errf(err, err_len, "token id %d out of range (vocabulary %d)", rows[i].token, e->vocab);
            goto done;
        }
        tok[i] = chain ? (chain->ids ? 0 : chain->host[i]) : rows[i].token;
        if (i == 0 || rows[i].seq != rows[i - 1].seq) {
            for (int s = 0; s < f.n_segs; s++)
                if (f.segs[s].seq == rows[i].seq) {
                    errf(err, err_len, "rows of sequence %llu are not contiguous",
                         (unsigned long long)rows[i].seq);
                    goto done;
                }
            int ci = engine_seq_cache(e, rows[i].seq);
            int32_t len = ci < 0 ? -1 : ec_seq_len(e, &e->caches[ci], rows[i].seq);
            if (len < 0) {
                errf(err, err_len, "unknown sequence %llu", (unsigned long long)rows[i].seq);
                goto done;
            }
            f.segs[f.n_segs++] = (seg){.seq = rows[i].seq, .r0 = i, .n = 0, .ci = ci};
            pos[i] = len; /* the segment's first row */
        }
        seg *g = &f.segs[f.n_segs - 1];
        pos[i] = pos[g->r0] + g->n;
        g->n++;
        if (e->max_seq_len > 0 && pos[i] >= e->max_seq_len) {
            errf(err, err_len, "sequence %llu would reach %d positions; the limit is %d",
                 (unsigned long long)g->seq, pos[i] + 1, e->max_seq_len);
            goto done;
        }
    }
    for (int32_t i = 0; i < n_out; i++)
        if (out_rows[i] < 0 || out_rows[i] >= n_rows) {
            errf(err, err_len, "output row %d out of range", out_rows[i]);
            goto done;
        }
    /* each sequence's end in this pass, or its prompt's while one is fed in chunks
     * (lmh_batch.seq_ends); the prompt's end is forgotten once a pass reaches it */
    for (int s = 0; s < f.n_segs; s++) {
        const seg *g = &f.segs[s];
        seq_ent *se = &e->seqs[seq_find(e, g->seq)];
        int32_t end = pos[g->r0] + g->n;
        if (se->prompt_end > end)
            end = se->prompt_end;
        else
            se->prompt_end = 0;
        for (int32_t i = g->r0; i < g->r0 + g->n; i++) ends[i] = end;
    }

    lmh_batch b = {.n_rows = n_rows, .n_out = n_out};
    /* chained: the embedding reads the picks where they are (copied on use if the first
     * layer sits on another backend) */
    b.tokens = chain && chain->ids ? &chain->ids->pub : input_tensor(e, &f, LMH_I32, n_rows, tok);
    b.positions = input_tensor(e, &f, LMH_I32, n_rows, pos);
    f.positions = b.positions ? HT(b.positions) : NULL;
    b.out_rows = input_tensor(e, &f, LMH_I32, n_out, out_rows);
    /* (ABI 1.10) read by plugins that know of it only */
    if (e->arch_p->info->abi_minor >= 10) b.seq_ends = input_tensor(e, &f, LMH_I32, n_rows, ends);
    /* (ABI 1.11) experts per row, where a sequence (or the engine) routes to fewer than the
     * model's top_k */
    int fewer = 0;
    for (int g = 0; e->moe_top_k && g < f.n_segs; g++) {
        int32_t k = e->seqs[seq_find(e, f.segs[g].seq)].moe_k;
        if (!k) k = e->moe_k_default;
        fewer |= k && k < e->moe_top_k;
    }
    if (fewer && !(moe_k = malloc((size_t)n_rows * sizeof *moe_k))) {
        errf(err, err_len, "out of memory");
        goto done;
    }
    for (int g = 0; fewer && g < f.n_segs; g++) {
        int32_t k = e->seqs[seq_find(e, f.segs[g].seq)].moe_k;
        if (!k) k = e->moe_k_default;
        if (!k) k = e->moe_top_k;
        for (int32_t i = f.segs[g].r0; i < f.segs[g].r0 + f.segs[g].n; i++) moe_k[i] = k;
    }
    if (fewer) b.moe_top_k = input_tensor(e, &f, LMH_I32, n_rows, moe_k);
    int64_t lne[2] = {n_out, e->vocab};
    if (emb)
        b.logits = f.emb_logits = shell_tensor(&f, 2, lne);
    else
        b.logits = host_fwd_tensor(&f, LMH_LAYER_OUTPUT, LMH_F32, 2, lne);
    if (f.failed) {
        errf(err, err_len, "%s", f.err);
        goto done;
    }
    int arc = e->arch->forward(e->model, &host_api, &f, &b);
    if (f.failed || arc != 0) {
        errf(err, err_len, "forward pass failed: %s", f.failed ? f.err : "architecture error");
        /* The cache may hold a partial step: take every sequence back to where it was. */
        for (int s = 0; s < f.n_segs; s++) engine_seq_trim(e, f.segs[s].seq, pos[f.segs[s].r0]);
        if (f.oom) rc = LMH_ENOMEM;
        goto done;
    }
    int so = e->output_slot;
    const pl_slot *sl = &e->slots[so];
    if (emb) {
        rc = embed_collect(e, &f, emb, err, err_len);
        goto done;
    }
    if (later) {
        ids = later->host = malloc((size_t)(n_out ? n_out : 1) * sizeof *ids);
        if (!ids) {
            errf(err, err_len, "out of memory");
            goto done;
        }
    }
    if (ids && !logits && n_out > 0) {
        int dp = device_picks(e, &f, b.logits, n_out, &picks, err, err_len);
        if (dp < 0) goto done;
        if (dp == 0) {
            lmh_tensor *pi = picks->phys[so];
            size_t nb = (size_t)n_out * sizeof *ids;
            int st = LMH_EUNSUPPORTED;
            if (later && has_download_start(sl->api) &&
                (st = sl->api->download_start(sl->b, pi, 0, nb, &later->ticket)) == LMH_OK) {
                later->ids = picks; /* read at engine_step_finish */
                free(later->host);
                later->host = NULL;
                picks = NULL;
            } else if ((st != LMH_OK && st != LMH_EUNSUPPORTED) ||
                       sl->api->download(sl->b, pi, 0, ids, nb) != 0) {
                errf(err, err_len, "reading the next tokens back failed");
                goto done;
            }
            rc = 0;
            goto done;
        }
        /* the backend has no argmax: the logits come back and the host picks */
        if (!(host_logits = malloc((size_t)n_out * (size_t)e->vocab * sizeof(float)))) {
            errf(err, err_len, "out of memory");
            goto done;
        }
    }
    float *lg = logits ? logits : host_logits;
    lmh_tensor *pl = pl_on(e->slots, HT(b.logits), so, 0);
    if (lg && (!pl || sl->api->download(sl->b, pl, 0, lg,
                                        (size_t)n_out * (size_t)e->vocab * sizeof(float)) != 0)) {
        errf(err, err_len, "reading logits back failed");
        goto done;
    }
    for (int32_t k = 0; ids && k < n_out; k++)
        ids[k] = sampler_argmax(lg + (size_t)k * (size_t)e->vocab, e->vocab);
    if (f.traced && trace_collect(e, &f)) {
        errf(err, err_len, "reading the traced layer outputs back failed");
        goto done;
    }
    rc = 0;
done:
    free(f.traced);
    if (rc && later) {
        free(later->host);
        *later = (pend_step){0};
    }
    if (picks) pl_free(e->slots, picks);
    free(host_logits);
    /* Views before the tensors they view: free in reverse order of creation. */
    for (int i = f.n_tmp - 1; i >= 0; i--) pl_free(e->slots, f.tmp[i]);
    free(f.tmp);
    free(f.segs);
    free(f.xs_ids);
    free(f.xs_map);
    free(moe_k);
    free(tok);
    free(pos);
    free(ends);
    return rc;
}

int engine_step(engine *e, const engine_row *rows, int32_t n_rows, const int32_t *out_rows,
                int32_t n_out, float *logits, int32_t *ids, char *err, size_t err_len) {
    return run_step(e, rows, n_rows, out_rows, n_out, logits, ids, NULL, NULL, NULL, err, err_len);
}

int engine_step_overlaps(const engine *e) {
    return has_download_start(e->slots[e->output_slot].api);
}

int engine_step_start(engine *e, const engine_row *rows, int32_t n_rows, const int32_t *out_rows,
                      int32_t n_out, int chain, char *err, size_t err_len) {
    if (e->n_pend == ENGINE_MAX_PENDING)
        return errf(err, err_len, "%d steps are started and not finished", e->n_pend);
    if (chain && !e->n_pend) return errf(err, err_len, "no started step to chain to");
    pend_step p;
    int rc = run_step(e, rows, n_rows, out_rows, n_out, NULL, NULL, &p,
                      chain ? &e->pend[e->n_pend - 1] : NULL, NULL, err, err_len);
    if (rc) return rc < 0 ? rc : -1;
    e->pend[e->n_pend++] = p;
    return 0;
}

int32_t engine_step_finish(engine *e, int32_t *ids, int32_t n_ids, char *err, size_t err_len) {
    if (!e->n_pend) return errf(err, err_len, "no started step to finish");
    pend_step *p = &e->pend[0];
    int32_t n = p->n < n_ids ? p->n : n_ids > 0 ? n_ids : 0;
    int rc = 0;
    if (p->ticket) {
        int so = e->output_slot;
        rc = e->slots[so].api->download_wait(e->slots[so].b, p->ticket, ids,
                                             (size_t)n * sizeof *ids);
        p->ticket = 0;
        if (rc) errf(err, err_len, "reading the next tokens back failed");
    } else if (n > 0) {
        memcpy(ids, p->host, (size_t)n * sizeof *ids);
    }
    n = p->n;
    pend_free(e, p);
    memmove(&e->pend[0], &e->pend[1], (size_t)--e->n_pend * sizeof e->pend[0]);
    return rc ? -1 : n;
}

int engine_seq_count(const engine *e) {
    return e->n_seqs;
}

int engine_swap_backend(engine *e, const char *name, char *err, size_t err_len) {
    if (e->n_pend) return errf(err, err_len, "%d started steps are not finished", e->n_pend);
    if (e->n_slots != 1)
        return errf(err, err_len,
                    "a model split over backends (--gpu-layers, --devices) cannot move");
    if (e->n_seqs) return errf(err, err_len, "%d sequences are still running", e->n_seqs);
    const int t = 1; /* the new backend starts in a spare slot */
    if (start_backend(e, t, name, e->device[0], err, err_len) != 0) return -1;
    /* Weights first, then an empty cache; the old backend serves until both succeed. */
    int ok = 1;
    char why[256] = "";
    for (int i = 0; ok && i < e->n_weights; i++) /* (streamed experts: read again on use) */
        ok = e->weights[i]->xs || pl_on_why(e->slots, e->weights[i], t, 0, why, sizeof why);
    ecache *d = &e->caches[0]; /* the default cache; the others reopen when asked for */
    if (ok && make_cache(e, d, t, 0, err, err_len) != 0) ok = -1;
    if (ok != 1) {
        if (ok == 0) errf(err, err_len, "moving the weights to %s: %s", name, why);
        for (int i = 0; i < e->n_weights; i++) pl_drop(e->slots, e->weights[i], t);
        if (d->c[t]) d->api->destroy(d->c[t]);
        d->c[t] = NULL;
        stop_backend(e, t);
        return -1;
    }
    /* Commit: drop the old copies and move the new slot into place. */
    for (int i = 1; i < ENGINE_MAX_CACHES; i++)
        if (e->caches[i].api) cache_close(&e->caches[i]);
    d->api->destroy(d->c[0]);
    xs_drop_stacks(e->xs, e->slots); /* made again on the new backend when used */
    for (int i = 0; i < e->n_weights; i++) {
        htensor *w = e->weights[i];
        pl_drop(e->slots, w, 0);
        w->phys[0] = w->phys[t];
        w->phys[t] = NULL;
        w->valid = 1u;
    }
    stop_backend(e, 0);
    e->slots[0] = e->slots[t];
    memset(&e->slots[t], 0, sizeof e->slots[t]);
    d->c[0] = d->c[t];
    d->c[t] = NULL;
    describe_chain(e);
    return 0;
}

/* ---- embeddings ------------------------------------------------------------------------ */

static const char *const pool_names[] = {NULL, "mean", "last", "cls"};

const char *engine_pooling_name(int pooling) {
    return pooling > 0 && pooling <= ENGINE_POOL_CLS ? pool_names[pooling] : NULL;
}

int engine_pooling_parse(const char *name) {
    for (int i = 1; name && i <= ENGINE_POOL_CLS; i++)
        if (strcmp(name, pool_names[i]) == 0) return i;
    return -1;
}

int32_t engine_embed_dim(const engine *e) {
    json_object *h = cfg_lookup(text_config(e), "hidden_size");
    int64_t v = h && json_object_is_type(h, json_type_int) ? json_object_get_int64(h) : 0;
    return v > 0 && v <= INT32_MAX ? (int32_t)v : 0;
}

int engine_embed_pooling(const engine *e, const char **why) {
    if (why) *why = e->pooling < 0 ? e->pool_err : NULL;
    return e->pooling;
}

/* Pools rows h[0..n) of width w into out[w] and L2-normalizes it, in double. */
static int pool_rows(const float *h, int64_t n, int64_t w, double *acc, float *out) {
    for (int64_t j = 0; j < w; j++) acc[j] = 0;
    for (int64_t r = 0; r < n; r++) /* row by row in order: the same sums in any batch */
        for (int64_t j = 0; j < w; j++) acc[j] += h[r * w + j];
    double ss = 0;
    for (int64_t j = 0; j < w; j++) {
        acc[j] /= (double)n;
        ss += acc[j] * acc[j];
    }
    if (!isfinite(ss)) return -1;
    const double inv = ss > 0 ? 1.0 / sqrt(ss) : 0.0;
    for (int64_t j = 0; j < w; j++) out[j] = (float)(acc[j] * inv);
    return 0;
}

int engine_embed(engine *e, const int32_t *const *tokens, const int32_t *n_tokens, int32_t n_seqs,
                 int pooling, float *out, char *err, size_t err_len) {
    if (e->n_pend) return errf(err, err_len, "%d started steps are not finished", e->n_pend);
    if (pooling == ENGINE_POOL_MODEL) {
        if (e->pooling < 0) return errf(err, err_len, "%s", e->pool_err);
        pooling = e->pooling;
    }
    if (!engine_pooling_name(pooling)) return errf(err, err_len, "unknown pooling %d", pooling);
    const int32_t dim = engine_embed_dim(e);
    if (dim <= 0)
        return errf(err, err_len, "config.json gives no hidden_size, the embeddings' width");
    if (n_seqs <= 0) return errf(err, err_len, "no sequences to embed");
    int64_t total = 0;
    for (int32_t i = 0; i < n_seqs; i++) {
        if (n_tokens[i] <= 0) return errf(err, err_len, "sequence %d has no tokens", i);
        if (e->max_seq_len > 0 && n_tokens[i] > e->max_seq_len)
            return errf(err, err_len, "sequence %d has %d tokens; the model takes at most %d", i,
                        n_tokens[i], e->max_seq_len);
        total += n_tokens[i];
    }
    if (total > INT32_MAX / 2)
        return errf(err, err_len, "%lld tokens in one step", (long long)total);
    const int32_t n_rows = (int32_t)total, n_out = pooling == ENGINE_POOL_MEAN ? n_rows : n_seqs;
    engine_row *rows = malloc((size_t)n_rows * sizeof *rows);
    int32_t *outs = malloc((size_t)n_out * sizeof *outs);
    uint64_t *ids = malloc((size_t)n_seqs * sizeof *ids);
    double *acc = malloc((size_t)dim * sizeof *acc);
    embed_cap cap = {0};
    int32_t added = 0;
    int rc = -1;
    if (!rows || !outs || !ids || !acc) {
        errf(err, err_len, "out of memory");
        rc = LMH_ENOMEM;
        goto done;
    }
    /* temporary ids from ENGINE_SEQ_TEMP, past any in use */
    uint64_t next = ENGINE_SEQ_TEMP;
    for (; added < n_seqs; added++) {
        while (seq_find(e, next) >= 0) next++;
        ids[added] = next++;
        int ar = engine_seq_add_in(e, ids[added], 0);
        if (ar != 0) {
            errf(err, err_len, "adding a sequence to embed failed (%s)",
                 ar == LMH_ENOMEM ? "out of memory" : "the cache refused it");
            if (ar == LMH_ENOMEM) rc = LMH_ENOMEM;
            goto done;
        }
    }
    int32_t r = 0, o = 0;
    for (int32_t i = 0; i < n_seqs; i++) {
        if (pooling == ENGINE_POOL_CLS) outs[o++] = r;
        for (int32_t k = 0; k < n_tokens[i]; k++) {
            if (pooling == ENGINE_POOL_MEAN) outs[o++] = r;
            rows[r++] = (engine_row){.seq = ids[i], .token = tokens[i][k]};
        }
        if (pooling == ENGINE_POOL_LAST) outs[o++] = r - 1;
    }
    int sr = run_step(e, rows, n_rows, outs, n_out, NULL, NULL, NULL, NULL, &cap, err, err_len);
    if (sr) {
        rc = sr == LMH_ENOMEM ? LMH_ENOMEM : -1;
        goto done;
    }
    if (cap.width != dim) {
        errf(err, err_len, "the model's hidden states have %lld values; its hidden_size says %d",
             (long long)cap.width, dim);
        goto done;
    }
    for (int32_t i = 0, h0 = 0; i < n_seqs; i++) {
        const int32_t n = pooling == ENGINE_POOL_MEAN ? n_tokens[i] : 1;
        if (pool_rows(cap.h + (size_t)h0 * (size_t)dim, n, dim, acc, out + (size_t)i * dim)) {
            errf(err, err_len, "sequence %d's hidden states are not finite", i);
            goto done;
        }
        h0 += n;
    }
    rc = 0;
done:
    while (added > 0) engine_seq_remove(e, ids[--added]);
    free(cap.h);
    free(rows);
    free(outs);
    free(ids);
    free(acc);
    return rc;
}
