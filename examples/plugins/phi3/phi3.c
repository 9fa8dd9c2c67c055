/* Phi-3 (config.json model_type "phi3"): an example family of the plugin development kit,
 * written against the public ABI alone (abi/lmhost/), as an outside author would.
 *
 * The block is Llama's: x += o(attn(rope(q), rope(k), v)) after RMSNorm, x += down(mlp)
 * after RMSNorm, logits = lm_head(norm(x)), a sliding window on every layer where
 * sliding_window is set. What differs:
 *   - fused projections: self_attn.qkv_proj [(H + 2 KV) * D, hidden] holds q, k and v one
 *     after the other (one product, then LMH_OP_COLS takes each part), and
 *     mlp.gate_up_proj [2 I, hidden] holds the gate, then up, which SWIGLU's fused form
 *     takes as is. An MLX-quantized checkpoint quantizes each fused matrix as one tensor,
 *     which the same product reads.
 *   - partial_rotary_factor (rope_parameters, else the top level): the first
 *     int(head_dim * factor) dims of each head rotate.
 *   - LongRoPE (rope_type "longrope"; "su" in older configs): two tables of per-pair
 *     divisors, short_factor and long_factor (rotary_dims / 2 each, under rope_parameters or
 *     the legacy rope_scaling), inv_freq[i] = 1 / (factor[i] * theta^(2i / rotary_dims)),
 *     and a cos/sin factor (attention_factor) for both: the config's, else
 *     sqrt(1 + ln(s) / ln(original_max_position_embeddings)) where s = factor, or
 *     max_position_embeddings / original_max_position_embeddings without one (1 when
 *     s <= 1), as transformers computes it.
 *
 * Which table a row takes: transformers chooses per forward call, long when the largest
 * position in it is past original_max_position_embeddings (max(position_ids) + 1 > that),
 * so a prompt longer than that is rotated with the long factors from its first token, and
 * decode steps past it too. Here the choice is per row, by its sequence's length at the end
 * of the pass (lmh_batch.seq_ends, ABI 1.10: the prompt's end while a prompt is fed in
 * chunks), through LMH_OP_ROPE_SWITCH: a sequence's logits then depend on nothing else in
 * the batch, and a whole prompt, a chunked one and its decode steps get what one forward
 * call each gets in transformers. Keys already cached keep the table they were rotated
 * with. (transformers' generate() goes further once, when a sequence grows past the limit
 * during decode: it drops its cache and computes the whole sequence again with the long
 * factors. This plugin does not: the keys before the crossing stay short-rotated.) */
#include "lmhost/lmhost.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct layer {
    lmh_tensor *ln1, *ln2, *wqkv, *wo, *wgu, *wd;
} layer;

struct lmh_model {
    int32_t n_layers, hidden, heads, kv_heads, head_dim, inter, vocab;
    int32_t rot;    /* rotated dims of each head */
    int32_t window; /* sliding window, 0: none */
    float eps;
    lmh_tensor *embed, *norm, *lm_head;
    /* rope: one table (inv_long NULL), or LongRoPE's two and the length past which a row
     * takes the long one */
    lmh_tensor *inv_short, *inv_long;
    float af_short, af_long;
    int32_t threshold;
    layer *layers;
};

static const char *const model_types[] = {"phi3", NULL};

static void unload(lmh_model *m) {
    if (!m) return;
    free(m->layers); /* tensors belong to the host */
    free(m);
}

/* An integer setting that must be positive; `def` > 0 is used when absent. */
static int pos_int(const lmh_host_api *h, lmh_load_ctx *ld, const char *key, int64_t def,
                   int32_t *out) {
    int64_t v = def;
    int rc = h->cfg_int(ld, key, &v);
    if (rc == LMH_ETYPE) return h->fail(ld, "config.json: %s must be an integer", key);
    if (rc == LMH_ENOTFOUND && def <= 0) return h->fail(ld, "config.json: %s is missing", key);
    if (v <= 0 || v > (1 << 30))
        return h->fail(ld, "config.json: %s must be positive (got %lld)", key, (long long)v);
    *out = (int32_t)v;
    return 0;
}

/* A number from the rope settings (rope_parameters or rope_scaling), else the top level of
 * config.json; LMH_ENOTFOUND when neither has it, LMH_ETYPE when one is not a number. */
