/* lmhost quantize / dequantize: MLX-format affine quantization of a checkpoint without
 * Python.
 *
 * quantize writes what mlx-lm writes: every linear weight and embedding whose input width
 * divides into groups becomes X.weight (uint32, each row one LSB-first bit stream of
 * `bits`-wide values), X.scales and X.biases (the source dtype), with w = scale * q + bias.
 * Scale and bias per group are chosen as MLX's affine quantizer does: the range is split
 * into 2^bits - 1 steps, and the edge of larger magnitude is made exactly representable.
 * Per-expert tensors (experts.N.proj) are stacked into switch_mlp.proj [E, ...]; routers
 * take --router-bits through a per-module override in config.json.
 * dequantize writes the float32 checkpoint those quantized weights stand for. */
#include "cli.h"
#include "log.h"
#include "model_dir.h"
#include "progress.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float f16_to_f32(uint16_t h) {
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
    if (e == 0) {
        if (m == 0) {
            u = s;
        } else { /* subnormal: normalise */
            e = 127 - 15 + 1;
            while (!(m & 0x400)) {
                m <<= 1;
                e--;
            }
            u = s | (e << 23) | ((m & 0x3ff) << 13);
        }
    } else if (e == 31) {
        u = s | 0x7f800000u | (m << 13);
    } else {
        u = s | ((e + 127 - 15) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t s = (u >> 16) & 0x8000, e = (u >> 23) & 0xff, m = u & 0x7fffff;
    if (e == 0xff) return (uint16_t)(s | 0x7c00 | (m ? 0x200 : 0));
    int32_t ne = (int32_t)e - 127 + 15;
    if (ne >= 31) return (uint16_t)(s | 0x7c00);
    if (ne <= 0) {
        if (ne < -10) return (uint16_t)s;
        m |= 0x800000;
        uint32_t shift = (uint32_t)(14 - ne), half = 1u << (shift - 1);
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(s | r);
    }
    uint32_t r = ((uint32_t)ne << 10) | (m >> 13), rem = m & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
    return (uint16_t)(s | r);
}

static float get(const void *p, lmh_dtype dt, size_t i) {
    switch (dt) {
    case LMH_F32:
        return ((const float *)p)[i];
    case LMH_F16:
        return f16_to_f32(((const uint16_t *)p)[i]);
    case LMH_BF16:
        return bf16_to_f32(((const uint16_t *)p)[i]);
    default:
        return 0;
    }
}

/* Rounds to the storage dtype, as computing in that dtype does after each step. */
static float in_dtype(float v, lmh_dtype dt) {
    if (dt == LMH_BF16) return bf16_to_f32(f32_to_bf16(v));
    if (dt == LMH_F16) return f16_to_f32(f32_to_f16(v));
    return v;
}

static void put(void *p, lmh_dtype dt, size_t i, float v) {
    if (dt == LMH_F32)
        ((float *)p)[i] = v;
    else if (dt == LMH_F16)
        ((uint16_t *)p)[i] = f32_to_f16(v);
    else
        ((uint16_t *)p)[i] = f32_to_bf16(v);
}

/* One group: MLX's choice of scale and bias, then the codes. */
static void quant_group(const float *w, int64_t g, int bits, lmh_dtype dt, float *scale,
                        float *bias, uint32_t *codes) {
    float mx = w[0], mn = w[0];
    for (int64_t i = 1; i < g; i++) {
        mx = w[i] > mx ? w[i] : mx;
        mn = w[i] < mn ? w[i] : mn;
    }
    const float n_bins = (float)((1 << bits) - 1), eps = in_dtype(1e-7f, dt);
    int neg_edge = fabsf(mn) > fabsf(mx);
    float s = in_dtype(in_dtype(mx - mn, dt) / n_bins, dt);
    if (s < eps) s = eps;
    if (!neg_edge) s = -s;
    float edge = neg_edge ? mn : mx;
    float q0 = rintf(in_dtype(edge / s, dt));
    if (q0 != 0) s = in_dtype(edge / q0, dt);
    float b = q0 == 0 ? 0 : edge;
    for (int64_t i = 0; i < g; i++) {
        float q = rintf(in_dtype(in_dtype(w[i] - b, dt) / s, dt));
        q = q < 0 ? 0 : q > n_bins ? n_bins : q;
        codes[i] = (uint32_t)q;
    }
    *scale = s;
    *bias = b;
}

/* Appends `bits`-wide values LSB first into little-endian uint32 words. */
static void pack_row(const uint32_t *codes, int64_t n, int bits, uint32_t *words) {
    int64_t n_words = n * bits / 32;
    memset(words, 0, (size_t)n_words * sizeof *words);
    for (int64_t j = 0; j < n; j++) {
        int64_t bit = j * bits;
        words[bit / 32] |= codes[j] << (bit % 32);
        if (bit % 32 + bits > 32) words[bit / 32 + 1] |= codes[j] >> (32 - bit % 32);
    }
}

static uint32_t unpack_one(const uint32_t *words, int64_t j, int bits) {
    int64_t bit = j * bits;
    uint64_t two = words[bit / 32];
    if (bit % 32 + bits > 32) two |= (uint64_t)words[bit / 32 + 1] << 32;
    return (uint32_t)(two >> (bit % 32)) & ((1u << bits) - 1);
}

/* ---- the plan: every output tensor and where its data comes from ------------------ */

typedef enum { OUT_COPY, OUT_QWEIGHT, OUT_QSCALES, OUT_QBIASES, OUT_DEQUANT } out_kind;

typedef struct out_tensor {
    char *name;
    out_kind kind;
    lmh_dtype dtype;
    int32_t ndim;
    int64_t ne[LMH_MAX_DIMS];
    const st_tensor **src; /* one, or the experts being stacked */
    int32_t n_src;
    int bits, group;
    /* dequantize: the scales and biases beside src[0] */
    const st_tensor *scales, *biases;
    uint64_t offset, bytes;
} out_tensor;

typedef struct plan {
    out_tensor *t;
    int32_t n, cap;
    json_object *overrides; /* module path -> {"group_size", "bits"} */
} plan;

static out_tensor *add(plan *p) {
    if (p->n == p->cap) {
        p->cap = p->cap ? p->cap * 2 : 256;
        out_tensor *n = realloc(p->t, (size_t)p->cap * sizeof *n);
        if (!n) return NULL;
        p->t = n;
    }
    out_tensor *o = &p->t[p->n++];
    memset(o, 0, sizeof *o);
    return o;
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* Routers are quantized with their own bits (mlx-community checkpoints use 8). */
static int is_router(const char *name) {
    return ends_with(name, ".mlp.gate.weight") || ends_with(name, ".block_sparse_moe.gate.weight");
}

/* "P.experts.N.R.weight" -> P, N, R. The w1/w2/w3 naming of some checkpoints becomes
 * gate/down/up_proj, as mlx-lm names them. */
static int expert_parts(const char *name, char *pre, size_t pl, int *idx, char *proj, size_t jl) {
    const char *e = strstr(name, ".experts.");
    if (!e || !ends_with(name, ".weight")) return 0;
    const char *num = e + 9;
    char *end;
    long n = strtol(num, &end, 10);
    if (end == num || *end != '.') return 0;
    const char *r = end + 1;
    size_t rl = strlen(r) - strlen(".weight");
    if (rl == 0 || rl >= 64) return 0;
    snprintf(pre, pl, "%.*s", (int)(e - name), name);
    char raw[64];
    snprintf(raw, sizeof raw, "%.*s", (int)rl, r);
    const char *map = !strcmp(raw, "w1")   ? "gate_proj"
                      : !strcmp(raw, "w2") ? "down_proj"
                      : !strcmp(raw, "w3") ? "up_proj"
                                           : raw;
    snprintf(proj, jl, "%s", map);
    *idx = (int)n;
    return 1;
}

static int quantizable(const st_tensor *t, int group, int bits) {
    return t->ndim == 2 && lmh_dtype_is_float(t->dtype) && ends_with(t->name, ".weight") &&
           t->ne[1] % group == 0 && (t->ne[1] * bits) % 32 == 0;
}

static int add_quantized(plan *p, const char *base, const st_tensor **src, int32_t n_src,
                         int64_t out_dim, int64_t in_dim, int bits, int group) {
    static const out_kind kinds[3] = {OUT_QWEIGHT, OUT_QSCALES, OUT_QBIASES};
    static const char *const suffix[3] = {".weight", ".scales", ".biases"};
    for (int k = 0; k < 3; k++) {
        out_tensor *o = add(p);
        if (!o) return -1;
        size_t len = strlen(base) + 16;
        o->name = malloc(len);
        snprintf(o->name, len, "%s%s", base, suffix[k]);
        o->kind = kinds[k];
        o->dtype = k == 0 ? LMH_U32 : src[0]->dtype;
        o->src = malloc((size_t)n_src * sizeof *o->src);
        memcpy(o->src, src, (size_t)n_src * sizeof *o->src);
        o->n_src = n_src;
        o->bits = bits;
        o->group = group;
        int d = 0;
        if (n_src > 1) o->ne[d++] = n_src;
        o->ne[d++] = out_dim;
        o->ne[d++] = k == 0 ? in_dim * bits / 32 : in_dim / group;
        o->ndim = d;
    }
    return 0;
}

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp((*(const st_tensor *const *)a)->name, (*(const st_tensor *const *)b)->name);
}

static int build_quant_plan(model_dir *md, plan *p, int bits, int group, int router_bits) {
    int32_t n = md_count(md);
    const st_tensor **all = malloc((size_t)n * sizeof *all);
    char *done = calloc((size_t)n, 1);
    if (!all || !done) return -1;
    for (int32_t i = 0; i < n; i++) all[i] = md_at(md, i);
    qsort(all, (size_t)n, sizeof *all, cmp_tensor_name);
    p->overrides = json_object_new_object();
    for (int32_t i = 0; i < n; i++) {
        if (done[i]) continue;
        const st_tensor *t = all[i];
        char pre[512], proj[64];
        int idx;
        if (expert_parts(t->name, pre, sizeof pre, &idx, proj, sizeof proj) &&
            quantizable(t, group, bits)) {
            /* gather every expert of this projection, in expert order */
            int32_t cap = 0, m = 0;
            for (int32_t k = 0; k < n; k++) {
                char p2[512], j2[64];
                int i2;
                if (expert_parts(all[k]->name, p2, sizeof p2, &i2, j2, sizeof j2) &&
                    !strcmp(p2, pre) && !strcmp(j2, proj) && i2 + 1 > cap)
                    cap = i2 + 1;
            }
            const st_tensor **ex = calloc((size_t)cap, sizeof *ex);
            for (int32_t k = 0; k < n; k++) {
                char p2[512], j2[64];
                int i2;
                if (expert_parts(all[k]->name, p2, sizeof p2, &i2, j2, sizeof j2) &&
                    !strcmp(p2, pre) && !strcmp(j2, proj)) {
                    ex[i2] = all[k];
                    done[k] = 1;
                    m++;
                }
            }
            int ok = m == cap;
            for (int32_t k = 0; ok && k < cap; k++)
                ok = ex[k]->ndim == 2 && ex[k]->ne[0] == t->ne[0] && ex[k]->ne[1] == t->ne[1] &&
                     ex[k]->dtype == t->dtype;
            if (!ok) {
                log_msg(LMH_LOG_ERROR, "experts of %s.experts.*.%s are missing or differ in shape",
                        pre, proj);
                free(ex);
                free(all);
                free(done);
                return -1;
            }
            char base[640];
            snprintf(base, sizeof base, "%s.switch_mlp.%s", pre, proj);
            int rc = add_quantized(p, base, ex, cap, t->ne[0], t->ne[1], bits, group);
            free(ex);
            if (rc) return -1;
            continue;
        }
        done[i] = 1;
        int b = is_router(t->name) ? router_bits : bits;
        if (quantizable(t, group, b)) {
            char base[512];
            snprintf(base, sizeof base, "%.*s", (int)(strlen(t->name) - 7), t->name);
            if (b != bits) {
                json_object *o = json_object_new_object();
                json_object_object_add(o, "group_size", json_object_new_int(group));
                json_object_object_add(o, "bits", json_object_new_int(b));
                json_object_object_add(p->overrides, base, o);
            }
            if (add_quantized(p, base, &t, 1, t->ne[0], t->ne[1], b, group)) return -1;
        } else {
            out_tensor *o = add(p);
            if (!o) return -1;
            o->name = strdup(t->name);
            o->kind = OUT_COPY;
            o->dtype = t->dtype;
            o->ndim = t->ndim;
            memcpy(o->ne, t->ne, sizeof o->ne);
            o->src = malloc(sizeof *o->src);
            o->src[0] = t;
            o->n_src = 1;
        }
    }
    free(all);
    free(done);
    return 0;
}

/* Quantization settings of module `base` (an override, or the model-wide ones). */
static int module_quant(json_object *cfg, const char *base, int *bits, int *group) {
    json_object *q = cfg_lookup(cfg, "quantization");
    if (!q) q = cfg_lookup(cfg, "quantization_config");
    if (!q || !json_object_is_type(q, json_type_object)) return 0;
    json_object *b = json_object_object_get(q, "bits"),
                *g = json_object_object_get(q, "group_size");
    if (!b || !g) return 0;
    *bits = json_object_get_int(b);
    *group = json_object_get_int(g);
    json_object *ov = json_object_object_get(q, base);
    if (ov && json_object_is_type(ov, json_type_boolean) && !json_object_get_boolean(ov)) return 0;
    if (ov && json_object_is_type(ov, json_type_object)) {
        if ((b = json_object_object_get(ov, "bits"))) *bits = json_object_get_int(b);
        if ((g = json_object_object_get(ov, "group_size"))) *group = json_object_get_int(g);
    }
    return 1;
}

static int build_dequant_plan(model_dir *md, plan *p, char *err, size_t err_len) {
    json_object *cfg = md_config(md);
    for (int32_t i = 0; i < md_count(md); i++) {
        const st_tensor *t = md_at(md, i);
        if (ends_with(t->name, ".scales") || ends_with(t->name, ".biases")) {
            char w[512];
            snprintf(w, sizeof w, "%.*s.weight", (int)(strlen(t->name) - 7), t->name);
            if (md_find(md, w)) continue; /* consumed with its weight */
        }
        out_tensor *o = add(p);
        if (!o) return errf(err, err_len, "out of memory");
        o->name = strdup(t->name);
        o->src = malloc(sizeof *o->src);
        o->src[0] = t;
        o->n_src = 1;
        o->ndim = t->ndim;
        memcpy(o->ne, t->ne, sizeof o->ne);
        o->dtype = t->dtype;
        o->kind = OUT_COPY;
        if (!ends_with(t->name, ".weight")) continue;
        char base[512], sn[520], bn[520];
        snprintf(base, sizeof base, "%.*s", (int)(strlen(t->name) - 7), t->name);
        snprintf(sn, sizeof sn, "%s.scales", base);
        snprintf(bn, sizeof bn, "%s.biases", base);
        o->scales = md_find(md, sn);
        o->biases = md_find(md, bn);
        if (!o->scales || !o->biases) continue;
        int bits = 0, group = 0;
        if (!module_quant(cfg, base, &bits, &group))
            return errf(err, err_len, "%s has scales but config.json has no quantization for it",
                        t->name);
        if (t->dtype != LMH_U32 || bits < 2 || bits > 8 || group <= 0 ||
            !lmh_dtype_is_float(o->scales->dtype) || o->scales->dtype != o->biases->dtype)
            return errf(err, err_len, "%s: unsupported quantized layout", t->name);
        int64_t in = t->ne[t->ndim - 1] * 32 / bits;
        if (in % group || o->scales->ne[o->scales->ndim - 1] != in / group)
            return errf(err, err_len, "%s: scales do not match %d-bit groups of %d", t->name, bits,
                        group);
        o->kind = OUT_DEQUANT;
        o->dtype = LMH_F32;
        o->ne[t->ndim - 1] = in;
        o->bits = bits;
        o->group = group;
    }
    return 0;
}

/* ---- writing ---------------------------------------------------------------------- */

static const char *st_dtype(lmh_dtype d) {
    static const char *const n[] = {"F32", "F16", "BF16", "I32", "U32", "U8", "I8"};
    return (unsigned)d < sizeof n / sizeof *n ? n[d] : "?";
}

static uint64_t out_bytes(const out_tensor *o) {
    uint64_t b = lmh_dtype_size(o->dtype);
    for (int i = 0; i < o->ndim; i++) b *= (uint64_t)o->ne[i];
    return b;
}

/* Produces one output tensor's bytes into buf. */
static void produce(const out_tensor *o, uint8_t *buf) {
    if (o->kind == OUT_COPY) {
        memcpy(buf, o->src[0]->data, o->bytes);
        return;
    }
    if (o->kind == OUT_DEQUANT) {
        const st_tensor *t = o->src[0];
        int64_t in = o->ne[o->ndim - 1], rows = (int64_t)(o->bytes / 4) / in;
        int64_t wpr = in * o->bits / 32, gpr = in / o->group;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < in; j++) {
                uint32_t q = unpack_one((const uint32_t *)t->data + r * wpr, j, o->bits);
                size_t gi = (size_t)(r * gpr + j / o->group);
                float s = get(o->scales->data, o->scales->dtype, gi);
                float b = get(o->biases->data, o->biases->dtype, gi);
                ((float *)buf)[r * in + j] = s * (float)q + b;
            }
        return;
    }
    /* quantized parts: redo the rows' quantization and keep the part asked for */
    int64_t in = o->src[0]->ne[1], out = o->src[0]->ne[0], g = o->group;
    float *row = malloc((size_t)in * sizeof *row);
    uint32_t *codes = malloc((size_t)in * sizeof *codes);
    int64_t wpr = in * o->bits / 32, gpr = in / g;
    for (int32_t e = 0; e < o->n_src; e++)
        for (int64_t r = 0; r < out; r++) {
            const st_tensor *t = o->src[e];
            for (int64_t j = 0; j < in; j++) row[j] = get(t->data, t->dtype, (size_t)(r * in + j));
            int64_t R = (int64_t)e * out + r;
            for (int64_t k = 0; k < gpr; k++) {
                float s, b;
                quant_group(row + k * g, g, o->bits, t->dtype, &s, &b, codes + k * g);
                if (o->kind == OUT_QSCALES) put(buf, o->dtype, (size_t)(R * gpr + k), s);
                if (o->kind == OUT_QBIASES) put(buf, o->dtype, (size_t)(R * gpr + k), b);
            }
            if (o->kind == OUT_QWEIGHT) pack_row(codes, in, o->bits, (uint32_t *)buf + R * wpr);
        }
    free(row);
    free(codes);
}

