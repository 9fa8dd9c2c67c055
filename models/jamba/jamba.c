/* Jamba (AI21): a hybrid of Mamba-1 and attention layers, each followed by a dense or a
 * mixture-of-experts MLP.
 *
 * x = embed(tokens); per layer: x += mixer(RMSNorm(x)); x += ffn(RMSNorm(x));
 * logits = lm_head(RMSNorm(x)). How it differs from its neighbours:
 *   mixer  attention on layers i with i % attn_layer_period == attn_layer_offset (or as a
 *          layers_block_type list says), Mamba-1 elsewhere. The attention has no
 *          positional encoding at all (no rope: the Mamba layers carry the order); the
 *          Mamba-1 mixer is mamba's with RMSNorms on dt, B and C after x_proj
 *          (common/mixers.h, bcdt_norm).
 *   ffn    experts on layers i with i % expert_layer_period == expert_layer_offset (when
 *          num_experts > 1), a SwiGLU MLP elsewhere. The router takes the softmax over all
 *          experts and keeps the top k's probabilities as they are (no renormalisation).
 * Attention layers keep keys and values; Mamba layers a convolution window and the scan's
 * state. Checkpoints: Hugging Face per-expert tensors, transformers' fused
 * experts.gate_up_proj, or MLX's stacked switch_mlp (with quantized projections and
 * [C, K, 1] convolution weights). */
#include "lmhost/lmhost.h"
#include "mixers.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct layer {
    int attn; /* attention mixer, else Mamba-1 */
    lmh_tensor *ln1, *ln2;
    lmh_tensor *wq, *wk, *wv, *wo;
    m1_layer m1;
    lmh_tensor *wg, *wu, *wd;                /* dense MLP */
    lmh_tensor *router, *egu, *eg, *eu, *ed; /* experts [E, out, in]; egu: gate and up fused */
} layer;

struct lmh_model {
    int32_t n_layers, hidden, heads, kv_heads, head_dim, inter, vocab;
    int32_t n_experts, top_k;
    int n_attn, n_mamba, n_dense, n_moe, fused; /* what the forward pass needs scratch for */
    float eps;
    m1_cfg c1;
    lmh_tensor *embed, *norm, *lm_head;
    layer *layers;
};

static const char *const model_types[] = {"jamba", NULL};

static void unload(lmh_model *m) {
    if (!m) return;
    free(m->layers); /* tensors belong to the host */
    free(m);
}

/* mamba_dt_rank: a number, or "auto" (ceil(hidden / 16)). */
static int dt_rank(const lmh_host_api *h, lmh_load_ctx *ld, int32_t hidden, int32_t *out) {
    const char *s = NULL;
    if (h->cfg_str(ld, "mamba_dt_rank", &s) == LMH_OK) {
        if (strcmp(s, "auto") != 0)
            return h->fail(ld, "config.json: mamba_dt_rank '%s' is neither a number nor auto", s);
        *out = (hidden + 15) / 16;
        return 0;
    }
    return mx_int(h, ld, "mamba_dt_rank", (hidden + 15) / 16, out);
}

/* A layer pattern's period (> 0) and offset (0 <= offset < period). */
static int period(const lmh_host_api *h, lmh_load_ctx *ld, const char *pkey, int64_t pdef,
                  const char *okey, int64_t odef, int32_t *p, int32_t *o) {
    int64_t pv = pdef, ov = odef;
    if (h->cfg_int(ld, pkey, &pv) == LMH_ETYPE)
        return h->fail(ld, "config.json: %s must be an integer", pkey);
    if (h->cfg_int(ld, okey, &ov) == LMH_ETYPE)
        return h->fail(ld, "config.json: %s must be an integer", okey);
    if (pv <= 0 || pv > (1 << 30))
        return h->fail(ld, "config.json: %s must be positive (got %lld)", pkey, (long long)pv);
    if (ov < 0 || ov >= pv)
        return h->fail(ld, "config.json: %s %lld must be at least 0 and below %s %lld", okey,
                       (long long)ov, pkey, (long long)pv);
    *p = (int32_t)pv;
    *o = (int32_t)ov;
    return 0;
}

/* Which layers attend: a layers_block_type list where the checkpoint has one (MLX
 * conversions, some configs), else every attn_layer_period-th from attn_layer_offset. */