static int rope_num(const lmh_host_api *h, lmh_load_ctx *ld, const char *key, double *out) {
    int rc = h->rope_setting(ld, NULL, key, out);
    if (rc != LMH_ENOTFOUND) return rc;
    return h->cfg_float(ld, key, out);
}

/* LongRoPE's per-pair divisors `name` (short_factor, long_factor): n positive numbers
 * under rope_parameters, else under the legacy rope_scaling. */
static int factors(const lmh_host_api *h, lmh_load_ctx *ld, const char *name, int32_t n,
                   double *out) {
    static const char *const where[] = {"rope_parameters", "rope_scaling"};
    for (int w = 0; w < 2; w++) {
        char key[96];
        snprintf(key, sizeof key, "%s.%s", where[w], name);
        int64_t len = 0;
        int rc = h->cfg_len(ld, key, &len);
        if (rc == LMH_ENOTFOUND) continue;
        if (rc != LMH_OK) return h->fail(ld, "config.json: %s must be an array of numbers", key);
        if (len != n)
            return h->fail(ld,
                           "config.json: %s has %lld values; longrope needs one per rotated "
                           "pair (%d)",
                           key, (long long)len, n);
        for (int32_t i = 0; i < n; i++) {
            char ik[128];
            snprintf(ik, sizeof ik, "%s.%d", key, i);
            if (h->cfg_float(ld, ik, &out[i]) != LMH_OK || !(out[i] > 0) || !isfinite(out[i]))
                return h->fail(ld, "config.json: %s[%d] must be a positive number", key, i);
        }
        return 0;
    }
    return h->fail(ld, "config.json: longrope needs rope_parameters.%s (or rope_scaling.%s)", name,
                   name);
}

/* LongRoPE's two tables, attention factor and switch length (see the top of the file). */
static int longrope(const lmh_host_api *h, lmh_load_ctx *ld, lmh_model *m) {
    if (h->abi_minor < 10)
        return h->fail(ld, "longrope needs a host of plugin ABI 1.10 or later (this one is 1.%u)",
                       h->abi_minor);
    const int32_t half = m->rot / 2;
    double theta = 0, orig = 0, maxpos = 0, factor = 0, attn = 0;
    if (h->rope_setting(ld, NULL, "rope_theta", &theta) != LMH_OK || !(theta > 0) ||
        !isfinite(theta))
        return h->fail(ld, "config.json: rope_theta must be a positive number");
    int rc = rope_num(h, ld, "original_max_position_embeddings", &orig);
    int mrc = h->cfg_float(ld, "max_position_embeddings", &maxpos);
    if (rc == LMH_ETYPE || mrc == LMH_ETYPE)
        return h->fail(ld, "config.json: (original_)max_position_embeddings must be a number");
    if (rc == LMH_ENOTFOUND) orig = maxpos; /* transformers' fallback */
    if (!(orig >= 2) || orig > INT32_MAX || orig != floor(orig))
        return h->fail(ld, "config.json: longrope needs original_max_position_embeddings, an "
                           "integer of 2 or more");
    rc = h->rope_setting(ld, NULL, "factor", &factor);
    if (rc == LMH_ETYPE) return h->fail(ld, "config.json: rope factor must be a number");
    if (rc == LMH_ENOTFOUND) factor = maxpos > 0 ? maxpos / orig : 1.0;
    rc = h->rope_setting(ld, NULL, "attention_factor", &attn);
    if (rc == LMH_ETYPE) return h->fail(ld, "config.json: attention_factor must be a number");
    if (rc == LMH_ENOTFOUND) attn = factor <= 1.0 ? 1.0 : sqrt(1.0 + log(factor) / log(orig));
    if (!(attn > 0) || !isfinite(attn))
        return h->fail(ld, "config.json: longrope's attention factor must be positive (got %g)",
                       attn);

    double *fs = malloc(2 * (size_t)half * sizeof *fs);
    float *inv = malloc(2 * (size_t)half * sizeof *inv);
    if (!fs || !inv) {
        free(fs);
        free(inv);
        return h->fail(ld, "out of memory");
    }
    rc = factors(h, ld, "short_factor", half, fs) || factors(h, ld, "long_factor", half, fs + half);
    for (int32_t t = 0; !rc && t < 2; t++)
        for (int32_t i = 0; i < half; i++)
            inv[t * half + i] =
                (float)(1.0 / (fs[t * half + i] * pow(theta, (double)(2 * i) / (double)m->rot)));
    int64_t ne = half;
    if (!rc) {
        m->inv_short = h->constant(ld, LMH_LAYER_INPUT, LMH_F32, 1, &ne, inv);
        m->inv_long = h->constant(ld, LMH_LAYER_INPUT, LMH_F32, 1, &ne, inv + half);
    }
    free(fs);
    free(inv);
    if (rc || !m->inv_short || !m->inv_long) return LMH_EINVAL;
    m->af_short = m->af_long = (float)attn;
    m->threshold = (int32_t)orig;
    return 0;
}

