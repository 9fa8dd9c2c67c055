/* The group-quantized cache plugin (MLX-style affine, as mlx-lm's quantized KV cache):
 * keys and values stored as 8- or 4-bit codes with an f32 scale and bias for each group
 * of 64 (or 32, 16: what divides the head size; or 16 to 128 as the setting group=N says)
 * values of a row and head. A row of a head is one run of 32-bit words: its codes, then its
 * scales, then its biases; a store holds each K/V head's rows together ([heads, rows,
 * words]), so that attention reads a head's rows in one stream.
 *
 * The format is the plugin's own, so it brings its kernels (plugin ABI 1.6): quantize the
 * appended rows into their slots; decode's attention straight from the codes (attend,
 * then attend_merge over its chunks); the stored rows dequantized into f32 for the
 * backend's attention op in prefill steps and for shapes attend does not take; words
 * moved when a store grows. Each has a C function for the CPU backend and a SPIR-V module
 * for Vulkan (shaders/, built with glslangValidator); no backend knows the format. Rows go
 * where kv_seqs.h puts them (every position, or a ring for a sliding window), as in the
 * plain cache. */
#include "lmhost/lmhost.h"
#include "kv_copy.h"
#include "kv_seqs.h"
#include "seq_state.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef HAVE_SPIRV
#include "spv_attend_b4_l16.h"
#include "spv_attend_b4_l32.h"
#include "spv_attend_b4_l8.h"
#include "spv_attend_b8_l16.h"
#include "spv_attend_b8_l32.h"
#include "spv_attend_b8_l8.h"
#include "spv_attend_merge.h"
#include "spv_dequantize.h"
#include "spv_move.h"
#include "spv_quantize.h"
#endif

#define WG                                                                                         \
    64 /* items a workgroup of dequantize and move (their shaders' local size); rows a             \
          block of attend's C function */

/* ---- kernels: C for the CPU; shaders/ must compute the same ---------------------------- */

/* A value's code: round((v - min) / scale), halves up, clamped to [0, nb]. The quotient
 * through an approximate reciprocal (a GPU's division is not exact) can be one off, so
 * the code is checked and moved against the exact products (q -/+ 0.5) * scale: every
 * backend then gives the same codes. Built with -ffp-contract=off (the shaders mark the
 * same expressions `precise`), since a fused multiply-add would round differently. */
static uint32_t code_of(float v, float mn, float scale, float inv, float nb) {
    float d = v - mn;
    float q = floorf(d * inv + 0.5f);
    q = q < 0.0f ? 0.0f : q > nb ? nb : q;
    if (q > 0.0f && d < (q - 0.5f) * scale)
        q -= 1.0f;
    else if (q < nb && d >= (q + 0.5f) * scale)
        q += 1.0f;
    return (uint32_t)q;
}

/* params of quantize: items (rows * heads * groups a row), heads, hd, bits, group, words
 * (a row and head's), first slot, ring (slots, 0: in order), 1 / (2^bits - 1) as f32 bits
 * (the same float on every backend), rows of the store */
static void quantize_group(const float *src, uint32_t *dst, const uint32_t *p, uint32_t item) {
    uint32_t heads = p[1], hd = p[2], bits = p[3], group = p[4], words = p[5];
    uint32_t ng = hd / group, grp = item % ng, rh = item / ng, h = rh % heads, r = rh / heads;
    const float *x = src + (size_t)rh * hd + (size_t)grp * group;
    uint32_t slot = p[7] ? (p[6] + r) % p[7] : p[6] + r;
    uint32_t *row = dst + ((size_t)h * p[9] + slot) * words;
    float mn = x[0], mx = x[0];
    for (uint32_t i = 1; i < group; i++) {
        mn = fminf(mn, x[i]);
        mx = fmaxf(mx, x[i]);
    }
    float nb = (float)((1u << bits) - 1u), rnb;
    memcpy(&rnb, &p[8], 4);
    float scale = (mx - mn) * rnb;
    if (!(scale > 0.0f)) scale = 1.0f; /* a constant group: every code 0 */
    float inv = 1.0f / scale;
    uint32_t per = 32 / bits, w0 = grp * group / per;
    for (uint32_t w = 0; w < group / per; w++) {
        uint32_t word = 0;
        for (uint32_t j = 0; j < per; j++)
            word |= code_of(x[w * per + j], mn, scale, inv, nb) << (j * bits);
        row[w0 + w] = word;
    }
    uint32_t codes = hd * bits / 32;
    memcpy(&row[codes + grp], &scale, 4);
    memcpy(&row[codes + ng + grp], &mn, 4);
}

/* a workgroup a group (the shader's threads share its values) */
static void quantize_cpu(const lmh_kernel_cpu_args *a, uint32_t first, uint32_t count) {
    const uint32_t *p = a->call->params;
    for (uint32_t i = first; i < first + count && i < p[0]; i++)
        quantize_group(a->data[0], a->data[1], p, i);
}

/* params of dequantize: items (rows * heads * hd), heads, hd, bits, group, words, rows of
 * the store, first slot, ring (slots, 0: in order); output row r is slot first + r (mod
 * ring), [rows, heads, hd] as the attention op takes it */
