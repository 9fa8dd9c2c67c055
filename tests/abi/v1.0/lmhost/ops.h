/* lmhost plugin ABI: the ops an architecture plugin enqueues and a backend runs.
 *
 * Every op writes dst from src[] and the scalar parameters p. Shapes are given by the
 * tensors themselves (see lmh_tensor); "rows" are all dimensions but the innermost.
 * Activations are f32; weights may be any float dtype a backend claims, and the weight
 * operands of get_rows, matmul and moe_matmul may also be quantized (LMH_Q2..LMH_Q8, abi.h)
 * where the backend makes such tensors (tensor_quant). New ops get new
 * codes at the end (a minor version); a backend says which it runs via supports(). */
#ifndef LMHOST_OPS_H
#define LMHOST_OPS_H

#include "abi.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum lmh_op_code {
    /* dst f32 [n, d] = src0[src1[i], :]: embedding lookup. src0 [V, d] float dtype,
     * src1 i32 [n]. An id outside [0, V) is an error at enqueue or yields zeros. */
    LMH_OP_GET_ROWS = 1,
    /* dst f32 [rows, out] = src0 f32 [rows, in] x src1^T + src2. src1 is the weight
     * [out, in] in a float dtype; src2 an optional bias [out] (float dtype) or NULL. */
    LMH_OP_MATMUL = 2,
    /* dst = src0 / sqrt(mean(src0^2) + p.f[0]) * (src1 + p.f[1]) over the innermost
     * dimension. src1 (weight, innermost size, float dtype) may be NULL: no scaling.
     * p.f[1] is 0 for plain RMSNorm, 1 for the (1 + w) variant. */
    LMH_OP_RMS_NORM = 3,
    /* dst = src0 + src1; src1 has dst's shape, broadcasts over rows (innermost size), or
     * has one element (a scalar, e.g. a per-layer scale tensor). */
    LMH_OP_ADD = 4,
    /* dst = src0 * src1, same broadcast as ADD. */
    LMH_OP_MUL = 5,
    /* dst = src0 * p.f[0]. */
    LMH_OP_SCALE = 6,
    /* dst = silu(src0) * src1 (the SwiGLU gate). With src1 NULL, src0 is [rows, 2d] holding
     * gate and up side by side (a fused gate_up projection) and dst [rows, d] =
     * silu(src0[:, :d]) * src0[:, d:]. */
    LMH_OP_SWIGLU = 7,
    /* dst = gelu_tanh(src0) * src1 (the GeGLU gate); src1 NULL: the fused form as SWIGLU. */
    LMH_OP_GEGLU = 8,
    /* Rotary embedding. src0/dst f32 [n, heads, head_dim]; src1 i32 [n] positions;
     * src2 f32 [p.i[0]/2] inverse frequencies. p.i[0]: rotated dims (<= head_dim; the
     * rest pass through); p.i[1]: LMH_ROPE_HALF (pairs i, i+rot/2, Hugging Face
     * rotate_half) or LMH_ROPE_INTERLEAVED (pairs 2i, 2i+1); p.f[0]: cos/sin factor. */
    LMH_OP_ROPE = 9,
    /* dst = src0 converted to dst's dtype (f32, f16, bf16); equal element counts. */
    LMH_OP_COPY = 10,
    /* Scaled dot-product attention with grouped K/V heads.
     * src0 q f32 [n, heads, d]; src1 K [cap, kv_heads, d]; src2 V [cap, kv_heads, dv]
     * (K/V f32, f16 or bf16; heads a multiple of kv_heads); src3 i32 [n] the positions
     * of the q rows; dst f32 [n, heads, dv].
     * p.i[0] n_kv: key rows 0..n_kv-1 are valid. Where they sit:
     *   p.i[3] == 0: in order; key j is at position p.i[1] + j;
     *   p.i[3] == R > 0: a ring of R rows holding the last n_kv of p.i[4] positions;
     *     row j holds the largest position pk < p.i[4] with pk % R == j.
     * p.i[2] window: key at position pk is visible to a query at pq iff pk <= pq and
     * (window == 0 or pq - pk < window). p.f[0]: logit scale; p.f[1]: soft-cap c
     * (logits become c * tanh(logit / c)), 0 for none. */
    LMH_OP_ATTENTION = 11,
    /* dst = p.f[0] * tanh(src0 / p.f[0]): final-logit soft-capping. */
    LMH_OP_SOFTCAP = 12,
    /* Mixture-of-experts routing. src0 f32 [n, E] router logits; dst f32 [n, k] weights
     * and src1 i32 [n, k] (written) the chosen experts, best first. p.i[0] = k.
     * Probabilities are softmax(src0) over all experts; p.i[1] = 1 renormalises the
     * chosen k to sum to 1 (Mixtral, Qwen3-MoE), 0 keeps them (Qwen2-MoE). */
    LMH_OP_MOE_ROUTE = 13,
    /* Expert matmul: dst f32 [n, k, out], row (r, j) = x(r, j) W[src2[r, j]]^T where
     * src0 x is f32 [n, in] (the same input for every slot) or [n, k, in], src1 W is
     * the stacked experts [E, out, in] in a float dtype, src2 i32 [n, k] expert ids.
     * Rows are grouped by expert so each expert's weights are read once per op. */
    LMH_OP_MOE_MATMUL = 14,
    /* dst f32 [n, d] = sum_j src1[r, j] * src0[r, j, :]; src0 f32 [n, k, d], src1 f32
     * [n, k] (routing weights). */
    LMH_OP_MOE_COMBINE = 15,
    /* dst f32 [b, a, c] = src0 f32 [a, b, c] with the two outer dimensions swapped:
     * dst[j, i, :] = src0[i, j, :]. Turns [rows, parts, d] into [parts, rows, d] so that
     * each part's rows become one contiguous view. */
    LMH_OP_TRANSPOSE = 16,
    /* dst[r, :] = src0[r, :] * sigmoid(src1[r]): a gate of one value per row; src1 f32
     * with one element per row of src0 (a shared expert's gate). */
    LMH_OP_SIGMOID_GATE = 17,
    LMH_OP_COUNT
} lmh_op_code;

enum { LMH_ROPE_HALF = 0, LMH_ROPE_INTERLEAVED = 1 };

#define LMH_OP_MAX_SRC 4

typedef struct lmh_op {
    lmh_op_code code;
    lmh_tensor *dst;
    lmh_tensor *src[LMH_OP_MAX_SRC];
    struct {
        float f[8];
        int32_t i[8];
    } p; /* op parameters as documented above: floats in f[], integers in i[] */
} lmh_op;

static inline const char *lmh_op_name(lmh_op_code c) {
    static const char *const names[LMH_OP_COUNT] = {
        "?", "get_rows", "matmul", "rms_norm", "add", "mul", "scale",
        "swiglu", "geglu", "rope", "copy", "attention", "softcap", "moe_route", "moe_matmul",
        "moe_combine", "transpose", "sigmoid_gate"};
    return (unsigned)c < LMH_OP_COUNT ? names[c] : "?";
}

/* Attention settings an architecture passes with fwd_attention(). */
typedef struct lmh_attn_params {
    float scale;     /* logit scale, usually 1/sqrt(head_dim) */
    float softcap;   /* 0: none */
    int32_t window;  /* sliding window in positions, 0: none */
} lmh_attn_params;

#ifdef __cplusplus
}
#endif
#endif
