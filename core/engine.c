/* The engine and the host services plugins call while loading and running a model.
 *
 * Placement: every layer index (and LMH_LAYER_INPUT / LMH_LAYER_OUTPUT) maps to a
 * backend. Today the whole model sits on one backend; the host API already names the
 * layer of every tensor and op so that a split (--gpu-layers) changes only this file. */
#include "engine.h"
#include "log.h"
#include "model_dir.h"
#include "rope_config.h"

#include <errno.h>
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
} seg;

struct lmh_fwd {
    engine *e;
    lmh_tensor **tmp; /* scratch tensors and views, freed after the pass (views first) */
    int n_tmp, cap_tmp;
    seg *segs;
    int n_segs;
    lmh_tensor *positions;
    int failed;
    char err[512];
};

struct engine {
    model_dir *md;
    const plugin *arch_p, *backend_p, *cache_p;
    const lmh_arch_api *arch;
    const lmh_backend_api *be_api;
    const lmh_cache_api *cache_api;
    lmh_backend *be;
    lmh_cache *cache;
    lmh_model *model;
    int32_t n_layers, vocab;
    lmh_layer_state *layers;
    lmh_tensor **weights; /* tensors handed to the architecture plugin */
    int n_weights, cap_weights;
    uint64_t weight_bytes;
    int max_seq_len;
    char chain[512];
    char cache_format[32];
};

/* ---- load-time services ---------------------------------------------------------- */

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
    if (rope_compute(text_config(ld->e), layer_type, rot_dims, inv_freq, info, err,
                     sizeof err) != 0)
        return host_fail(ld, "%s", err);
    return LMH_OK;
}

static int host_declare_model(lmh_load_ctx *ld, int32_t n_layers, int32_t vocab) {
    engine *e = ld->e;
    if (n_layers <= 0 || n_layers > 100000)
        return host_fail(ld, "config.json: bad layer count %d", n_layers);
    if (vocab <= 0) return host_fail(ld, "config.json: bad vocab_size %d", vocab);
    if (e->layers) return host_fail(ld, "declare_model called twice");
    e->layers = calloc((size_t)n_layers, sizeof *e->layers);
    if (!e->layers) return host_fail(ld, "out of memory");
    e->n_layers = n_layers;
    e->vocab = vocab;
    return LMH_OK;
}

static int host_declare_layer(lmh_load_ctx *ld, int32_t layer, const lmh_layer_state *st) {
    engine *e = ld->e;
    if (!e->layers) return host_fail(ld, "declare_layer before declare_model");
    if (layer < 0 || layer >= e->n_layers)
        return host_fail(ld, "declare_layer: layer %d out of range", layer);
    if (st->kind == LMH_STATE_KV &&
        (st->n_kv_heads <= 0 || st->head_dim_k <= 0 || st->head_dim_v <= 0 || st->window < 0))
        return host_fail(ld, "layer %d: bad attention state (kv heads %d, head dims %d/%d)",
                         layer, st->n_kv_heads, st->head_dim_k, st->head_dim_v);
    e->layers[layer] = *st;
    return LMH_OK;
}

static int host_weight_info(lmh_load_ctx *ld, const char *name, lmh_weight_info *out) {
    const st_tensor *t = md_find(ld->e->md, name);
    if (!t) return LMH_ENOTFOUND;
    out->dtype = t->dtype;
    out->ndim = t->ndim;
    memcpy(out->ne, t->ne, sizeof out->ne);
    return LMH_OK;
}

