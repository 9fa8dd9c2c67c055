/* Pure state space models: mamba (Mamba-1) and mamba2 (Mamba-2).
 *
 * x = embed(tokens); per layer: x += mixer(RMSNorm(x)); logits = lm_head(RMSNorm(x)),
 * the head tied to the embedding unless the checkpoint has its own. The mixers are
 * common/mixers.h's; every layer keeps recurrent state (a convolution window and the
 * scan's state), no keys and values, so a sequence costs the same memory at any length.
 * Checkpoints: the Hugging Face layout (backbone.layers.N.mixer.*), with the MLX layout's
 * quantized projections and [C, K, 1] convolution weights. */
#include "lmhost/lmhost.h"
#include "mixers.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct layer {
    lmh_tensor *norm;
    m1_layer m1;
    m2_layer m2;
} layer;

struct lmh_model {
    int v2; /* mamba2 */
    int32_t n_layers, hidden, vocab;
    float eps;
    m1_cfg c1;
    m2_cfg c2;
    lmh_tensor *embed, *norm, *lm_head;
    layer *layers;
};

static const char *const model_types[] = {"mamba", "mamba2", NULL};

static void unload(lmh_model *m) {
    if (!m) return;
    free(m->layers);
    free(m);
}

/* Mamba-1's time_step_rank: a number, or "auto" (ceil(hidden / 16)). */
static int dt_rank(const lmh_host_api *h, lmh_load_ctx *ld, int32_t hidden, int32_t *out) {
    const char *s = NULL;
    if (h->cfg_str(ld, "time_step_rank", &s) == LMH_OK) {
        if (strcmp(s, "auto") != 0)
            return h->fail(ld, "config.json: time_step_rank '%s' is neither a number nor auto", s);
        *out = (hidden + 15) / 16;
        return 0;
    }
    return mx_int(h, ld, "time_step_rank", (hidden + 15) / 16, out);
}