static void dequantize_cpu(const lmh_kernel_cpu_args *a, uint32_t first, uint32_t count) {
    const uint32_t *p = a->call->params, *src = a->data[0];
    float *dst = a->data[1];
    uint32_t hd = p[2], bits = p[3], group = p[4], words = p[5];
    uint32_t per = 32 / bits, codes = hd * bits / 32, ng = hd / group, mask = (1u << bits) - 1u;
    uint64_t end = (uint64_t)(first + count) * WG;
    if (end > p[0]) end = p[0];
    for (uint64_t e = (uint64_t)first * WG; e < end; e++) {
        uint32_t d = (uint32_t)(e % hd);
        uint64_t rh = e / hd;
        uint32_t r = (uint32_t)(rh / p[1]), slot = p[8] ? (p[7] + r) % p[8] : p[7] + r;
        const uint32_t *row = src + ((rh % p[1]) * p[6] + slot) * words;
        uint32_t q = (row[d / per] >> ((d % per) * bits)) & mask, g = d / group;
        float scale, bias;
        memcpy(&scale, &row[codes + g], 4);
        memcpy(&bias, &row[codes + ng + g], 4);
        dst[e] = (float)q * scale + bias;
    }
}

/* params of move: items (words), words a head, from, to (word offsets of the first head's
 * run in the source and destination), the two stores' words a head: a run of words for
 * every head, from one store to another */
static void move_cpu(const lmh_kernel_cpu_args *a, uint32_t first, uint32_t count) {
    const uint32_t *p = a->call->params, *src = a->data[0];
    uint32_t *dst = a->data[1];
    uint64_t end = (uint64_t)(first + count) * WG;
    if (end > p[0]) end = p[0];
    for (uint64_t i = (uint64_t)first * WG; i < end; i++) {
        uint64_t h = i / p[1], k = i % p[1];
        dst[p[3] + h * p[5] + k] = src[p[2] + h * p[4] + k];
    }
}

/* params of attend (one decode query over the store, a workgroup a K/V head and chunk of
 * rows): items (kv heads * chunks), heads, kvh, d, dv, bits, groups of K and V, rows
 * held, positions appended, rows of the store, whether they are a ring, window, scale
 * and soft-cap as f32 bits, rows a chunk (a multiple of ATT_SLOTS). Tensors: q [1, heads,
 * d], its position (i32), the K and V stores, partials [heads, chunks, dv + 2] (each
 * chunk's weighted values, max and sum), which attend_merge then merges. The limits are
 * shaders/attend.comp's (its builds, shared memory and registers); attend_fits checks
 * them, and other shapes take the dequantized copy. */
enum {
    ATT_LANES = 8,      /* lanes a row: a lane's slice is d / 8 values */
    ATT_SLOTS = 32,     /* rows a block */
    ATT_SCORES = 2048,  /* a chunk's scores (G x rows), at most */
    ATT_MAXCH = 1024,   /* chunks (attend_merge.comp's shared memory), at most */
    ATT_SLICE_MAX = 64, /* a lane's values of all G queries (G x d / 8), at most */
};

/* Query head h's output from its nch chunks' partials at part ([heads, nch, dv + 2]); sinks
 * (NULL: none) adds head h's sink logit to the denominator. */
static void merge_head(const float *part, uint32_t nch, uint32_t dv, uint32_t h, const float *sinks,
                       float *out) {
    const float *b = part + (size_t)h * nch * (dv + 2);
    float m = -INFINITY;
    for (uint32_t c = 0; c < nch; c++)
        if (b[c * (dv + 2) + dv + 1] > 0.0f) m = fmaxf(m, b[c * (dv + 2) + dv]);
    const float sink = sinks ? expf(sinks[h] - m) : 0.0f;
    for (uint32_t i = 0; i < dv; i++) {
        float l = 0.0f, acc = 0.0f;
        for (uint32_t c = 0; c < nch; c++) {
            const float *pc = b + c * (dv + 2);
            if (!(pc[dv + 1] > 0.0f)) continue;
            float w = expf(pc[dv] - m);
            l += pc[dv + 1] * w;
            acc += pc[i] * w;
        }
        out[(size_t)h * dv + i] = acc / (l + sink);
    }
}

/* x86-64: an AVX2 build of decode attention beside the baseline one, picked at load (the
 * plugin must run on any x86-64, as the CPU backend's kernels do); the helpers below are
 * inlined into both */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HOT_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define HOT_CLONES
#endif

/* A stored row's n values back to f32: codes in order (little-endian words, so code i of
 * an 8-bit row is byte i, of a 4-bit row nibble i % 2 of byte i / 2), then the scales and
 * biases of its groups. */
static inline __attribute__((always_inline)) void
row_values(const uint32_t *row, uint32_t n, uint32_t bits, uint32_t group, float *out) {
    const uint8_t *cb = (const uint8_t *)row;
    const float *sb = (const float *)(row + n * bits / 32);
    for (uint32_t g0 = 0; g0 < n; g0 += group) {
        float sc = sb[g0 / group], bi = sb[n / group + g0 / group];
        const uint8_t *c8 = cb + g0;
        uint8_t c4[128]; /* a 4-bit group's codes a byte each (groups are at most 128) */
        if (bits == 4) {
            for (uint32_t k = 0; k < group / 2; k++) {
                c4[2 * k] = cb[g0 / 2 + k] & 15u;
                c4[2 * k + 1] = cb[g0 / 2 + k] >> 4;
            }
            c8 = c4;
        }
        for (uint32_t i = 0; i < group; i++) out[g0 + i] = (float)c8[i] * sc + bi;
    }
}