static void shape_str(char *buf, size_t len, int32_t ndim, const int64_t *ne) {
    size_t o = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? ", " : "", (long long)ne[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
}

static int track_weight(engine *e, lmh_tensor *t) {
    if (e->n_weights == e->cap_weights) {
        int cap = e->cap_weights ? e->cap_weights * 2 : 64;
        lmh_tensor **n = realloc(e->weights, (size_t)cap * sizeof *n);
        if (!n) return -1;
        e->weights = n;
        e->cap_weights = cap;
    }
    e->weights[e->n_weights++] = t;
    return 0;
}

static lmh_tensor *make_weight(lmh_load_ctx *ld, lmh_dtype dt, int32_t ndim, const int64_t *ne,
                               const void *data, const char *what) {
    engine *e = ld->e;
    lmh_tensor *t = NULL;
    size_t bytes = lmh_dtype_size(dt);
    for (int i = 0; i < ndim; i++) bytes *= (size_t)ne[i];
    /* Keep the mapping when the backend can compute from host memory: no copy at load. */
    if (e->be_api->tensor_wrap) t = e->be_api->tensor_wrap(e->be, dt, ndim, ne, data);
    if (!t) {
        t = e->be_api->tensor_new(e->be, dt, ndim, ne, LMH_TENSOR_WEIGHT);
        if (!t) {
            host_fail(ld, "out of backend memory loading %s (%zu bytes)", what, bytes);
            return NULL;
        }
        if (e->be_api->upload(e->be, t, 0, data, bytes) != 0) {
            e->be_api->tensor_free(e->be, t);
            host_fail(ld, "upload of %s failed", what);
            return NULL;
        }
    }
    if (track_weight(e, t) != 0) {
        e->be_api->tensor_free(e->be, t);
        host_fail(ld, "out of memory");
        return NULL;
    }
    e->weight_bytes += bytes;
    return t;
}

static lmh_tensor *host_weight(lmh_load_ctx *ld, int32_t layer, const char *name, int32_t ndim,
                               const int64_t *ne) {
    (void)layer; /* one backend for every layer today; see the note at the top */
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
    return make_weight(ld, t->dtype, t->ndim, t->ne, t->data, name);
}

static lmh_tensor *host_weight_stack(lmh_load_ctx *ld, int32_t layer, const char *fmt,
                                     int32_t count, int32_t ndim, const int64_t *ne) {
    (void)layer;
    engine *e = ld->e;
    if (count <= 0 || ndim < 1 || ndim >= LMH_MAX_DIMS) {
        host_fail(ld, "weight_stack: bad count %d or rank %d", count, ndim);
        return NULL;
    }
    int64_t sne[LMH_MAX_DIMS] = {count};
    memcpy(sne + 1, ne, (size_t)ndim * sizeof *ne);
    lmh_tensor *t = NULL;
    size_t slice = 0;
    for (int32_t i = 0; i < count; i++) {
        char name[512];
        snprintf(name, sizeof name, fmt, i);
        const st_tensor *st = md_find(e->md, name);
        if (!st) {
            host_fail(ld, "missing tensor %s in %s", name, md_path(e->md));
            goto bad;
        }
        int same = st->ndim == ndim;
        for (int d = 0; same && d < ndim; d++) same = st->ne[d] == ne[d];
        if (!same) {
            char want[128], have[128];
            shape_str(want, sizeof want, ndim, ne);
            shape_str(have, sizeof have, st->ndim, st->ne);
            host_fail(ld, "shape mismatch for tensor %s: checkpoint has %s, config implies %s",
                      name, have, want);
            goto bad;
        }
        if (!t) {
            if (st->dtype != LMH_F32 && st->dtype != LMH_F16 && st->dtype != LMH_BF16) {
                host_fail(ld, "tensor %s has dtype %s; weights must be f32, f16 or bf16", name,
                          lmh_dtype_name(st->dtype));
                goto bad;
            }
            t = e->be_api->tensor_new(e->be, st->dtype, ndim + 1, sne, LMH_TENSOR_WEIGHT);
            slice = lmh_dtype_size(st->dtype);
            for (int d = 0; d < ndim; d++) slice *= (size_t)ne[d];
            if (!t) {
                host_fail(ld, "out of backend memory stacking %s (%d x %zu bytes)", fmt, count,
                          slice);
                goto bad;
            }
        } else if (st->dtype != t->dtype) {
            host_fail(ld, "tensor %s is %s; the others of its stack are %s", name,
                      lmh_dtype_name(st->dtype), lmh_dtype_name(t->dtype));
            goto bad;
        }
        if (e->be_api->upload(e->be, t, (size_t)i * slice, st->data, slice) != 0) {
            host_fail(ld, "upload of %s failed", name);
            goto bad;
        }
    }
    if (track_weight(e, t) != 0) {
        host_fail(ld, "out of memory");
        goto bad;
    }
    e->weight_bytes += slice * (size_t)count;
    return t;
bad:
    if (t) e->be_api->tensor_free(e->be, t);
    return NULL;
}

static lmh_tensor *host_constant(lmh_load_ctx *ld, int32_t layer, lmh_dtype dtype, int32_t ndim,
                                 const int64_t *ne, const void *data) {
    (void)layer;
    if (ndim < 1 || ndim > LMH_MAX_DIMS) {
        host_fail(ld, "constant with %d dims", ndim);
        return NULL;
    }
    /* Copied: the plugin's buffer need not outlive the call, and a CPU backend must not
     * keep a pointer into it. */
    size_t bytes = lmh_dtype_size(dtype);
    for (int i = 0; i < ndim; i++) bytes *= (size_t)ne[i];
    engine *e = ld->e;
    lmh_tensor *t = e->be_api->tensor_new(e->be, dtype, ndim, ne, LMH_TENSOR_WEIGHT);
    if (!t || e->be_api->upload(e->be, t, 0, data, bytes) != 0 || track_weight(e, t) != 0) {
        if (t) e->be_api->tensor_free(e->be, t);
        host_fail(ld, "cannot allocate a constant of %zu bytes", bytes);
        return NULL;
    }
    return t;
}

/* ---- forward-pass services ------------------------------------------------------- */

static void fwd_failf(lmh_fwd *f, const char *fmt, ...) {
    if (f->failed) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->err, sizeof f->err, fmt, ap);
    va_end(ap);
    f->failed = 1;
}

