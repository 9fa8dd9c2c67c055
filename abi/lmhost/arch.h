/* lmhost plugin ABI: architecture plugins (models/<family>/).
 *
 * An architecture plugin claims checkpoints by config.json's model_type, names the
 * tensors it needs, declares each layer's state, and runs a forward pass by enqueueing
 * ops through the host. It never opens files or touches a backend directly: the host
 * places weights and ops on backends (which is how a model is split over devices). */
#ifndef LMHOST_ARCH_H
#define LMHOST_ARCH_H

#include "abi.h"
#include "ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum lmh_state_kind {
    LMH_STATE_NONE = 0, /* no keys and values (recurrent state, if any, is declared apart) */
    LMH_STATE_KV = 1,   /* attention keys and values, kept by the cache plugin */
} lmh_state_kind;

/* What one layer keeps between steps, declared at load. */
typedef struct lmh_layer_state {
    lmh_state_kind kind;
    int32_t n_kv_heads;
    int32_t head_dim_k;
    int32_t head_dim_v;
    int32_t window; /* sliding window in positions; 0: the layer sees the whole sequence */
} lmh_layer_state;

/* (ABI 1.7) Recurrent state a layer keeps per sequence, declared with
 * host->declare_recurrent: up to LMH_MAX_STATE_BUFS buffers of fixed shape (a
 * convolution's window, a state space model's or linear attention's state), each f32,
 * zero for a new sequence, read and overwritten in place by the recurrent ops
 * (host->fwd_recurrent). Unlike keys and values it cannot be cut back to an earlier
 * position: the host snapshots it to go back. */
#define LMH_MAX_STATE_BUFS 4

typedef struct lmh_state_buf {
    lmh_dtype dtype; /* LMH_F32 */
    int32_t ndim;
    int64_t ne[LMH_MAX_DIMS]; /* one sequence's shape, e.g. [K - 1, C] or [H, P, N] */
} lmh_state_buf;

typedef struct lmh_recurrent_state {
    uint32_t size;  /* sizeof(lmh_recurrent_state) as the plugin knows it */
    int32_t n_bufs; /* 0: none */
    lmh_state_buf buf[LMH_MAX_STATE_BUFS];
} lmh_recurrent_state;

static inline int64_t lmh_state_buf_elems(const lmh_state_buf *b) {
    int64_t n = 1;
    for (int i = 0; i < b->ndim; i++) n *= b->ne[i];
    return n;
}

/* One step: rows of (token, position), grouped by sequence (the host knows which). */
typedef struct lmh_batch {
    int32_t n_rows;
    lmh_tensor *tokens;    /* i32 [n_rows], on the LMH_LAYER_INPUT backend */
    lmh_tensor *positions; /* i32 [n_rows], on every backend that runs a layer */
    int32_t n_out;
    lmh_tensor *out_rows; /* i32 [n_out]: the rows whose logits are wanted */
    lmh_tensor *logits;   /* f32 [n_out, vocab] to fill, on the LMH_LAYER_OUTPUT backend */
    /* (ABI 1.10; read only where host->abi_minor >= 10) i32 [n_rows], placed as positions:
     * per row, the length its sequence reaches by the end of this pass (one past its last
     * row's position), or, while the host feeds a prompt over several passes (chunked
     * prefill), one past the prompt's last position, so that every chunk sees what one pass
     * over the whole prompt would. Equal for the rows of a sequence, and independent of the
     * other sequences in the batch. LMH_OP_ROPE_SWITCH takes it. */
    lmh_tensor *seq_ends;
    /* (ABI 1.11; read only where host->abi_minor >= 11) i32 [n_rows], placed as positions,
     * or NULL: per row, how many of the top_k experts it uses (1..top_k, the request's
     * "moe_top_k"). A plugin that declared its experts (host->declare_moe) hands it to its
     * routing as LMH_OP_MOE_ROUTE's src2, or applies its own family's rule with that k. */
    lmh_tensor *moe_top_k;
} lmh_batch;

typedef struct lmh_model lmh_model; /* the plugin's own */

typedef struct lmh_arch_api {
    uint32_t size; /* sizeof(lmh_arch_api) as the plugin knows it */
    /* config.json model_type values claimed, NULL-terminated. */
    const char *const *model_types;

    /* Reads the config, declares the model and its layers, asks for its weights. On
     * failure calls host->fail() and returns non-zero; the host frees what it handed out. */
    int (*load)(const lmh_host_api *host, lmh_load_ctx *ld, lmh_model **out);
    /* Enqueues one forward pass over `b` (through host->fwd_*). The positions passed for
     * a sequence continue where its cache ends. */
    int (*forward)(lmh_model *m, const lmh_host_api *host, lmh_fwd *f, const lmh_batch *b);
    void (*unload)(lmh_model *m);
} lmh_arch_api;

#ifdef __cplusplus
}
#endif
#endif
