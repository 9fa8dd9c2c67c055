/* lmhost plugin ABI: the ops an architecture plugin enqueues and a backend runs.
 *
 * Every op writes dst from src[] and the scalar parameters p. Shapes are given by the
 * tensors themselves (see lmh_tensor); "rows" are all dimensions but the innermost.
 * Activations are f32; weights may be any float dtype a backend claims, and the weight
 * operands of get_rows, matmul and moe_matmul may also be quantized (LMH_Q2..LMH_Q8, abi.h;
 * LMH_MXFP4 from ABI 1.10)
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
     * [out, in] in a float dtype; src2 an optional bias [out] (float dtype) or NULL.
     * p.i[0] (ABI 1.9): LMH_MATMUL_EXACT where the result decides something discrete (a
     * router's logits choose experts): the backend then computes it with the exact mode's
     * arithmetic whatever its precision mode, so fast operands never flip a near-tied
     * choice. */
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
     * (logits become c * tanh(logit / c)), 0 for none.
     * (ABI 1.10) p.i[5] & LMH_ATTN_SINKS: src_more[0] is f32 [heads], a per-head sink logit
     * s that joins each softmax's denominator but not its sum of values:
     *   out = sum_j e^(l_j - m) v_j / (sum_j e^(l_j - m) + e^(s - m)), m = max(l_j, s),
     * and a row that sees no key gets zeros. Older backends ignore p.i[5]: the host hands
     * sinks only to caches on backends built with 1.10 on. */
    LMH_OP_ATTENTION = 11,
    /* dst = p.f[0] * tanh(src0 / p.f[0]): final-logit soft-capping. */
    LMH_OP_SOFTCAP = 12,
    /* Mixture-of-experts routing. src0 f32 [n, E] router logits; dst f32 [n, k] weights
     * and src1 i32 [n, k] (written) the chosen experts, best first. p.i[0] = k.
     * Probabilities are softmax(src0) over all experts; p.i[1] = 1 renormalises the
     * chosen k to sum to 1 (Mixtral, Qwen3-MoE), 0 keeps them (Qwen2-MoE).
     * (ABI 1.11) src2, when set: i32 [n], row r uses only its best m = src2[r] experts
     * (1 <= m <= k; values outside are clamped): columns j >= m of src1 repeat column 0's
     * expert with weight 0 in dst (an expert product grouped by expert then reads no more
     * weights than m experts' worth), and p.i[1] = 1 renormalises the m to sum to 1. */
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
     * with one element per row of src0 (a shared expert's gate). (ABI 1.7) src1 of src0's
     * shape: dst = src0 * sigmoid(src1) elementwise (a gated attention's output). */
    LMH_OP_SIGMOID_GATE = 17,
    /* dst i32 [rows] = the lowest index of the largest value of each row of src0 f32
     * [rows, n] (a greedy pick: the host then needs one id a row, not the row). NaNs never
     * win, but a row whose first value is NaN gives 0, as the host's greedy sampler. */
    LMH_OP_ARGMAX = 18,

    /* ---- ABI 1.7: column splits, activations and the recurrent (state space) ops ----
     * The recurrent ops read and write one sequence's state: an architecture plugin
     * enqueues them through host->fwd_recurrent (abi.h) with the state operand NULL, and
     * the cache plugin holding the sequence puts its state there (cache.h, recur). Their
     * "rows" are that sequence's next n positions, in order. Weight operands (conv
     * weights, biases, A_log, D, dt_bias) may be any float dtype; the state is f32; dst
     * shares memory with no operand. */

    /* Columns of each row: dst f32 [.., w] from src0 f32 [.., W], both with the same
     * number of rows (all dimensions but the innermost, counted together). src1 NULL: the
     * w columns from p.i[0] on; src1 i32 [w]: dst[r, j] = src0[r, src1[j]] (a gather; an
     * index outside [0, W) is an error at enqueue). Splits and reorders the parts of a
     * fused projection. */
    LMH_OP_COLS = 19,
    /* dst f32 = f(src0 f32), elementwise, f named by p.i[0] (LMH_UNARY_*). */
    LMH_OP_UNARY = 20,
    /* Causal depthwise convolution along one sequence's rows, with its window kept.
     * src0 x f32 [n, C]; src1 weight [C, K] or [C, 1, K] (Hugging Face Conv1d); src2 bias
     * [C] or NULL; src3 state f32 [K - 1, C]: the K - 1 inputs before x's first row
     * (zeros for a new sequence), overwritten with the last K - 1 rows of (state, x).
     * dst f32 [n, C] (not x): with xx = the state's rows then x's,
     *   dst[t, c] = act(bias[c] + sum_{j < K} w[c, j] * xx[t + j, c]),
     * act named by p.i[0] (LMH_UNARY_*, LMH_UNARY_NONE for none). */
    LMH_OP_CONV1D = 21,
    /* Mamba-1 selective scan over one sequence's rows. src0 x f32 [n, D]; src1 dt f32 [n, D]
     * (before the bias and softplus); src2 A_log [D, N]; src3 B f32 [n, N]; src4 C f32
     * [n, N]; src5 D [D] or NULL; src6 dt_bias [D] or NULL; src7 state f32 [D, N]
     * (overwritten with the state after the last row). dst y f32 [n, D]. For each row t:
     *   d = softplus(dt[t] + dt_bias), A = -exp(A_log),
     *   h[c, s] = exp(d[c] A[c, s]) h[c, s] + d[c] B[t, s] x[t, c],
     *   y[t, c] = sum_s h[c, s] C[t, s] + D[c] x[t, c]. */
    LMH_OP_SSM_SCAN = 22,
    /* Mamba-2 state space duality scan over one sequence's rows: H heads of P channels,
     * G groups of B/C (head h reads group h / (H / G)), N states. src0 x f32 [n, H * P];
     * src1 dt f32 [n, H] (before bias and softplus); src2 A_log [H]; src3 B f32 [n, G * N];
     * src4 C f32 [n, G * N]; src5 D [H] or NULL; src6 dt_bias [H] or NULL; src7 state f32
     * [H, P, N]. dst y f32 [n, H * P]. p.i[0] = H, p.i[1] = G; p.f[0], p.f[1]: the bounds d
     * is clamped to (time_step_limit), p.f[1] <= 0 for no upper one. For each row t, head h:
     *   d = clamp(softplus(dt[t, h] + dt_bias[h])), a = exp(-exp(A_log[h]) d),
     *   h[p, s] = a h[p, s] + d x[t, h, p] B[t, g, s],
     *   y[t, h, p] = sum_s h[p, s] C[t, g, s] + D[h] x[t, h, p].
     * A backend may run a chunked (matrix) form for many rows: same result within f32
     * rounding. */
    LMH_OP_SSD_SCAN = 23,
    /* Gated delta rule (Gated DeltaNet) over one sequence's rows: Hk key heads of dk,
     * Hv value heads of dv (value head h reads key head h / (Hv / Hk)). src0 q f32
     * [n, Hk, dk]; src1 k f32 [n, Hk, dk]; src2 v f32 [n, Hv, dv]; src3 a f32 [n, Hv];
     * src4 b f32 [n, Hv]; src5 A_log [Hv]; src6 dt_bias [Hv] or NULL; src7 state f32
     * [Hv, dk, dv]. dst o f32 [n, Hv, dv]. p.i[0] = 1: q and k are L2-normalised first
     * (x / sqrt(sum x^2 + p.f[1])); p.f[0] scales q (1 / sqrt(dk)). For each row and head:
     *   g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b),
     *   S = exp(g) S,  S += k (beta (v - S^T k))^T,  o = S^T q.
     * A backend may run a chunked form for many rows: same result within f32 rounding. */
    LMH_OP_DELTA_RULE = 24,
    /* (ABI 1.10) gpt-oss's clamped SwiGLU over a fused gate_up whose columns interleave:
     * src0 f32 [rows, 2d], gate at even columns, up at odd; dst f32 [rows, d]. With
     * g = min(gate, limit), u = clamp(up, -limit, limit):
     *   dst = (u + 1) * g * sigmoid(alpha * g),  p.f[0] alpha (1.702), p.f[1] limit. */
    LMH_OP_SWIGLU_OAI = 25,
    /* (ABI 1.10) Rotary embedding with two frequency tables, one chosen per row: LongRoPE's
     * short and long factors, switched on a sequence's length. As LMH_OP_ROPE (src0/dst f32
     * [n, heads, head_dim], src1 i32 [n] positions, p.i[0] rotated dims, p.i[1] style), and:
     * src4 i32 [n] a value per row, compared with the threshold p.i[2] (>= 0); a row whose
     * value is <= p.i[2] rotates with src2 f32 [p.i[0]/2] and cos/sin factor p.f[0], a row
     * whose value is > p.i[2] with src3 f32 [p.i[0]/2] and p.f[1]. Each row's result is
     * exactly LMH_OP_ROPE's with the table and factor it chose. Pass lmh_batch.seq_ends
     * (arch.h) as src4: a row then depends on its own sequence alone. A backend built before
     * 1.10 refuses the code, so a model that needs the switch fails rather than rotating
     * every row with one table. */
    LMH_OP_ROPE_SWITCH = 26,
    LMH_OP_COUNT
} lmh_op_code;

enum { LMH_ROPE_HALF = 0, LMH_ROPE_INTERLEAVED = 1 };

/* LMH_OP_UNARY's functions (p.i[0]), also the activation of LMH_OP_CONV1D. */
enum {
    LMH_UNARY_NONE = 0,      /* x */
    LMH_UNARY_SILU = 1,      /* x sigmoid(x) */
    LMH_UNARY_RELU = 2,      /* max(x, 0) */
    LMH_UNARY_RELU2 = 3,     /* max(x, 0)^2 */
    LMH_UNARY_SIGMOID = 4,   /* 1 / (1 + exp(-x)) */
    LMH_UNARY_SOFTPLUS = 5,  /* log(1 + exp(x)), x past 20 as is (torch's threshold) */
    LMH_UNARY_GELU_TANH = 6, /* as LMH_OP_GEGLU's gate */
    LMH_UNARY_COUNT
};

/* LMH_OP_MATMUL's p.i[0] flags (ABI 1.9) */
#define LMH_MATMUL_EXACT 1

/* LMH_OP_ATTENTION's p.i[5] flags (ABI 1.10) */
#define LMH_ATTN_SINKS 1 /* src_more[0]: per-head sink logits */

#define LMH_OP_MAX_SRC      4
#define LMH_OP_MAX_OPERANDS 8 /* src[] and, for the ops of ABI 1.7 on, src_more[] */

typedef struct lmh_op {
    lmh_op_code code;
    lmh_tensor *dst;
    lmh_tensor *src[LMH_OP_MAX_SRC];
    struct {
        float f[8];
        int32_t i[8];
    } p; /* op parameters as documented above: floats in f[], integers in i[] */
    /* (ABI 1.7) Operands 4..7 ("src4".."src7" above). Read only for op codes from
     * LMH_OP_COLS on: a plugin built before 1.7 passes a shorter struct. */
    lmh_tensor *src_more[LMH_OP_MAX_OPERANDS - LMH_OP_MAX_SRC];
} lmh_op;

/* How many operands an op code may have: 8 from ABI 1.7's codes on, else 4. */
static inline int lmh_op_n_src(lmh_op_code c) {
    return c >= LMH_OP_COLS ? LMH_OP_MAX_OPERANDS : LMH_OP_MAX_SRC;
}

/* Operand i (0 .. lmh_op_n_src - 1) of op. */
static inline lmh_tensor *lmh_op_src(const lmh_op *op, int i) {
    if (i < 0 || i >= lmh_op_n_src(op->code)) return NULL;
    return i < LMH_OP_MAX_SRC ? op->src[i] : op->src_more[i - LMH_OP_MAX_SRC];
}

static inline void lmh_op_set_src(lmh_op *op, int i, lmh_tensor *t) {
    if (i >= 0 && i < LMH_OP_MAX_SRC)
        op->src[i] = t;
    else if (i >= LMH_OP_MAX_SRC && i < LMH_OP_MAX_OPERANDS)
        op->src_more[i - LMH_OP_MAX_SRC] = t;
}

/* (ABI 1.10) LMH_OP_ATTENTION's sinks operand (src_more[0] under LMH_ATTN_SINKS), or NULL. */
static inline lmh_tensor *lmh_op_attn_sinks(const lmh_op *op) {
    return op->code == LMH_OP_ATTENTION && (op->p.i[5] & LMH_ATTN_SINKS) ? op->src_more[0] : NULL;
}

/* The recurrent ops' state operand: its index, or -1 for ops that keep no state. */
static inline int lmh_op_state_src(lmh_op_code c) {
    switch (c) {
    case LMH_OP_CONV1D:
        return 3;
    case LMH_OP_SSM_SCAN:
    case LMH_OP_SSD_SCAN:
    case LMH_OP_DELTA_RULE:
        return 7;
    default:
        return -1;
    }
}

/* The recurrent ops' operands with a row per position (bit i: operand i), which the host
 * cuts into each sequence's rows; dst always has them. 0 for other ops. */
static inline unsigned lmh_op_row_srcs(lmh_op_code c) {
    switch (c) {
    case LMH_OP_CONV1D:
        return 1u;
    case LMH_OP_SSM_SCAN:
    case LMH_OP_SSD_SCAN:
        return 1u | 2u | 8u | 16u;
    case LMH_OP_DELTA_RULE:
        return 1u | 2u | 4u | 8u | 16u;
    default:
        return 0;
    }
}

/* (ABI 1.10: 25 is another branch's op, its name merged apart; 26 rope_switch. The rows
 * before 1.10 kept as they were.) */
/* clang-format off */
static inline const char *lmh_op_name(lmh_op_code c) {
    static const char *const names[LMH_OP_COUNT] = {
        "?",           "get_rows",  "matmul",       "rms_norm",  "add",
        "mul",         "scale",     "swiglu",       "geglu",     "rope",
        "copy",        "attention", "softcap",      "moe_route", "moe_matmul",
        "moe_combine", "transpose", "sigmoid_gate", "argmax",    "cols",
        "unary",       "conv1d",    "ssm_scan",     "ssd_scan",  "delta_rule",
        "swiglu_oai",  "rope_switch"};
    return (unsigned)c < LMH_OP_COUNT ? names[c] : "?";
}
/* clang-format on */

/* Attention settings an architecture passes with fwd_attention(). */
typedef struct lmh_attn_params {
    float scale;    /* logit scale, usually 1/sqrt(head_dim) */
    float softcap;  /* 0: none */
    int32_t window; /* sliding window in positions, 0: none */
    /* (ABI 1.10) f32 [heads] per-head sink logits (LMH_OP_ATTENTION's), a weight of the
     * layer; NULL: none. Read only from plugins built with 1.10 on. */
    lmh_tensor *sinks;
} lmh_attn_params;

#ifdef __cplusplus
}
#endif
#endif