static int load(const lmh_host_api *h, lmh_load_ctx *ld, lmh_model **out) {
    if (h->abi_minor < 7 || h->size < offsetof(lmh_host_api, fwd_recurrent) + sizeof(void *))
        return h->fail(ld, "this host keeps no recurrent state (plugin ABI 1.7)");
    const char *type = NULL;
    h->cfg_str(ld, "model_type", &type);
    lmh_model *m = calloc(1, sizeof *m);
    if (!m) return h->fail(ld, "out of memory");
    *out = m;
    m->v2 = strcmp(type, "mamba2") == 0;
    double eps = 1e-5;
    if (mx_int(h, ld, "hidden_size", 0, &m->hidden) ||
        mx_int(h, ld, "num_hidden_layers", 0, &m->n_layers) ||
        mx_int(h, ld, "vocab_size", 0, &m->vocab))
        return LMH_EINVAL;
    if (h->cfg_float(ld, "layer_norm_epsilon", &eps) == LMH_ETYPE || !(eps > 0))
        return h->fail(ld, "config.json: layer_norm_epsilon must be a positive number");
    m->eps = (float)eps;
    const char *act = "silu";
    if (h->cfg_str(ld, "hidden_act", &act) == LMH_ETYPE || strcmp(act, "silu") != 0)
        return h->fail(ld, "config.json: hidden_act '%s' is not supported (Mamba uses silu)", act);
    const int conv_bias = mx_flag(h, ld, "use_conv_bias", 1), bias = mx_flag(h, ld, "use_bias", 0);
    int32_t expand = 2;
    if (m->v2) {
        m2_cfg *c = &m->c2;
        *c = (m2_cfg){.hidden = m->hidden,
                      .conv_bias = conv_bias,
                      .proj_bias = bias,
                      .eps = m->eps,
                      .norm = M2_NORM_GATED};
        if (mx_int(h, ld, "num_heads", 0, &c->heads) ||
            mx_int(h, ld, "head_dim", 64, &c->head_dim) ||
            mx_int(h, ld, "state_size", 128, &c->state) ||
            mx_int(h, ld, "n_groups", 1, &c->groups) || mx_int(h, ld, "conv_kernel", 4, &c->conv) ||
            mx_int(h, ld, "expand", 2, &expand) || m2_dt_limit(h, ld, "time_step_limit", c))
            return LMH_EINVAL;
        c->inner = expand * m->hidden;
        c->norm_group = c->inner; /* one norm over the whole row, as transformers' Mamba-2 */
        if (c->conv < 2 || c->conv > 64)
            return h->fail(ld, "config.json: conv_kernel %d is not supported (2 to 64)", c->conv);
    } else {
        m1_cfg *c = &m->c1;
        *c = (m1_cfg){.hidden = m->hidden, .conv_bias = conv_bias, .proj_bias = bias};
        if (mx_int(h, ld, "intermediate_size", 2 * (int64_t)m->hidden, &c->inner) ||
            mx_int(h, ld, "state_size", 16, &c->state) ||
            mx_int(h, ld, "conv_kernel", 4, &c->conv) || dt_rank(h, ld, m->hidden, &c->dt_rank))
            return LMH_EINVAL;
        if (c->conv < 2 || c->conv > 64)
            return h->fail(ld, "config.json: conv_kernel %d is not supported (2 to 64)", c->conv);
    }
    if (h->declare_model(ld, m->n_layers, m->vocab)) return LMH_EINVAL;
    m->layers = calloc((size_t)m->n_layers, sizeof *m->layers);
    if (!m->layers) return h->fail(ld, "out of memory");
    const int64_t H = m->hidden;
    for (int32_t l = 0; l < m->n_layers; l++) {
        layer *L = &m->layers[l];
        char pre[96];
        snprintf(pre, sizeof pre, "backbone.layers.%d.", l);
        L->norm = mx_w(h, ld, l, pre, "norm.weight", H, 0);
        snprintf(pre, sizeof pre, "backbone.layers.%d.mixer.", l);
        int rc =
            m->v2 ? m2_load(h, ld, l, pre, &m->c2, &L->m2) : m1_load(h, ld, l, pre, &m->c1, &L->m1);
        if (rc || !L->norm) return LMH_EINVAL;
    }
    int64_t ene[2] = {m->vocab, H};
    m->embed = h->weight(ld, LMH_LAYER_INPUT, "backbone.embeddings.weight", 2, ene);
    m->norm = h->weight(ld, LMH_LAYER_OUTPUT, "backbone.norm_f.weight", 1, &H);
    if (!m->embed || !m->norm) return LMH_EINVAL;
    lmh_weight_info wi;
    int tie = mx_flag(h, ld, "tie_word_embeddings", 1);
    if (!tie || h->weight_info(ld, "lm_head.weight", &wi) == LMH_OK) {
        if (h->weight_info(ld, "lm_head.weight", &wi) != LMH_OK)
            return h->fail(ld, "missing tensor lm_head.weight (tie_word_embeddings is false)");
        m->lm_head = h->weight(ld, LMH_LAYER_OUTPUT, "lm_head.weight", 2, ene);
    } else {
        m->lm_head = m->embed;
    }
    return m->lm_head ? LMH_OK : LMH_EINVAL;
}

static int forward(lmh_model *m, const lmh_host_api *h, lmh_fwd *f, const lmh_batch *bt) {
    const int64_t n = bt->n_rows, H = m->hidden;
    lmh_build b = {.h = h, .f = f, .layer = LMH_LAYER_INPUT};
    lmh_tensor *x = lmh_b_get_rows(&b, NULL, m->embed, bt->tokens);
    lmh_tensor *hn = lmh_b_new2(&b, n, H), *o = lmh_b_new2(&b, n, H);
    m1_scratch s1 = {0};
    m2_scratch s2 = {0};
    if (m->v2)
        s2 = m2_scratch_new(&b, n, &m->c2);
    else
        s1 = m1_scratch_new(&b, n, &m->c1);
    for (int32_t l = 0; l < m->n_layers; l++) {
        const layer *L = &m->layers[l];
        b.layer = l;
        lmh_b_rms_norm(&b, hn, x, L->norm, m->eps, 0);
        if (!(m->v2 ? m2_forward(&b, &m->c2, &L->m2, &s2, hn, NULL, o)
                    : m1_forward(&b, &m->c1, &L->m1, &s1, hn, o)))
            return LMH_EINVAL;
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
    .name = "mamba",
    .version = "0.1.0",
    .summary = "state space models: mamba (selective scan) and mamba2 (SSD), no attention",
    .init = NULL,
    .api = &api,
};

LMH_EXPORT const lmh_plugin_info *lmhost_plugin_entry(void) {
    return &info;
}
