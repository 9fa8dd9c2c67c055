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
    LMH_STATE_NONE = 0, /* the layer keeps nothing between steps */
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

/* One step: rows of (token, position), grouped by sequence (the host knows which). */
typedef struct lmh_batch {
    int32_t n_rows;
    lmh_tensor *tokens;    /* i32 [n_rows], on the LMH_LAYER_INPUT backend */
    lmh_tensor *positions; /* i32 [n_rows], on every backend that runs a layer */
    int32_t n_out;
    lmh_tensor *out_rows;  /* i32 [n_out]: the rows whose logits are wanted */
    lmh_tensor *logits;    /* f32 [n_out, vocab] to fill, on the LMH_LAYER_OUTPUT backend */
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