static int fwd_track(lmh_fwd *f, lmh_tensor *t) {
    if (f->n_tmp == f->cap_tmp) {
        int cap = f->cap_tmp ? f->cap_tmp * 2 : 256;
        lmh_tensor **n = realloc(f->tmp, (size_t)cap * sizeof *n);
        if (!n) return -1;
        f->tmp = n;
        f->cap_tmp = cap;
    }
    f->tmp[f->n_tmp++] = t;
    return 0;
}

static lmh_tensor *host_fwd_tensor(lmh_fwd *f, int32_t layer, lmh_dtype dtype, int32_t ndim,
                                   const int64_t *ne) {
    (void)layer;
    engine *e = f->e;
    lmh_tensor *t = e->be_api->tensor_new(e->be, dtype, ndim, ne, 0);
    if (!t) {
        fwd_failf(f, "out of backend memory for a %dD scratch tensor", ndim);
        return NULL;
    }
    if (fwd_track(f, t) != 0) {
        e->be_api->tensor_free(e->be, t);
        fwd_failf(f, "out of memory");
        return NULL;
    }
    return t;
}

static lmh_tensor *host_fwd_view(lmh_fwd *f, lmh_tensor *t, int64_t offset, int32_t ndim,
                                 const int64_t *ne) {
    engine *e = f->e;
    if (!t) return NULL;
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= ne[i];
    if (ndim < 1 || ndim > LMH_MAX_DIMS || offset < 0 || offset + n > lmh_nelem(t)) {
        fwd_failf(f, "view of %lld elements at %lld exceeds a tensor of %lld", (long long)n,
                  (long long)offset, (long long)lmh_nelem(t));
        return NULL;
    }
    lmh_tensor *v = e->be_api->tensor_view(e->be, t, (size_t)offset * lmh_dtype_size(t->dtype),
                                           t->dtype, ndim, ne);
    if (!v || fwd_track(f, v) != 0) {
        if (v) e->be_api->tensor_free(e->be, v);
        fwd_failf(f, "out of memory for a view");
        return NULL;
    }
    return v;
}

static int host_fwd_op(lmh_fwd *f, int32_t layer, const lmh_op *op) {
    (void)layer;
    if (f->failed) return LMH_EINVAL;
    if (!op->dst) {
        fwd_failf(f, "op %s without a destination", lmh_op_name(op->code));
        return LMH_EINVAL;
    }
    int rc = f->e->be_api->enqueue(f->e->be, op);
    if (rc != 0)
        fwd_failf(f, "backend %s cannot run op %s (%s)", f->e->backend_p->info->name,
                  lmh_op_name(op->code), rc == LMH_EUNSUPPORTED ? "unsupported" : "bad operands");
    return rc;
}