static int load_rope(const lmh_host_api *h, lmh_load_ctx *ld, lmh_model *m) {
    double prf = 1.0;
    int rc = rope_num(h, ld, "partial_rotary_factor", &prf);
    if (rc == LMH_ETYPE || (rc == LMH_OK && !(prf > 0 && prf <= 1)))
        return h->fail(ld, "config.json: partial_rotary_factor must be a number in (0, 1]");
    m->rot = (int32_t)(m->head_dim * prf); /* truncated, as transformers' int() */
    if (m->rot < 2 || m->rot % 2 || m->rot > 1024)
        return h->fail(ld,
                       "config.json: a rotary width of %d (head_dim %d x partial_rotary_factor "
                       "%g) is not supported: it must be even, 2 to 1024",
                       m->rot, m->head_dim, prf);
    const char *rt = "default";
    h->rope_type(ld, NULL, &rt);
    if (!strcmp(rt, "longrope") || !strcmp(rt, "su")) return longrope(h, ld, m);
    /* other types (none, linear, yarn...) are the host's to compute: one table */
    float inv[512];
    lmh_rope_info ri = {.attn_factor = 1.0f, .n_pairs = m->rot / 2};
    if (h->rope_freqs(ld, NULL, m->rot, inv, &ri)) return LMH_EINVAL;
    int64_t ne = m->rot / 2;
    m->inv_short = h->constant(ld, LMH_LAYER_INPUT, LMH_F32, 1, &ne, inv);
    m->af_short = ri.attn_factor;
    return m->inv_short ? 0 : LMH_EINVAL;
}

static lmh_tensor *w(const lmh_host_api *h, lmh_load_ctx *ld, int32_t l, const char *fmt,
                     int64_t d0, int64_t d1) {
    char name[256];
    snprintf(name, sizeof name, fmt, l);
    int64_t ne[2] = {d0, d1};
    return h->weight(ld, l, name, d1 ? 2 : 1, ne);
}