/* sum of a[i] * b[i], n a multiple of 16, in eight running lanes (which the compiler keeps
 * in a vector; one running sum would be a chain of dependent adds) */
static inline __attribute__((always_inline)) float dot16(const float *a, const float *b,
                                                         uint32_t n) {
    float l[8] = {0};
    for (uint32_t i = 0; i < n; i += 8)
        for (int u = 0; u < 8; u++) l[u] += a[i + u] * b[i + u];
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

HOT_CLONES static void attend_chunk(const lmh_kernel_cpu_args *a, uint32_t item) {
    const uint32_t *p = a->call->params;
    uint32_t heads = p[1], kvh = p[2], d = p[3], dv = p[4], bits = p[5], gk = p[6], gv = p[7];
    uint32_t nkv = p[8], pos = p[9], cap = p[10], ring = p[11] ? cap : 0, chunk = p[15];
    int32_t window = (int32_t)p[12];
    uint32_t wk = d * bits / 32 + 2 * d / gk, wv = dv * bits / 32 + 2 * dv / gv;
    float scale, softcap;
    memcpy(&scale, &p[13], 4);
    memcpy(&softcap, &p[14], 4);
    const float *q = a->data[0];
    int32_t pq = *(const int32_t *)a->data[1];
    const uint32_t *ks = a->data[2], *vs = a->data[3];
    float *part = a->data[4];
    uint32_t nch = (nkv + chunk - 1) / chunk, g = item / nch, ch = item % nch, G = heads / kvh;
    uint32_t first = ch * chunk, last = first + chunk < nkv ? first + chunk : nkv;
    /* attend_fits: G <= 8, d = dv <= 256, G x dv <= 512 */
    float sp[8][WG], kf[256], acc[512], m[8], l[8];
    for (uint32_t h = 0; h < G; h++) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
    }
    memset(acc, 0, (size_t)G * dv * sizeof *acc);
    /* blocks of WG rows, the softmax kept online over them */
    for (uint32_t r0 = first; r0 < last; r0 += WG) {
        uint32_t rows = last - r0 < WG ? last - r0 : WG;
        for (uint32_t t = 0; t < rows; t++) {
            uint32_t j = r0 + t;
            int32_t pk = ring ? (int32_t)pos - 1 - (int32_t)((pos - 1 - j) % ring) : (int32_t)j;
            if (!(pk <= pq && (window == 0 || pq - pk < window))) {
                for (uint32_t h = 0; h < G; h++) sp[h][t] = -INFINITY;
                continue;
            }
            row_values(ks + ((size_t)g * cap + j) * wk, d, bits, gk, kf);
            for (uint32_t h = 0; h < G; h++) {
                float sc = dot16(q + (size_t)(g * G + h) * d, kf, d) * scale;
                sp[h][t] = softcap > 0.0f ? softcap * tanhf(sc / softcap) : sc;
            }
        }
        for (uint32_t h = 0; h < G; h++) {
            float mn = m[h];
            for (uint32_t t = 0; t < rows; t++) mn = fmaxf(mn, sp[h][t]);
            float al = mn == -INFINITY ? 1.0f : expf(m[h] - mn);
            l[h] *= al;
            for (uint32_t i = 0; i < dv; i++) acc[h * dv + i] *= al;
            for (uint32_t t = 0; t < rows; t++) {
                float e = mn == -INFINITY ? 0.0f : expf(sp[h][t] - mn);
                sp[h][t] = e;
                l[h] += e;
            }
            m[h] = mn;
        }
        for (uint32_t t = 0; t < rows; t++) {
            int any = 0;
            for (uint32_t h = 0; h < G; h++) any |= sp[h][t] != 0.0f;
            if (!any) continue;
            row_values(vs + ((size_t)g * cap + r0 + t) * wv, dv, bits, gv, kf);
            for (uint32_t h = 0; h < G; h++) {
                float w = sp[h][t], *ah = acc + (size_t)h * dv;
                for (uint32_t i = 0; i < dv; i++) ah[i] += w * kf[i];
            }
        }
    }
    for (uint32_t h = 0; h < G; h++) {
        float *o = part + ((size_t)(g * G + h) * nch + ch) * (dv + 2);
        memcpy(o, acc + (size_t)h * dv, dv * sizeof *o);
        o[dv] = m[h];
        o[dv + 1] = l[h];
    }
}

static void attend_cpu(const lmh_kernel_cpu_args *a, uint32_t first, uint32_t count) {
    for (uint32_t i = first; i < first + count && i < a->call->params[0]; i++) attend_chunk(a, i);
}

/* params of attend_merge: items (heads), chunks, dv, whether there are sinks; tensors:
 * partials, out [1, heads, dv], the sinks f32 [heads] (ABI 1.10 attention sinks); a
 * workgroup a head */
static void attend_merge_cpu(const lmh_kernel_cpu_args *a, uint32_t first, uint32_t count) {
    const uint32_t *p = a->call->params;
    for (uint32_t h = first; h < first + count && h < p[0]; h++)
        merge_head(a->data[0], p[1], p[2], h, p[3] ? a->data[2] : NULL, a->data[1]);
}