static lmh_tensor *row_view(lmh_fwd *f, lmh_tensor *t, int32_t r0, int32_t n) {
    int64_t ne[LMH_MAX_DIMS];
    int64_t row = 1;
    for (int i = 1; i < t->ndim; i++) row *= t->ne[i];
    memcpy(ne, t->ne, sizeof ne);
    ne[0] = n;
    return host_fwd_view(f, t, (int64_t)r0 * row, t->ndim, ne);
}

static int host_fwd_attention(lmh_fwd *f, int32_t layer, lmh_tensor *q, lmh_tensor *k,
                              lmh_tensor *v, lmh_tensor *out, const lmh_attn_params *p) {
    engine *e = f->e;
    if (f->failed) return LMH_EINVAL;
    if (layer < 0 || layer >= e->n_layers || e->layers[layer].kind != LMH_STATE_KV) {
        fwd_failf(f, "attention on layer %d, which declared no attention state", layer);
        return LMH_EINVAL;
    }
    /* Each sequence's rows go to its own cache entry. */
    for (int s = 0; s < f->n_segs; s++) {
        const seg *g = &f->segs[s];
        lmh_tensor *qs = row_view(f, q, g->r0, g->n), *ks = row_view(f, k, g->r0, g->n);
        lmh_tensor *vs = row_view(f, v, g->r0, g->n), *os = row_view(f, out, g->r0, g->n);
        int64_t pn = g->n;
        lmh_tensor *ps = host_fwd_view(f, f->positions, g->r0, 1, &pn);
        if (f->failed) return LMH_EINVAL;
        int rc = e->cache_api->append(e->cache, g->seq, layer, ks, vs);
        if (rc == 0) rc = e->cache_api->attend(e->cache, g->seq, layer, qs, ps, os, p);
        if (rc != 0) {
            fwd_failf(f, "cache %s failed on layer %d (error %d)", e->cache_p->info->name, layer,
                      rc);
            return rc;
        }
    }
    return LMH_OK;
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
};

/* ---- engine ------------------------------------------------------------------------ */

static void free_weights(engine *e) {
    for (int i = e->n_weights - 1; i >= 0; i--) e->be_api->tensor_free(e->be, e->weights[i]);
    free(e->weights);
    e->weights = NULL;
    e->n_weights = 0;
}

void engine_close(engine *e) {
    if (!e) return;
    if (e->cache) e->cache_api->destroy(e->cache);
    if (e->model) e->arch->unload(e->model);
    if (e->be) {
        free_weights(e);
        e->be_api->destroy(e->be);
    }
    free(e->layers);
    md_close(e->md);
    free(e);
}

/* --cache accepts a plugin name, "name:format", or a bare format any cache offers. */
static const plugin *pick_cache(const registry *reg, const char *spec, char *fmt, size_t fmt_len,
                                char *err, size_t err_len) {
    char name[64];
    const char *colon = strchr(spec, ':');
    snprintf(name, sizeof name, "%.*s", colon ? (int)(colon - spec) : 63, spec);
    fmt[0] = 0;
    if (colon) snprintf(fmt, fmt_len, "%s", colon + 1);
    const plugin *p = registry_find(reg, LMH_KIND_CACHE, name);
    if (!p && !colon) {
        for (int i = 0; i < reg->n && !p; i++) {
            if (reg->items[i].info->kind != LMH_KIND_CACHE) continue;
            const lmh_cache_api *c = reg->items[i].info->api;
            for (const char *const *f = c->formats; *f; f++)
                if (strcmp(*f, spec) == 0) {
                    p = &reg->items[i];
                    snprintf(fmt, fmt_len, "%s", spec);
                    break;
                }
        }
    }
    if (!p) {
        char *names = registry_names(reg, LMH_KIND_CACHE, 0);
        errf(err, err_len, "unknown cache plugin '%s' (available: %s)", spec,
             names && *names ? names : "none");
        free(names);
        return NULL;
    }
    const lmh_cache_api *c = p->info->api;
    if (!fmt[0]) snprintf(fmt, fmt_len, "%s", c->formats[0]);
    for (const char *const *f = c->formats; *f; f++)
        if (strcmp(*f, fmt) == 0) return p;
    errf(err, err_len, "cache plugin '%s' has no format '%s'", name, fmt);
    return NULL;
}