/* Writes the plan's tensors to path, with a progress bar `label` on a terminal. */
static int write_safetensors(const char *path, plan *p, const char *format, const char *label,
                             char *err, size_t err_len) {
    json_object *h = json_object_new_object(), *meta = json_object_new_object();
    json_object_object_add(meta, "format", json_object_new_string(format));
    json_object_object_add(h, "__metadata__", meta);
    uint64_t off = 0;
    for (int32_t i = 0; i < p->n; i++) {
        out_tensor *o = &p->t[i];
        o->bytes = out_bytes(o);
        o->offset = off;
        off += o->bytes;
        json_object *e = json_object_new_object(), *sh = json_object_new_array(),
                    *of = json_object_new_array();
        for (int d = 0; d < o->ndim; d++)
            json_object_array_add(sh, json_object_new_int64(o->ne[d]));
        json_object_array_add(of, json_object_new_int64((int64_t)o->offset));
        json_object_array_add(of, json_object_new_int64((int64_t)(o->offset + o->bytes)));
        json_object_object_add(e, "dtype", json_object_new_string(st_dtype(o->dtype)));
        json_object_object_add(e, "shape", sh);
        json_object_object_add(e, "data_offsets", of);
        json_object_object_add(h, o->name, e);
    }
    const char *hs = json_object_to_json_string_ext(h, JSON_C_TO_STRING_PLAIN);
    size_t hl = strlen(hs), padded = (hl + 7) & ~(size_t)7;
    FILE *f = fopen(path, "wb");
    if (!f) {
        json_object_put(h);
        return errf(err, err_len, "cannot write %s: %s", path, strerror(errno));
    }
    uint64_t le = padded;
    int ok = fwrite(&le, 8, 1, f) == 1 && fwrite(hs, 1, hl, f) == hl;
    for (size_t i = hl; ok && i < padded; i++) ok = fputc(' ', f) != EOF;
    json_object_put(h);
    progress *bar = progress_start_tty_only(label, off, 1);
    for (int32_t i = 0; ok && i < p->n; i++) {
        uint8_t *buf = malloc(p->t[i].bytes ? p->t[i].bytes : 1);
        if (!buf) {
            progress_end(bar, 0);
            fclose(f);
            return errf(err, err_len, "out of memory for %s", p->t[i].name);
        }
        produce(&p->t[i], buf);
        ok = fwrite(buf, 1, p->t[i].bytes, f) == p->t[i].bytes;
        free(buf);
        progress_set(bar, p->t[i].offset + p->t[i].bytes);
    }
    if (fclose(f) != 0) ok = 0;
    progress_end(bar, ok);
    return ok ? 0 : errf(err, err_len, "writing %s failed", path);
}