#ifdef HAVE_SPIRV
#define SPIRV(n) .spirv = spv_##n, .spirv_bytes = sizeof spv_##n
#else
#define SPIRV(n) .spirv = NULL
#endif
/* attend's builds: 8- and 4-bit codes, a lane's slice of 8, 16 or 32 values (heads of 64,
 * 128, 256); the C function serves them all */
enum {
    K_QUANTIZE,
    K_DEQUANTIZE,
    K_MOVE,
    K_ATTEND_MERGE,
    K_ATTEND, /* the first of the six builds: b8 l8, l16, l32, b4 l8, l16, l32 */
    K_COUNT = K_ATTEND + 6
};
#define ATTEND(b, l)                                                                               \
    {                                                                                              \
        sizeof(lmh_kernel_desc), "cache-quant attend " #b "-bit, " #l " a lane", attend_cpu,       \
            SPIRV(attend_b##b##_l##l)                                                              \
    }
static const lmh_kernel_desc kernel_descs[K_COUNT] = {
    {sizeof(lmh_kernel_desc), "cache-quant quantize", quantize_cpu, SPIRV(quantize)},
    {sizeof(lmh_kernel_desc), "cache-quant dequantize", dequantize_cpu, SPIRV(dequantize)},
    {sizeof(lmh_kernel_desc), "cache-quant move", move_cpu, SPIRV(move)},
    {sizeof(lmh_kernel_desc), "cache-quant attend_merge", attend_merge_cpu, SPIRV(attend_merge)},
    ATTEND(8, 8),
    ATTEND(8, 16),
    ATTEND(8, 32),
    ATTEND(4, 8),
    ATTEND(4, 16),
    ATTEND(4, 32),
};

/* ---- the store ------------------------------------------------------------------------- */

typedef struct side {  /* keys or values of a layer */
    int32_t hd, group; /* values a row and head; values a scale */
    int32_t words;     /* 32-bit words a row and head */
} side;

typedef kv_layer layer_kv; /* k, v: i32 [kv_heads, cap, words] */
typedef kv_seq seq;

struct lmh_cache {
    const lmh_host_api *host;
    const lmh_backend_api *be;
    lmh_backend *b;
    lmh_kernel *kern[K_COUNT];
    uint8_t refused[K_COUNT]; /* attend builds the backend refused (attend_ready) */
    int32_t bits;
    int32_t n_layers;
    lmh_layer_state *layers;
    lmh_recurrent_state *rec; /* f32, as seq_state.h keeps it; NULL: none */
    side *ks, *vs;            /* per layer */
    int32_t max_len;
    kv_seqs t;
    uint64_t bytes, read;
    /* f32 keys and values for attention, shared by every layer and sequence: on a GPU the
     * backend orders their reuse (a barrier where a dequantize follows an attention) */
    lmh_tensor *fk, *fv;
    size_t fk_floats, fv_floats;
    lmh_tensor *part; /* decode attention's partials, shared the same way */
    size_t part_floats;
    int copy_only; /* LMHOST_DEBUG cq-dequant: decode takes the f32 copy too (for comparison) */
};

static const char *const formats[] = {"q8", "q4", NULL};
static const int32_t kv_bits[] = {8, 4}; /* mlx-lm's kv_bits: these are its formats */

/* The largest of 64, 32, 16 that divides hd (MLX's default group is 64); 0: none. */
static int32_t pick_group(int32_t hd) {
    for (int32_t g = 64; g >= 16; g /= 2)
        if (hd % g == 0) return g;
    return 0;
}

/* group: the one asked for in the settings, 0 for pick_group's */
static side make_side(int32_t hd, int32_t bits, int32_t group) {
    side s = {.hd = hd, .group = group ? group : pick_group(hd)};
    if (s.group) s.words = hd * bits / 32 + 2 * (hd / s.group);
    return s;
}

/* The format's settings (ABI 1.8), "group=N": values a scale and bias, as mlx-lm's
 * kv_group_size. 16 to 128: quantize.comp takes groups of at most 128, and attend takes any
 * group that is a multiple of a lane's slice (attend_fits; decode reads the dequantized copy
 * for others). *group is 0 where the settings name none. */
static int parse_options(const lmh_cache_config *cfg, const char *fmt, int32_t *group, char *err,
                         size_t err_len) {
    static const char *const groups[] = {"16", "32", "64", "128"};
    *group = 0;
    /* a host built before ABI 1.8 passes a struct that ends before options */
    if (cfg->size < offsetof(lmh_cache_config, options) + sizeof cfg->options || !cfg->options)
        return LMH_OK;
    const char *p = cfg->options;
    do {
        size_t n = strcspn(p, ",");
        if (n < 6 || strncmp(p, "group=", 6) != 0) {
            snprintf(err, err_len, "format %s: unknown setting '%.*s' (known: group=16|32|64|128)",
                     fmt, (int)n, p);
            return LMH_EINVAL;
        }
        if (*group) {
            snprintf(err, err_len, "format %s: 'group' is given twice", fmt);
            return LMH_EINVAL;
        }
        for (int i = 0; i < 4; i++)
            if (n - 6 == strlen(groups[i]) && strncmp(p + 6, groups[i], n - 6) == 0)
                *group = atoi(groups[i]);
        if (!*group) {
            snprintf(err, err_len, "format %s: '%.*s': the group must be 16, 32, 64 or 128", fmt,
                     (int)n, p);
            return LMH_EINVAL;
        }
        p += n;
    } while (*p++);
    return LMH_OK;
}

static uint64_t layer_bytes(const lmh_cache *c, int32_t l, int32_t rows) {
    return (uint64_t)rows * (uint64_t)c->layers[l].n_kv_heads *
           (uint64_t)(c->ks[l].words + c->vs[l].words) * 4;
}

static int create(const lmh_host_api *host, const lmh_backend_api *be, lmh_backend *b,
                  const lmh_cache_config *cfg, lmh_cache **out, char *err, size_t err_len) {
    int32_t bits = 8;
    if (cfg->format && strcmp(cfg->format, "q4") == 0)
        bits = 4;
    else if (cfg->format && strcmp(cfg->format, "q8") != 0) {
        snprintf(err, err_len, "format '%s' is not one of q8, q4", cfg->format);
        return LMH_EINVAL;
    }
    int32_t group;
    int orc = parse_options(cfg, bits == 8 ? "q8" : "q4", &group, err, err_len);
    if (orc != LMH_OK) return orc;
    if (be->size < offsetof(lmh_backend_api, kernel_run) + sizeof be->kernel_run ||
        !be->kernel_add || !be->kernel_run) {
        snprintf(err, err_len, "the backend runs no plugin kernels (plugin ABI 1.6)");
        return LMH_EUNSUPPORTED;
    }
    for (int32_t l = 0; l < cfg->n_layers; l++) {
        const lmh_layer_state *s = &cfg->layers[l];
        if (s->kind == LMH_STATE_KV && (!pick_group(s->head_dim_k) || !pick_group(s->head_dim_v))) {
            snprintf(err, err_len,
                     "layer %d: head sizes %d and %d must be multiples of 16 to quantize", l,
                     s->head_dim_k, s->head_dim_v);
            return LMH_EUNSUPPORTED;
        }
        if (s->kind == LMH_STATE_KV && group && (s->head_dim_k % group || s->head_dim_v % group)) {
            snprintf(err, err_len, "group=%d does not divide layer %d's head sizes (%d and %d)",
                     group, l, s->head_dim_k, s->head_dim_v);
            return LMH_EINVAL;
        }
    }
    lmh_cache *c = calloc(1, sizeof *c);
    if (!c) return LMH_ENOMEM;
    int rrc = rec_config(cfg, &c->rec, err, err_len);
    c->layers = calloc((size_t)cfg->n_layers + 1, sizeof *c->layers);
    c->ks = calloc((size_t)cfg->n_layers + 1, sizeof *c->ks);
    c->vs = calloc((size_t)cfg->n_layers + 1, sizeof *c->vs);
    if (rrc != LMH_OK || !c->layers || !c->ks || !c->vs) {
        free(c->rec);
        free(c->layers);
        free(c->ks);
        free(c->vs);
        free(c);
        return rrc != LMH_OK ? rrc : LMH_ENOMEM;
    }
    memcpy(c->layers, cfg->layers, (size_t)cfg->n_layers * sizeof *c->layers);
    c->host = host;
    c->be = be;
    c->b = b;
    c->bits = bits;
    c->n_layers = cfg->n_layers;
    c->max_len = cfg->max_seq_len;
    c->copy_only = lmh_debug_on("cq-dequant");
    kv_seqs_init(&c->t, c->layers, c->rec, c->n_layers);
    for (int32_t l = 0; l < c->n_layers; l++) {
        if (c->layers[l].kind != LMH_STATE_KV) continue;
        c->ks[l] = make_side(c->layers[l].head_dim_k, bits, group);
        c->vs[l] = make_side(c->layers[l].head_dim_v, bits, group);
    }
    for (int i = 0; i < K_ATTEND; i++) { /* attend's builds when first used (attend_ready) */
        int rc = be->kernel_add(b, &kernel_descs[i], &c->kern[i], err, err_len);
        if (rc != LMH_OK) {
            free(c->rec);
            free(c->layers);
            free(c->ks);
            free(c->vs);
            free(c);
            return rc;
        }
    }
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
    if (c->fk) c->be->tensor_free(c->b, c->fk);
    if (c->fv) c->be->tensor_free(c->b, c->fv);
    if (c->part) c->be->tensor_free(c->b, c->part);
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
    return kv_seq_trim(&c->t, id, len);
}

/* Runs kernel k from src into dst over `items` (params[0]), `per` of them a workgroup. */
static int run(lmh_cache *c, int k, lmh_tensor *src, lmh_tensor *dst, uint64_t items, uint32_t per,
               const uint32_t *params, int n_params) {
    if (items == 0) return LMH_OK;
    if (items > UINT32_MAX - WG) return LMH_EINVAL;
    lmh_kernel_call call = {.n_tensors = 2, .t = {src, dst}, .writes = 2u};
    call.params[0] = (uint32_t)items;
    memcpy(call.params + 1, params, (size_t)n_params * 4);
    call.groups = (uint32_t)((items + per - 1) / per);
    return c->be->kernel_run(c->b, c->kern[k], &call);
}

/* Copies rows [from, from + n) of store src into rows [at, at + n) of dst, every head. */
static int move_rows(lmh_cache *c, lmh_tensor *dst, int32_t at, lmh_tensor *src, int32_t from,
                     int32_t n) {
    uint64_t w = (uint64_t)dst->ne[2];
    uint32_t p[5] = {(uint32_t)(n * w), (uint32_t)(from * w), (uint32_t)(at * w),
                     (uint32_t)(src->ne[1] * w), (uint32_t)(dst->ne[1] * w)};
    return run(c, K_MOVE, src, dst, (uint64_t)n * w * (uint64_t)dst->ne[0], WG, p, 5);
}

/* Reallocates (seq, layer) to `cap` rows and moves the positions still needed there. */
static int grow(lmh_cache *c, int32_t l, layer_kv *kv, int32_t cap) {
    const lmh_layer_state *st = &c->layers[l];
    if ((uint64_t)cap * (uint64_t)st->n_kv_heads *
            (uint64_t)(c->ks[l].words > c->vs[l].words ? c->ks[l].words : c->vs[l].words) >
        UINT32_MAX - WG)
        return LMH_ENOMEM; /* word offsets are 32-bit */
    int64_t kne[3] = {st->n_kv_heads, cap, c->ks[l].words};
    int64_t vne[3] = {st->n_kv_heads, cap, c->vs[l].words};
    lmh_tensor *k = c->be->tensor_new(c->b, LMH_I32, 3, kne, 0);
    lmh_tensor *v = c->be->tensor_new(c->b, LMH_I32, 3, vne, 0);
    if (!k || !v) {
        if (k) c->be->tensor_free(c->b, k);
        if (v) c->be->tensor_free(c->b, v);
        return LMH_ENOMEM;
    }
    int rc = LMH_OK;
    if (kv->k) {
        rc = kv_keep(c, move_rows, st, kv, k, v, cap);
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

/* Quantizes the n rows of x (f32 [n, heads, hd]) into store slots first.. (a ring of
 * `ring` slots, or in order where 0). */
static int quantize(lmh_cache *c, const side *sd, lmh_tensor *x, lmh_tensor *store, int32_t first,
                    int32_t ring) {
    uint64_t items = (uint64_t)x->ne[0] * (uint64_t)x->ne[1] * (uint64_t)(sd->hd / sd->group);
    float rnb = 1.0f / (float)((1u << c->bits) - 1u);
    uint32_t p[9] = {
        (uint32_t)x->ne[1],    (uint32_t)sd->hd, (uint32_t)c->bits, (uint32_t)sd->group,
        (uint32_t)sd->words,   (uint32_t)first,  (uint32_t)ring,    0,
        (uint32_t)store->ne[1]};
    memcpy(&p[7], &rnb, 4);
    return run(c, K_QUANTIZE, x, store, items, 1, p, 9);
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
    int32_t cap = kv_capacity_for(st, kv, n, c->max_len);
    int rc = cap ? grow(c, l, kv, cap) : LMH_OK;
    /* the rows go to their slots (a ring's wrap is the kernel's) */
    int32_t first = kv_slot(st, kv, kv->pos), ring = st->window > 0 ? kv->cap : 0;
    if (rc == LMH_OK) rc = quantize(c, &c->ks[l], k, kv->k, first, ring);
    if (rc == LMH_OK) rc = quantize(c, &c->vs[l], v, kv->v, first, ring);
    if (rc == LMH_OK) kv->pos += n;
    return rc;
}

/* A view of the shared f32 buffer *buf ([rows, heads, hd]), grown to hold it. */
static lmh_tensor *f32_room(lmh_cache *c, lmh_tensor **buf, size_t *have, int64_t rows,
                            int64_t heads, int64_t hd) {
    return kv_f32_room(c->be, c->b, buf, have, rows, heads, hd);
}

/* Rows slots first.. of a store (a ring of `ring` slots, or in order where 0) into f32
 * dst [rows, heads, hd]. */
static int dequantize(lmh_cache *c, const side *sd, lmh_tensor *store, lmh_tensor *dst,
                      int32_t rows, int32_t first, int32_t ring) {
    uint64_t items = (uint64_t)rows * (uint64_t)store->ne[0] * (uint64_t)sd->hd;
    uint32_t p[8] = {(uint32_t)store->ne[0], (uint32_t)sd->hd,    (uint32_t)c->bits,
                     (uint32_t)sd->group,    (uint32_t)sd->words, (uint32_t)store->ne[1],
                     (uint32_t)first,        (uint32_t)ring};
    return run(c, K_DEQUANTIZE, store, dst, items, WG, p, 8);
}

/* Rows a workgroup of attend for n rows over kvh heads and G queries a head: about 256
 * workgroups in all (an H100 at 8K rows: 3.54 ms a token with 256, 3.87 with 512, 4.22
 * with 1024, each workgroup's fixed part counting), in whole blocks, the scores within
 * the shader's room; 0 where there would be more chunks than attend_merge takes. */
static uint32_t attend_chunk_rows(uint32_t n, uint32_t kvh, uint32_t G) {
    uint32_t most = ATT_SCORES / G / ATT_SLOTS * ATT_SLOTS;
    uint64_t want = ((uint64_t)n * kvh + 255) / 256;
    uint32_t chunk = (uint32_t)((want + ATT_SLOTS - 1) / ATT_SLOTS * ATT_SLOTS);
    if (chunk > most) chunk = most;
    return (n + chunk - 1) / chunk <= ATT_MAXCH ? chunk : 0;
}

/* The build of attend for layer l with G queries a K/V head, or -1 where none fits: keys
 * and values of one size d (64, 128 or 256), a lane's slice of d / 8 within one scale
 * group, and the queries' slices within ATT_SLICE_MAX. */
static int attend_fits(const lmh_cache *c, int32_t l, int64_t G) {
    const lmh_layer_state *st = &c->layers[l];
    int32_t d = st->head_dim_k, ld = d / ATT_LANES;
    if (d != st->head_dim_v || (d != 64 && d != 128 && d != 256)) return -1;
    if (c->ks[l].group % ld || c->vs[l].group % ld || G < 1 || G * ld > ATT_SLICE_MAX) return -1;
    return K_ATTEND + (c->bits == 8 ? 0 : 3) + (ld == 8 ? 0 : ld == 16 ? 1 : 2);
}

/* Whether attend's build kern runs here, made ready on first use. A backend may refuse one
 * (a device with less shared memory than it takes): decode then reads the f32 copy, as
 * other shapes do, and the refusal is logged once. */
static int attend_ready(lmh_cache *c, int kern) {
    if (c->kern[kern]) return 1;
    if (c->refused[kern]) return 0;
    char err[256] = "";
    int rc = c->be->kernel_add(c->b, &kernel_descs[kern], &c->kern[kern], err, sizeof err);
    if (rc == LMH_OK && c->kern[kern]) return 1;
    c->refused[kern] = 1;
    if (c->host && c->host->log)
        c->host->log(LMH_LOG_WARN, "cache quant: %s; decode reads a dequantized copy instead", err);
    return 0;
}

/* The layer's attention sinks (ABI 1.10): a host built earlier passes params without them. */
static lmh_tensor *attn_sinks(const lmh_cache *c, const lmh_attn_params *p) {
    return c->host && c->host->abi_minor >= 10 ? p->sinks : NULL;
}

/* One query row (decode): attention straight from the codes, a workgroup a K/V head and
 * chunk of rows, then the chunks merged; no f32 copy of the store. */
static int attend_codes(lmh_cache *c, int32_t l, int kern, uint32_t chunk, const layer_kv *kv,
                        lmh_tensor *q, lmh_tensor *q_pos, lmh_tensor *out,
                        const lmh_attn_params *p) {
    const lmh_layer_state *st = &c->layers[l];
    uint32_t heads = (uint32_t)q->ne[1], nkv = (uint32_t)kv_rows_held(kv);
    uint32_t nch = (nkv + chunk - 1) / chunk, dv = (uint32_t)st->head_dim_v;
    lmh_tensor *part = f32_room(c, &c->part, &c->part_floats, heads, nch, dv + 2);
    if (!part) return LMH_ENOMEM;
    lmh_kernel_call call = {.n_tensors = 5, .t = {q, q_pos, kv->k, kv->v, part}, .writes = 1u << 4};
    uint32_t v[16] = {(uint32_t)st->n_kv_heads * nch,
                      heads,
                      (uint32_t)st->n_kv_heads,
                      (uint32_t)st->head_dim_k,
                      dv,
                      (uint32_t)c->bits,
                      (uint32_t)c->ks[l].group,
                      (uint32_t)c->vs[l].group,
                      nkv,
                      (uint32_t)kv->pos,
                      (uint32_t)kv->cap,
                      st->window > 0,
                      (uint32_t)p->window};
    memcpy(&v[13], &p->scale, 4);
    memcpy(&v[14], &p->softcap, 4);
    v[15] = chunk;
    memcpy(call.params, v, sizeof v);
    call.groups = v[0];
    int rc = c->be->kernel_run(c->b, c->kern[kern], &call);
    /* the merge, a head a workgroup, with the sinks where the layer has them */
    lmh_tensor *sinks = attn_sinks(c, p);
    lmh_kernel_call mc = {.n_tensors = sinks ? 3 : 2, .t = {part, out, sinks}, .writes = 2u};
    uint32_t m[4] = {heads, nch, dv, sinks != NULL};
    memcpy(mc.params, m, sizeof m);
    mc.groups = heads;
    if (rc == LMH_OK) rc = c->be->kernel_run(c->b, c->kern[K_ATTEND_MERGE], &mc);
    c->be->tensor_free(c->b, part);
    return rc;
}

static int attend(lmh_cache *c, uint64_t id, int32_t l, lmh_tensor *q, lmh_tensor *q_pos,
                  lmh_tensor *out, const lmh_attn_params *p) {
    seq *s = kv_find(&c->t, id);
    if (!s || l < 0 || l >= c->n_layers || !s->layers[l].k) return LMH_EINVAL;
    layer_kv *kv = &s->layers[l];
    int64_t heads = c->layers[l].n_kv_heads;
    int64_t group = heads ? q->ne[1] / heads : 0;
    int kern = -1;
    uint32_t chunk = 0;
    if (q->ndim == 3 && q->ne[0] == 1 && q->dtype == LMH_F32 && q_pos->dtype == LMH_I32 &&
        q->ne[1] == group * heads && q->ne[2] == c->layers[l].head_dim_k && !c->copy_only &&
        (kern = attend_fits(c, l, group)) >= 0 && attend_ready(c, kern) &&
        (chunk = attend_chunk_rows((uint32_t)kv_rows_held(kv), (uint32_t)heads, (uint32_t)group))) {
        int rc = attend_codes(c, l, kern, chunk, kv, q, q_pos, out, p);
        if (rc == LMH_OK) c->read += layer_bytes(c, l, kv_rows_seen(kv, 1, p->window));
        return rc;
    }
    lmh_tensor *fk = f32_room(c, &c->fk, &c->fk_floats, kv->cap, heads, c->ks[l].hd);
    lmh_tensor *fv = fk ? f32_room(c, &c->fv, &c->fv_floats, kv->cap, heads, c->vs[l].hd) : NULL;
    int rc = fk && fv ? LMH_OK : LMH_ENOMEM;
    if (rc == LMH_OK) rc = dequantize(c, &c->ks[l], kv->k, fk, kv_rows_held(kv), 0, 0);
    if (rc == LMH_OK) rc = dequantize(c, &c->vs[l], kv->v, fv, kv_rows_held(kv), 0, 0);
    if (rc == LMH_OK) {
        lmh_op op = {.code = LMH_OP_ATTENTION, .dst = out, .src = {q, fk, fv, q_pos}};
        op.p.i[0] = kv_rows_held(kv);
        op.p.i[2] = p->window;
        op.p.i[3] = c->layers[l].window > 0 ? kv->cap : 0;
        op.p.i[4] = kv->pos;
        op.p.f[0] = p->scale;
        op.p.f[1] = p->softcap;
        if ((op.src_more[0] = attn_sinks(c, p))) op.p.i[5] = LMH_ATTN_SINKS;
        rc = c->be->enqueue(c->b, &op);
    }
    if (fk) c->be->tensor_free(c->b, fk);
    if (fv) c->be->tensor_free(c->b, fv);
    if (rc == LMH_OK) c->read += layer_bytes(c, l, kv_rows_seen(kv, (int32_t)q->ne[0], p->window));
    return rc;
}

/* A position's bytes in layer l (also a snapshot's row): each K/V head's words. */
static uint64_t k_row(lmh_cache *c, int32_t l) {
    return (uint64_t)c->layers[l].n_kv_heads * (uint64_t)c->ks[l].words * 4;
}

static uint64_t v_row(lmh_cache *c, int32_t l) {
    return (uint64_t)c->layers[l].n_kv_heads * (uint64_t)c->vs[l].words * 4;
}

/* Whether t is f32 [n, heads, hd]: what read_rows writes. */
static int f32_rows(const lmh_tensor *t, int32_t n, int32_t heads, int32_t hd) {
    return t && t->dtype == LMH_F32 && t->ndim == 3 && t->ne[0] == n && t->ne[1] == heads &&
           t->ne[2] == hd;
}

/* The rows dequantized straight into k and v, as the f32 copy for attention is made. */
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
    int32_t slot = kv_slot(st, kv, first), ring = st->window > 0 ? kv->cap : 0;
    int rc = dequantize(c, &c->ks[l], kv->k, k, n, slot, ring);
    return rc == LMH_OK ? dequantize(c, &c->vs[l], kv->v, v, n, slot, ring) : rc;
}

static void row_bytes(lmh_cache *c, int32_t l, uint64_t *k, uint64_t *v) {
    int kv = l >= 0 && l < c->n_layers && c->layers[l].kind == LMH_STATE_KV;
    if (k) *k = kv ? k_row(c, l) : 0;
    if (v) *v = kv ? v_row(c, l) : 0;
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

/* ---- snapshots (seq_state.h): a row is each K/V head's words, head after head ---- */

/* Rows [slot, slot + n) of a store [heads, cap, words] to or from rows of all heads. */
static int store_rows(lmh_cache *c, lmh_tensor *t, int32_t slot, int32_t n, uint8_t *buf,
                      int save) {
    const int64_t heads = t->ne[0], cap = t->ne[1], words = t->ne[2];
    const size_t run = (size_t)n * (size_t)words * 4, row = (size_t)words * 4;
    uint8_t *tmp = malloc(run ? run : 1);
    if (!tmp) return LMH_ENOMEM;
    int rc = LMH_OK;
    for (int64_t h = 0; h < heads && rc == LMH_OK; h++) {
        size_t off = (size_t)(h * cap + slot) * row;
        if (!save)
            for (int32_t r = 0; r < n; r++)
                memcpy(tmp + (size_t)r * row, buf + ((size_t)r * (size_t)heads + (size_t)h) * row,
                       row);
        rc = save ? c->be->download(c->b, t, off, tmp, run) : c->be->upload(c->b, t, off, tmp, run);
        if (save && rc == LMH_OK)
            for (int32_t r = 0; r < n; r++)
                memcpy(buf + ((size_t)r * (size_t)heads + (size_t)h) * row, tmp + (size_t)r * row,
                       row);
    }
    free(tmp);
    return rc;
}

static int rows_io(lmh_cache *c, int32_t l, layer_kv *kv, int32_t slot, int32_t n, void *kb,
                   void *vb, int save) {
    (void)l;
    int rc = store_rows(c, kv->k, slot, n, kb, save);
    return rc == LMH_OK ? store_rows(c, kv->v, slot, n, vb, save) : rc;
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
    .kv_bits = kv_bits,
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
    .name = "quant",
    .version = "0.1.0",
    .summary = "keys and values as 8- or 4-bit codes, a scale and bias a group (MLX-style)",
    .init = NULL,
    .api = &api,
};

LMH_EXPORT const lmh_plugin_info *lmhost_plugin_entry(void) {
    return &info;
}