static int layer_kinds(const lmh_host_api *h, lmh_load_ctx *ld, lmh_model *m) {
    /* checked even where a list overrides them, as transformers' config does */
    int32_t p, o;
    if (period(h, ld, "attn_layer_period", 8, "attn_layer_offset", 4, &p, &o)) return LMH_EINVAL;
    int64_t len = 0;
    int rc = h->cfg_len(ld, "layers_block_type", &len);
    if (rc == LMH_ETYPE) return h->fail(ld, "config.json: layers_block_type must be a list");
    if (rc == LMH_OK) {
        if (len != m->n_layers)
            return h->fail(ld, "config.json: layers_block_type has %lld entries for %d layers",
                           (long long)len, m->n_layers);
        for (int32_t l = 0; l < m->n_layers; l++) {
            char key[64];
            const char *t = NULL;
            snprintf(key, sizeof key, "layers_block_type.%d", l);
            if (h->cfg_str(ld, key, &t) != LMH_OK)
                return h->fail(ld, "config.json: layers_block_type[%d] must be a string", l);
            if (strcmp(t, "attention") == 0 || strcmp(t, "full_attention") == 0)
                m->layers[l].attn = 1;
            else if (strcmp(t, "mamba") != 0 && strcmp(t, "linear_attention") != 0)
                return h->fail(ld,
                               "config.json: layers_block_type[%d] is '%s'; Jamba has only "
                               "attention and mamba layers",
                               l, t);
        }
        return 0;
    }
    for (int32_t l = 0; l < m->n_layers; l++) m->layers[l].attn = l % p == o;
    return 0;
}

static lmh_tensor *w(const lmh_host_api *h, lmh_load_ctx *ld, int32_t l, const char *what,
                     int64_t d0, int64_t d1) {
    char name[256];
    snprintf(name, sizeof name, "model.layers.%d.%s", l, what);
    int64_t ne[2] = {d0, d1};
    return h->weight(ld, l, name, d1 ? 2 : 1, ne);
}

static int has(const lmh_host_api *h, lmh_load_ctx *ld, int32_t l, const char *what) {
    char name[256];
    lmh_weight_info wi;
    snprintf(name, sizeof name, "model.layers.%d.%s", l, what);
    return h->weight_info(ld, name, &wi) == LMH_OK;
}

/* Stacked experts [E, d0, d1] under one name (MLX switch_mlp, transformers' fused form). */
static lmh_tensor *stacked(const lmh_host_api *h, lmh_load_ctx *ld, const lmh_model *m, int32_t l,
                           const char *what, int64_t d0, int64_t d1) {
    char name[256];
    snprintf(name, sizeof name, "model.layers.%d.%s", l, what);
    int64_t ne[3] = {m->n_experts, d0, d1};
    return h->weight(ld, l, name, 3, ne);
}

/* Per-expert tensors feed_forward.experts.<e>.<proj>.weight stacked into [E, d0, d1]. */
static lmh_tensor *each(const lmh_host_api *h, lmh_load_ctx *ld, const lmh_model *m, int32_t l,
                        const char *proj, int64_t d0, int64_t d1) {
    char fmt[256];
    snprintf(fmt, sizeof fmt, "model.layers.%d.feed_forward.experts.%%d.%s.weight", l, proj);
    int64_t ne[2] = {d0, d1};
    return h->weight_stack(ld, l, fmt, m->n_experts, 2, ne);
}

static int load_ffn(const lmh_host_api *h, lmh_load_ctx *ld, lmh_model *m, int32_t l, int moe) {
    layer *L = &m->layers[l];
    const int64_t H = m->hidden, I = m->inter, E = m->n_experts;
    if (!moe) {
        m->n_dense++;
        L->wg = w(h, ld, l, "feed_forward.gate_proj.weight", I, H);
        L->wu = w(h, ld, l, "feed_forward.up_proj.weight", I, H);
        L->wd = w(h, ld, l, "feed_forward.down_proj.weight", H, I);
        return L->wg && L->wu && L->wd ? 0 : LMH_EINVAL;
    }
    m->n_moe++;
    L->router = w(h, ld, l, "feed_forward.router.weight", E, H);
    if (has(h, ld, l, "feed_forward.switch_mlp.gate_proj.weight")) {
        L->eg = stacked(h, ld, m, l, "feed_forward.switch_mlp.gate_proj.weight", I, H);
        L->eu = stacked(h, ld, m, l, "feed_forward.switch_mlp.up_proj.weight", I, H);
        L->ed = stacked(h, ld, m, l, "feed_forward.switch_mlp.down_proj.weight", H, I);
    } else if (has(h, ld, l, "feed_forward.experts.gate_up_proj")) {
        m->fused = 1;
        L->egu = stacked(h, ld, m, l, "feed_forward.experts.gate_up_proj", 2 * I, H);
        L->ed = stacked(h, ld, m, l, "feed_forward.experts.down_proj", H, I);
    } else {
        L->eg = each(h, ld, m, l, "gate_proj", I, H);
        L->eu = each(h, ld, m, l, "up_proj", I, H);
        L->ed = each(h, ld, m, l, "down_proj", H, I);
    }
    return L->router && L->ed && (L->egu || (L->eg && L->eu)) ? 0 : LMH_EINVAL;
}