/* Tokenizer, generation config, chat template...: everything but weights and config. */
static void copy_side_files(const char *from, const char *to) {
    DIR *d = opendir(from);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *n = e->d_name;
        if (n[0] == '.' || strstr(n, ".safetensors") || !strcmp(n, "config.json")) continue;
        char a[4096], b[4096];
        snprintf(a, sizeof a, "%s/%s", from, n);
        snprintf(b, sizeof b, "%s/%s", to, n);
        struct stat st;
        if (stat(a, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        FILE *in = fopen(a, "rb"), *out = in ? fopen(b, "wb") : NULL;
        char buf[65536];
        size_t k;
        while (in && out && (k = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, k, out);
        if (in) fclose(in);
        if (out) fclose(out);
    }
    closedir(d);
}

static void free_plan(plan *p) {
    for (int32_t i = 0; i < p->n; i++) {
        free(p->t[i].name);
        free(p->t[i].src);
    }
    free(p->t);
    json_object_put(p->overrides);
}

static int run(int quantize, int argc, char **argv) {
    const char *model = NULL, *out = NULL, *bits_s = NULL, *group_s = NULL, *router_s = NULL;
    cli_opt qopts[] = {
        {"--model", &model, NULL, 0, "DIR", "required",
         "the checkpoint to quantize (f32/f16/bf16)"},
        {"--out", &out, NULL, 0, "DIR", "required", "where the quantized checkpoint goes"},
        {"--bits", &bits_s, NULL, 0, "N", "4", "bits a weight: 2, 3, 4, 5, 6 or 8"},
        {"--group-size", &group_s, NULL, 0, "N", "64", "weights sharing a scale: 32, 64 or 128"},
        {"--router-bits", &router_s, NULL, 0, "N", "8", "bits of mixture-of-experts routers"},
        {0}};
    cli_opt dopts[] = {
        {"--model", &model, NULL, 0, "DIR", "required", "the quantized checkpoint"},
        {"--out", &out, NULL, 0, "DIR", "required", "where the float32 checkpoint goes"},
        {0}};
    if (cli_parse(argc, argv, quantize ? qopts : dopts)) return 2;
    if (!model || !out) {
        fprintf(stderr, "lmhost %s: --model and --out are required\n", argv[0]);
        return 2;
    }
    int64_t bits = 4, group = 64, router = 8;
    if (bits_s && cli_int("--bits", bits_s, 2, 8, &bits)) return 2;
    if (group_s && cli_int("--group-size", group_s, 32, 128, &group)) return 2;
    if (router_s && cli_int("--router-bits", router_s, 2, 8, &router)) return 2;
    if (bits == 7 || router == 7 || (group != 32 && group != 64 && group != 128)) {
        fprintf(stderr, "lmhost quantize: bits must be 2, 3, 4, 5, 6 or 8 and the group size "
                        "32, 64 or 128\n");
        return 2;
    }
    char err[1024];
    model_dir *md = md_open(model, err, sizeof err);
    if (!md) {
        fprintf(stderr, "lmhost: %s\n", err);
        return 1;
    }
    json_object *cfg = md_config(md);
    if (quantize && (cfg_lookup(cfg, "quantization") || cfg_lookup(cfg, "quantization_config"))) {
        fprintf(stderr, "lmhost quantize: %s is already quantized\n", model);
        md_close(md);
        return 1;
    }
    plan p = {0};
    int rc = quantize ? build_quant_plan(md, &p, (int)bits, (int)group, (int)router)
                      : build_dequant_plan(md, &p, err, sizeof err);
    if (rc) {
        fprintf(stderr, "lmhost %s: %s\n", argv[0], quantize ? "cannot plan the output" : err);
        free_plan(&p);
        md_close(md);
        return 1;
    }
    if (mkdir(out, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "lmhost %s: cannot create %s: %s\n", argv[0], out, strerror(errno));
        free_plan(&p);
        md_close(md);
        return 1;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    char label[256];
    const char *base = strrchr(model, '/');
    snprintf(label, sizeof label, "%s %s", quantize ? "quantizing" : "dequantizing",
             base && base[1] ? base + 1 : model);
    rc = write_safetensors(path, &p, quantize ? "mlx" : "pt", label, err, sizeof err);
    if (rc == 0) {
        json_object *c = NULL;
        json_object_deep_copy(cfg, &c, NULL);
        json_object_object_del(c, "quantization");
        json_object_object_del(c, "quantization_config");
        if (quantize) {
            json_object *q = json_object_new_object();
            json_object_object_add(q, "group_size", json_object_new_int((int)group));
            json_object_object_add(q, "bits", json_object_new_int((int)bits));
            json_object_object_foreach(p.overrides, k, v) {
                json_object_object_add(q, k, json_object_get(v));
            }
            json_object *q2 = NULL;
            json_object_deep_copy(q, &q2, NULL);
            json_object_object_add(c, "quantization", q);
            json_object_object_add(c, "quantization_config", q2);
        }
        snprintf(path, sizeof path, "%s/config.json", out);
        if (json_object_to_file_ext(path, c, JSON_C_TO_STRING_PRETTY) != 0)
            rc = errf(err, sizeof err, "cannot write %s", path);
        json_object_put(c);
        copy_side_files(model, out);
    }
    if (rc) fprintf(stderr, "lmhost %s: %s\n", argv[0], err);
    uint64_t total = 0;
    for (int32_t i = 0; i < p.n; i++) total += p.t[i].bytes;
    if (!rc)
        fprintf(stderr, "lmhost %s: wrote %s (%d tensors, %.1f MiB)\n", argv[0], out, p.n,
                (double)total / 1048576.0);
    free_plan(&p);
    md_close(md);
    return rc ? 1 : 0;
}

int cli_quantize(int argc, char **argv) {
    return run(1, argc, argv);
}
int cli_dequantize(int argc, char **argv) {
    return run(0, argc, argv);
}