static int load(const lmh_host_api *h, lmh_load_ctx *ld, lmh_model **out) {
    lmh_model *m = calloc(1, sizeof *m);
    if (!m) return h->fail(ld, "out of memory");
    *out = m;
    if (pos_int(h, ld, "hidden_size", 0, &m->hidden) ||
        pos_int(h, ld, "num_hidden_layers", 0, &m->n_layers) ||
        pos_int(h, ld, "num_attention_heads", 0, &m->heads) ||
        pos_int(h, ld, "num_key_value_heads", m->heads, &m->kv_heads) ||
        pos_int(h, ld, "head_dim", m->hidden / m->heads, &m->head_dim) ||
        pos_int(h, ld, "intermediate_size", 0, &m->inter) ||
        pos_int(h, ld, "vocab_size", 0, &m->vocab))
        return LMH_EINVAL;
    if (m->heads % m->kv_heads)
        return h->fail(ld,
                       "config.json: num_attention_heads %d is not a multiple of "
                       "num_key_value_heads %d",
                       m->heads, m->kv_heads);
    double eps = 1e-5;
    if (h->cfg_float(ld, "rms_norm_eps", &eps) == LMH_ETYPE || !(eps > 0))
        return h->fail(ld, "config.json: rms_norm_eps must be a positive number");
    m->eps = (float)eps;
    const char *act = "silu";
    if (h->cfg_str(ld, "hidden_act", &act) == LMH_ETYPE || strcmp(act, "silu") != 0)
        return h->fail(ld, "config.json: hidden_act '%s' is not supported (phi3 uses silu)", act);
    int64_t sw = 0;
    int rc = h->cfg_int(ld, "sliding_window", &sw);
    if (rc == LMH_ETYPE || sw < 0 || sw > (1 << 30))
        return h->fail(ld, "config.json: sliding_window must be a non-negative integer or null");
    m->window = (int32_t)sw;
    if (h->declare_model(ld, m->n_layers, m->vocab) || load_rope(h, ld, m)) return LMH_EINVAL;

    const int64_t H = m->hidden, qd = (int64_t)m->heads * m->head_dim,
                  kd = (int64_t)m->kv_heads * m->head_dim;
    m->layers = calloc((size_t)m->n_layers, sizeof *m->layers);
    if (!m->layers) return h->fail(ld, "out of memory");
    for (int32_t l = 0; l < m->n_layers; l++) {
        layer *L = &m->layers[l];
        lmh_layer_state st = {.kind = LMH_STATE_KV,
                              .n_kv_heads = m->kv_heads,
                              .head_dim_k = m->head_dim,
                              .head_dim_v = m->head_dim,
                              .window = m->window};
        if (h->declare_layer(ld, l, &st)) return LMH_EINVAL;
        L->ln1 = w(h, ld, l, "model.layers.%d.input_layernorm.weight", H, 0);
        L->ln2 = w(h, ld, l, "model.layers.%d.post_attention_layernorm.weight", H, 0);
        L->wqkv = w(h, ld, l, "model.layers.%d.self_attn.qkv_proj.weight", qd + 2 * kd, H);
        L->wo = w(h, ld, l, "model.layers.%d.self_attn.o_proj.weight", H, qd);
        L->wgu = w(h, ld, l, "model.layers.%d.mlp.gate_up_proj.weight", 2 * (int64_t)m->inter, H);
        L->wd = w(h, ld, l, "model.layers.%d.mlp.down_proj.weight", H, m->inter);
        if (!L->ln1 || !L->ln2 || !L->wqkv || !L->wo || !L->wgu || !L->wd)
            return LMH_EINVAL; /* the host has the message */
    }
    int64_t ene[2] = {m->vocab, H};
    m->embed = h->weight(ld, LMH_LAYER_INPUT, "model.embed_tokens.weight", 2, ene);
    m->norm = h->weight(ld, LMH_LAYER_OUTPUT, "model.norm.weight", 1, &H);
    if (!m->embed || !m->norm) return LMH_EINVAL;
    /* tied (phi3's default is untied) when the config says so or the head is missing */
    int tie = 0;
    lmh_weight_info wi;
    if (h->cfg_bool(ld, "tie_word_embeddings", &tie) == LMH_ETYPE)
        return h->fail(ld, "config.json: tie_word_embeddings must be true or false");
    if (!tie && h->weight_info(ld, "lm_head.weight", &wi) != LMH_OK)
        return h->fail(ld, "missing tensor lm_head.weight (tie_word_embeddings is false)");
    m->lm_head = tie ? m->embed : h->weight(ld, LMH_LAYER_OUTPUT, "lm_head.weight", 2, ene);
    return m->lm_head ? LMH_OK : LMH_EINVAL;
}

/* x's columns [from, from + dst's width) into dst: one part of the fused projection. */
static lmh_tensor *cols(lmh_build *b, lmh_tensor *dst, lmh_tensor *x, int64_t from) {
    if (!dst || !x) return NULL;
    lmh_op op = {.code = LMH_OP_COLS, .dst = dst, .src = {x}};
    op.p.i[0] = (int32_t)from;
    return b->h->fwd_op(b->f, b->layer, &op) == LMH_OK ? dst : NULL;
}

/* Rotary embedding in place on x [rows, heads, head_dim]: the switch between LongRoPE's
 * tables by each row's sequence length, or the one table. */
static lmh_tensor *rope(lmh_build *b, const lmh_model *m, const lmh_batch *bt, lmh_tensor *x) {
    if (!x) return NULL;
    if (!m->inv_long)
        return lmh_b_rope(b, x, bt->positions, m->inv_short, m->rot, LMH_ROPE_HALF, m->af_short);
    lmh_op op = {
        .code = LMH_OP_ROPE_SWITCH, .dst = x, .src = {x, bt->positions, m->inv_short, m->inv_long}};
    lmh_op_set_src(&op, 4, bt->seq_ends);
    op.p.i[0] = m->rot;
    op.p.i[1] = LMH_ROPE_HALF;
    op.p.i[2] = m->threshold;
    op.p.f[0] = m->af_short;
    op.p.f[1] = m->af_long;
    return bt->seq_ends && b->h->fwd_op(b->f, b->layer, &op) == LMH_OK ? x : NULL;
}