static int load(const lmh_host_api *h, lmh_load_ctx *ld, lmh_model **out) {
    if (h->abi_minor < 7 || h->size < offsetof(lmh_host_api, fwd_recurrent) + sizeof(void *))
        return h->fail(ld, "this host keeps no recurrent state (plugin ABI 1.7)");
    lmh_model *m = calloc(1, sizeof *m);
    if (!m) return h->fail(ld, "out of memory");
    *out = m;
    /* defaults are transformers' JambaConfig's */
    if (mx_int(h, ld, "hidden_size", 0, &m->hidden) ||
        mx_int(h, ld, "num_hidden_layers", 0, &m->n_layers) ||
        mx_int(h, ld, "num_attention_heads", 0, &m->heads) ||
        mx_int(h, ld, "num_key_value_heads", m->heads, &m->kv_heads) ||
        mx_int(h, ld, "head_dim", m->hidden / m->heads, &m->head_dim) ||
        mx_int(h, ld, "intermediate_size", 0, &m->inter) ||
        mx_int(h, ld, "vocab_size", 0, &m->vocab))
        return LMH_EINVAL;
    if (m->heads % m->kv_heads)
        return h->fail(ld,
                       "config.json: num_attention_heads %d is not a multiple of "
                       "num_key_value_heads %d",
                       m->heads, m->kv_heads);
    double eps = 1e-6;
    if (h->cfg_float(ld, "rms_norm_eps", &eps) == LMH_ETYPE || !(eps > 0))
        return h->fail(ld, "config.json: rms_norm_eps must be a positive number");
    m->eps = (float)eps;
    /* one activation for the convolution, the gate and the MLPs */
    const char *act = "silu";
    if (h->cfg_str(ld, "hidden_act", &act) == LMH_ETYPE || strcmp(act, "silu") != 0)
        return h->fail(ld, "config.json: hidden_act '%s' is not supported (Jamba uses silu)", act);
    /* num_local_experts is transformers' alias of num_experts */
    int64_t unused;
    const char *ek = h->cfg_int(ld, "num_experts", &unused) == LMH_ENOTFOUND &&
                             h->cfg_int(ld, "num_local_experts", &unused) != LMH_ENOTFOUND
                         ? "num_local_experts"
                         : "num_experts";
    if (mx_int(h, ld, ek, 16, &m->n_experts) || mx_int(h, ld, "num_experts_per_tok", 2, &m->top_k))
        return LMH_EINVAL;
    if (m->top_k > m->n_experts)
        return h->fail(ld, "config.json: num_experts_per_tok %d exceeds the %d experts", m->top_k,
                       m->n_experts);
    int32_t ep, eo;
    if (period(h, ld, "expert_layer_period", 2, "expert_layer_offset", 1, &ep, &eo))
        return LMH_EINVAL;

    int32_t expand = 2;
    m1_cfg *c = &m->c1;
    *c = (m1_cfg){.hidden = m->hidden,
                  .conv_bias = mx_flag(h, ld, "mamba_conv_bias", 1),
                  .proj_bias = mx_flag(h, ld, "mamba_proj_bias", 0),
                  .bcdt_norm = 1,
                  .eps = m->eps};
    if (mx_int(h, ld, "mamba_d_state", 16, &c->state) ||
        mx_int(h, ld, "mamba_d_conv", 4, &c->conv) || mx_int(h, ld, "mamba_expand", 2, &expand) ||
        dt_rank(h, ld, m->hidden, &c->dt_rank))
        return LMH_EINVAL;
    c->inner = expand * m->hidden;
    if (c->conv < 2 || c->conv > 64)
        return h->fail(ld, "config.json: mamba_d_conv %d is not supported (2 to 64)", c->conv);

    if (h->declare_model(ld, m->n_layers, m->vocab)) return LMH_EINVAL;
    /* (ABI 1.11) experts the host may stream from disk; the router takes lmh_batch.moe_top_k */
    if (m->n_experts > 1 && h->abi_minor >= 11 && h->declare_moe(ld, m->n_experts, m->top_k))
        return LMH_EINVAL;
    m->layers = calloc((size_t)m->n_layers, sizeof *m->layers);
    if (!m->layers) return h->fail(ld, "out of memory");
    if (layer_kinds(h, ld, m)) return LMH_EINVAL;

    const int64_t H = m->hidden, qd = (int64_t)m->heads * m->head_dim,
                  kd = (int64_t)m->kv_heads * m->head_dim;
    for (int32_t l = 0; l < m->n_layers; l++) {
        layer *L = &m->layers[l];
        L->ln1 = w(h, ld, l, "input_layernorm.weight", H, 0);
        L->ln2 = w(h, ld, l, "pre_ff_layernorm.weight", H, 0);
        if (!L->ln1 || !L->ln2) return LMH_EINVAL;
        if (L->attn) {
            m->n_attn++;
            lmh_layer_state st = {.kind = LMH_STATE_KV,
                                  .n_kv_heads = m->kv_heads,
                                  .head_dim_k = m->head_dim,
                                  .head_dim_v = m->head_dim};
            if (h->declare_layer(ld, l, &st)) return LMH_EINVAL;
            L->wq = w(h, ld, l, "self_attn.q_proj.weight", qd, H);
            L->wk = w(h, ld, l, "self_attn.k_proj.weight", kd, H);
            L->wv = w(h, ld, l, "self_attn.v_proj.weight", kd, H);
            L->wo = w(h, ld, l, "self_attn.o_proj.weight", H, qd);
            if (!L->wq || !L->wk || !L->wv || !L->wo) return LMH_EINVAL;
        } else {
            m->n_mamba++;
            char pre[96];
            snprintf(pre, sizeof pre, "model.layers.%d.mamba.", l);
            if (m1_load(h, ld, l, pre, c, &L->m1)) return LMH_EINVAL;
        }
        /* one expert is a dense MLP (transformers' layers_num_experts) */
        if (load_ffn(h, ld, m, l, m->n_experts > 1 && l % ep == eo)) return LMH_EINVAL;
    }

    int64_t ene[2] = {m->vocab, H};
    m->embed = h->weight(ld, LMH_LAYER_INPUT, "model.embed_tokens.weight", 2, ene);
    m->norm = h->weight(ld, LMH_LAYER_OUTPUT, "model.final_layernorm.weight", 1, &H);
    if (!m->embed || !m->norm) return LMH_EINVAL;
    lmh_weight_info wi;
    if (!mx_flag(h, ld, "tie_word_embeddings", 0)) {
        if (h->weight_info(ld, "lm_head.weight", &wi) != LMH_OK)
            return h->fail(ld, "missing tensor lm_head.weight (tie_word_embeddings is false)");
        m->lm_head = h->weight(ld, LMH_LAYER_OUTPUT, "lm_head.weight", 2, ene);
    } else {
        m->lm_head = m->embed; /* one table serves both ends */
    }
    return m->lm_head ? LMH_OK : LMH_EINVAL;
}