engine *engine_open(const registry *reg, const engine_opts *o, char *err, size_t err_len) {
    engine *e = calloc(1, sizeof *e);
    if (!e) {
        errf(err, err_len, "out of memory");
        return NULL;
    }
    char merr[1024];
    e->md = md_open(o->model_dir, merr, sizeof merr);
    if (!e->md) {
        errf(err, err_len, "%s", merr);
        goto fail;
    }
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

    const char *bname = o->backend ? o->backend : "cpu";
    e->backend_p = registry_find(reg, LMH_KIND_BACKEND, bname);
    if (!e->backend_p) {
        char *names = registry_names(reg, LMH_KIND_BACKEND, 0);
        errf(err, err_len, "unknown backend plugin '%s' (available: %s)", bname,
             names && *names ? names : "none");
        free(names);
        goto fail;
    }
    e->be_api = e->backend_p->info->api;
    e->cache_p = pick_cache(reg, o->cache ? o->cache : "plain", e->cache_format,
                            sizeof e->cache_format, err, err_len);
    if (!e->cache_p) goto fail;
    e->cache_api = e->cache_p->info->api;

    lmh_backend_opts bo = {.size = sizeof bo, .threads = o->threads, .device = 0};
    char berr[512] = "";
    if (e->be_api->create(&host_api, &bo, &e->be, berr, sizeof berr) != 0 || !e->be) {
        errf(err, err_len, "backend %s failed to start: %s", bname, berr);
        goto fail;
    }

    lmh_load_ctx ld = {.e = e};
    if (e->arch->load(&host_api, &ld, &e->model) != 0 || ld.failed || !e->model) {
        errf(err, err_len, "%s: %s", o->model_dir,
             ld.failed ? ld.err : "architecture plugin failed without a reason");
        if (e->model) e->arch->unload(e->model);
        e->model = NULL;
        goto fail;
    }
    if (!e->layers) {
        errf(err, err_len, "architecture plugin %s did not declare the model",
             e->arch_p->info->name);
        goto fail;
    }

    e->max_seq_len = o->max_seq_len;
    if (!e->max_seq_len) {
        json_object *m = cfg_lookup(text_config(e), "max_position_embeddings");
        if (m && json_object_is_type(m, json_type_int)) e->max_seq_len = json_object_get_int(m);
    }
    lmh_cache_config cc = {.size = sizeof cc,
                           .format = e->cache_format,
                           .n_layers = e->n_layers,
                           .layers = e->layers,
                           .max_seq_len = e->max_seq_len};
    char cerr[512] = "";
    if (e->cache_api->create(&host_api, e->be_api, e->be, &cc, &e->cache, cerr, sizeof cerr) !=
            0 ||
        !e->cache) {
        errf(err, err_len, "cache %s failed to start: %s", e->cache_p->info->name, cerr);
        goto fail;
    }
    const char *bdesc = e->be_api->describe ? e->be_api->describe(e->be) : bname;
    snprintf(e->chain, sizeof e->chain, "arch=%s backend=%s cache=%s(%s)",
             e->arch_p->info->name, bdesc, e->cache_p->info->name, e->cache_format);
    return e;
fail:
    engine_close(e);
    return NULL;
}

int32_t engine_vocab(const engine *e) { return e->vocab; }
int32_t engine_n_layers(const engine *e) { return e->n_layers; }
json_object *engine_config(const engine *e) { return md_config(e->md); }
const char *engine_chain(const engine *e) { return e->chain; }

void engine_get_stats(engine *e, engine_stats *s) {
    memset(s, 0, sizeof *s);
    s->weight_bytes = e->weight_bytes;
    if (e->cache_api->bytes) s->cache_bytes = e->cache_api->bytes(e->cache);
    lmh_backend_mem m = {0};
    if (e->be_api->memory) e->be_api->memory(e->be, &m);
    s->backend_bytes = m.weights + m.other;
    s->weight_read_bytes = m.weight_bytes_read;
}

int engine_seq_add(engine *e, uint64_t seq) { return e->cache_api->seq_add(e->cache, seq); }
void engine_seq_remove(engine *e, uint64_t seq) { e->cache_api->seq_remove(e->cache, seq); }
int32_t engine_seq_len(engine *e, uint64_t seq) { return e->cache_api->seq_len(e->cache, seq); }
int engine_seq_trim(engine *e, uint64_t seq, int32_t len) {
    return e->cache_api->seq_trim(e->cache, seq, len);
}