static int forward(lmh_model *m, const lmh_host_api *h, lmh_fwd *f, const lmh_batch *bt) {
    const int64_t n = bt->n_rows, H = m->hidden, hd = m->head_dim, I = m->inter;
    const int64_t qd = (int64_t)m->heads * hd, kd = (int64_t)m->kv_heads * hd;
    lmh_build b = {.h = h, .f = f, .layer = LMH_LAYER_INPUT};
    lmh_tensor *x = lmh_b_get_rows(&b, NULL, m->embed, bt->tokens);
    /* Scratch reused by every layer: ops run in order on one queue. */
    lmh_tensor *hn = lmh_b_new2(&b, n, H), *qkv = lmh_b_new2(&b, n, qd + 2 * kd),
               *q = lmh_b_new2(&b, n, qd), *k = lmh_b_new2(&b, n, kd), *v = lmh_b_new2(&b, n, kd),
               *att = lmh_b_new2(&b, n, qd), *o = lmh_b_new2(&b, n, H),
               *gu = lmh_b_new2(&b, n, 2 * I), *g = lmh_b_new2(&b, n, I);
    lmh_tensor *q3 = lmh_b_heads(&b, q, m->heads, hd), *k3 = lmh_b_heads(&b, k, m->kv_heads, hd),
               *v3 = lmh_b_heads(&b, v, m->kv_heads, hd),
               *att3 = lmh_b_heads(&b, att, m->heads, hd);
    lmh_attn_params ap = {.scale = 1.0f / sqrtf((float)hd), .softcap = 0, .window = m->window};
    for (int32_t l = 0; l < m->n_layers; l++) {
        const layer *L = &m->layers[l];
        b.layer = l;
        lmh_b_rms_norm(&b, hn, x, L->ln1, m->eps, 0);
        lmh_b_matmul(&b, qkv, hn, L->wqkv, NULL);
        cols(&b, q, qkv, 0);
        cols(&b, k, qkv, qd);
        cols(&b, v, qkv, qd + kd);
        rope(&b, m, bt, q3);
        if (!rope(&b, m, bt, k3) || h->fwd_attention(f, l, q3, k3, v3, att3, &ap) != LMH_OK)
            return LMH_EINVAL;
        lmh_b_matmul(&b, o, att, L->wo, NULL);
        lmh_b_op(&b, LMH_OP_ADD, x, x, o, NULL);
        lmh_b_rms_norm(&b, hn, x, L->ln2, m->eps, 0);
        lmh_b_matmul(&b, gu, hn, L->wgu, NULL);
        lmh_b_op(&b, LMH_OP_SWIGLU, g, gu, NULL, NULL); /* gate first, then up */
        lmh_b_matmul(&b, o, g, L->wd, NULL);
        if (!lmh_b_op(&b, LMH_OP_ADD, x, x, o, NULL)) return LMH_EINVAL;
    }
    b.layer = LMH_LAYER_OUTPUT;
    lmh_tensor *xo = lmh_b_get_rows(&b, NULL, x, bt->out_rows);
    lmh_tensor *hf = lmh_b_rms_norm(&b, NULL, xo, m->norm, m->eps, 0);
    return lmh_b_matmul(&b, bt->logits, hf, m->lm_head, NULL) ? LMH_OK : LMH_EINVAL;
}

static const lmh_arch_api api = {
    .size = sizeof(lmh_arch_api),
    .model_types = model_types,
    .load = load,
    .forward = forward,
    .unload = unload,
};

static const lmh_plugin_info info = {
    LMH_PLUGIN_HEADER,
    .kind = LMH_KIND_ARCH,
    .name = "phi3",
    .version = "0.1.0",
    .summary = "Phi-3: fused qkv and gate_up projections, partial rotary, LongRoPE (short and "
               "long factors switched per sequence)",
    .init = NULL,
    .api = &api,
};

LMH_EXPORT const lmh_plugin_info *lmhost_plugin_entry(void) {
    return &info;
}