static int forward(lmh_model *m, const lmh_host_api *h, lmh_fwd *f, const lmh_batch *bt) {
    const int64_t n = bt->n_rows, H = m->hidden, hd = m->head_dim, I = m->inter;
    const int64_t qd = (int64_t)m->heads * hd, kd = (int64_t)m->kv_heads * hd;
    lmh_build b = {.h = h, .f = f, .layer = LMH_LAYER_INPUT};
    lmh_tensor *x = lmh_b_get_rows(&b, NULL, m->embed, bt->tokens);
    /* Scratch reused by every layer (ops run in order on one queue), made only for the
     * kinds of layer the model has. */
    lmh_tensor *hn = lmh_b_new2(&b, n, H), *o = lmh_b_new2(&b, n, H);
    lmh_tensor *q = NULL, *k = NULL, *v = NULL, *att = NULL;
    lmh_tensor *q3 = NULL, *k3 = NULL, *v3 = NULL, *att3 = NULL;
    if (m->n_attn) {
        q = lmh_b_new2(&b, n, qd);
        k = lmh_b_new2(&b, n, kd);
        v = lmh_b_new2(&b, n, kd);
        att = lmh_b_new2(&b, n, qd);
        q3 = lmh_b_heads(&b, q, m->heads, hd);
        k3 = lmh_b_heads(&b, k, m->kv_heads, hd);
        v3 = lmh_b_heads(&b, v, m->kv_heads, hd);
        att3 = lmh_b_heads(&b, att, m->heads, hd);
    }
    m1_scratch s1 = {0};
    if (m->n_mamba) s1 = m1_scratch_new(&b, n, &m->c1);
    lmh_tensor *g = NULL, *u = NULL;
    if (m->n_dense) {
        g = lmh_b_new2(&b, n, I);
        u = lmh_b_new2(&b, n, I);
    }
    lmh_tensor *rl = NULL, *rw = NULL, *ri = NULL, *eg = NULL, *eu = NULL, *ey = NULL;
    lmh_tensor *egu = NULL, *egu2 = NULL, *eg2 = NULL;
    if (m->n_moe) {
        const int64_t tk = m->top_k;
        int64_t ine[2] = {n, tk}, gne[3] = {n, tk, I}, yne[3] = {n, tk, H};
        rl = lmh_b_new2(&b, n, m->n_experts);
        rw = lmh_b_new(&b, 2, ine);
        ri = h->fwd_tensor(f, b.layer, LMH_I32, 2, ine);
        eg = lmh_b_new(&b, 3, gne);
        eu = lmh_b_new(&b, 3, gne);
        ey = lmh_b_new(&b, 3, yne);
        if (m->fused) { /* gate and up side by side, and flat views for the fused SwiGLU */
            int64_t une[3] = {n, tk, 2 * I}, f2[2] = {n * tk, 2 * I}, f1[2] = {n * tk, I};
            egu = lmh_b_new(&b, 3, une);
            egu2 = egu ? h->fwd_view(f, egu, 0, 2, f2) : NULL;
            eg2 = eg ? h->fwd_view(f, eg, 0, 2, f1) : NULL;
        }
    }
    const float scale = 1.0f / sqrtf((float)hd);
    for (int32_t l = 0; l < m->n_layers; l++) {
        const layer *L = &m->layers[l];
        b.layer = l;
        lmh_b_rms_norm(&b, hn, x, L->ln1, m->eps, 0);
        if (L->attn) {
            /* no rope: keys and values go to the cache as projected */
            lmh_b_matmul(&b, q, hn, L->wq, NULL);
            lmh_b_matmul(&b, k, hn, L->wk, NULL);
            lmh_b_matmul(&b, v, hn, L->wv, NULL);
            lmh_attn_params ap = {.scale = scale, .softcap = 0, .window = 0};
            if (!q3 || !k3 || !v3 || !att3 ||
                h->fwd_attention(f, l, q3, k3, v3, att3, &ap) != LMH_OK)
                return LMH_EINVAL;
            lmh_b_matmul(&b, o, att, L->wo, NULL);
        } else if (!m1_forward(&b, &m->c1, &L->m1, &s1, hn, o)) {
            return LMH_EINVAL;
        }
        lmh_b_op(&b, LMH_OP_ADD, x, x, o, NULL);
        lmh_b_rms_norm(&b, hn, x, L->ln2, m->eps, 0);
        if (L->router) {
            lmh_b_matmul_exact(&b, rl, hn, L->router, NULL);
            lmh_op route = {.code = LMH_OP_MOE_ROUTE, .dst = rw, .src = {rl, ri}};
            route.p.i[0] = m->top_k;
            route.p.i[1] = 0; /* Jamba keeps the top k's softmax probabilities */
            if (h->abi_minor >= 11) route.src[2] = bt->moe_top_k; /* fewer experts a row */
            if (!rl || !rw || !ri || h->fwd_op(f, l, &route) != LMH_OK) return LMH_EINVAL;
            if (L->egu) {
                lmh_b_op(&b, LMH_OP_MOE_MATMUL, egu, hn, L->egu, ri);
                lmh_b_op(&b, LMH_OP_SWIGLU, eg2, egu2, NULL, NULL);
            } else {
                lmh_b_op(&b, LMH_OP_MOE_MATMUL, eg, hn, L->eg, ri);
                lmh_b_op(&b, LMH_OP_MOE_MATMUL, eu, hn, L->eu, ri);
                lmh_b_op(&b, LMH_OP_SWIGLU, eg, eg, eu, NULL);
            }
            lmh_b_op(&b, LMH_OP_MOE_MATMUL, ey, eg, L->ed, ri);
            lmh_b_op(&b, LMH_OP_MOE_COMBINE, o, ey, rw, NULL);
        } else {
            lmh_b_matmul(&b, g, hn, L->wg, NULL);
            lmh_b_matmul(&b, u, hn, L->wu, NULL);
            lmh_b_op(&b, LMH_OP_SWIGLU, g, g, u, NULL);
            lmh_b_matmul(&b, o, g, L->wd, NULL);
        }
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
    .name = "jamba",
    .version = "0.1.0",
    .summary = "jamba: Mamba-1 layers (dt/B/C norms) and rope-free attention layers, with "
               "dense or top-k routed expert MLPs",
    .init = NULL,
    .api = &api,
};

LMH_EXPORT const lmh_plugin_info *lmhost_plugin_entry(void) {
    return &info;
}