int32_t engine_layer_rows(engine *e, uint64_t seq, int32_t layer) {
    return e->cache_api->layer_rows(e->cache, seq, layer);
}

const lmh_layer_state *engine_layer_state(const engine *e, int32_t layer) {
    return layer >= 0 && layer < e->n_layers ? &e->layers[layer] : NULL;
}

static lmh_tensor *input_tensor(engine *e, lmh_fwd *f, lmh_dtype dt, int64_t n, const void *data) {
    lmh_tensor *t = host_fwd_tensor(f, LMH_LAYER_INPUT, dt, 1, &n);
    if (t && e->be_api->upload(e->be, t, 0, data, (size_t)n * lmh_dtype_size(dt)) != 0) {
        fwd_failf(f, "upload of step inputs failed");
        return NULL;
    }
    return t;
}

int engine_step(engine *e, const engine_row *rows, int32_t n_rows, const int32_t *out_rows,
                int32_t n_out, float *logits, char *err, size_t err_len) {
    if (n_rows <= 0) return errf(err, err_len, "empty step");
    lmh_fwd f = {.e = e};
    int32_t *tok = malloc((size_t)n_rows * sizeof *tok);
    int32_t *pos = malloc((size_t)n_rows * sizeof *pos);
    f.segs = malloc((size_t)n_rows * sizeof *f.segs);
    int rc = -1;
    if (!tok || !pos || !f.segs) {
        errf(err, err_len, "out of memory");
        goto done;
    }
    for (int32_t i = 0; i < n_rows; i++) {
        if (rows[i].token < 0 || rows[i].token >= e->vocab) {
            errf(err, err_len, "token id %d out of range (vocabulary %d)", rows[i].token, e->vocab);
            goto done;
        }
        tok[i] = rows[i].token;
        if (i == 0 || rows[i].seq != rows[i - 1].seq) {
            for (int s = 0; s < f.n_segs; s++)
                if (f.segs[s].seq == rows[i].seq) {
                    errf(err, err_len, "rows of sequence %llu are not contiguous",
                         (unsigned long long)rows[i].seq);
                    goto done;
                }
            int32_t len = e->cache_api->seq_len(e->cache, rows[i].seq);
            if (len < 0) {
                errf(err, err_len, "unknown sequence %llu", (unsigned long long)rows[i].seq);
                goto done;
            }
            f.segs[f.n_segs++] = (seg){.seq = rows[i].seq, .r0 = i, .n = 0};
        }
        seg *g = &f.segs[f.n_segs - 1];
        pos[i] = e->cache_api->seq_len(e->cache, g->seq) + g->n;
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

    lmh_batch b = {.n_rows = n_rows, .n_out = n_out};
    b.tokens = input_tensor(e, &f, LMH_I32, n_rows, tok);
    b.positions = f.positions = input_tensor(e, &f, LMH_I32, n_rows, pos);
    b.out_rows = input_tensor(e, &f, LMH_I32, n_out, out_rows);
    int64_t lne[2] = {n_out, e->vocab};
    b.logits = host_fwd_tensor(&f, LMH_LAYER_OUTPUT, LMH_F32, 2, lne);
    if (f.failed) {
        errf(err, err_len, "%s", f.err);
        goto done;
    }
    int arc = e->arch->forward(e->model, &host_api, &f, &b);
    if (f.failed || arc != 0) {
        errf(err, err_len, "forward pass failed: %s", f.failed ? f.err : "architecture error");
        /* The cache may hold a partial step: take every sequence back to where it was. */
        for (int s = 0; s < f.n_segs; s++)
            e->cache_api->seq_trim(e->cache, f.segs[s].seq, pos[f.segs[s].r0]);
        goto done;
    }
    if (e->be_api->download(e->be, b.logits, 0, logits,
                            (size_t)n_out * (size_t)e->vocab * sizeof(float)) != 0) {
        errf(err, err_len, "reading logits back failed");
        goto done;
    }
    rc = 0;
done:
    /* Views before the tensors they view: free in reverse order of creation. */
    for (int i = f.n_tmp - 1; i >= 0; i--) e->be_api->tensor_free(e->be, f.tmp[i]);
    free(f.tmp);
    free(f.segs);
    free(tok);
    free(pos);
    return rc;
}
