/* lmhost plugin ABI: cache plugins (plugins/cache-<name>/).
 *
 * A cache plugin owns the per-sequence storage of attention keys and values: its format
 * (f32, f16, quantized…), how rows are appended, how attention reads them, trimming and
 * accounting. It keeps its storage on a backend through that backend's table and
 * enqueues ops there, so the same cache plugin serves every backend. The host creates
 * one cache per backend for the layers placed on it. */
#ifndef LMHOST_CACHE_H
#define LMHOST_CACHE_H

#include "abi.h"
#include "backend.h"
#include "arch.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lmh_cache lmh_cache;

typedef struct lmh_cache_config {
    uint32_t size;          /* sizeof(lmh_cache_config) as the host knows it */
    const char *format;     /* one of the plugin's formats, e.g. "f16"; NULL: its default */
    int32_t n_layers;       /* layers this cache holds (indices 0..n_layers-1) */
    const lmh_layer_state *layers; /* their declared state */
    int32_t max_seq_len;    /* positions a sequence may reach; 0: unbounded */
} lmh_cache_config;

typedef struct lmh_cache_api {
    uint32_t size; /* sizeof(lmh_cache_api) as the plugin knows it */
    /* Storage formats offered, NULL-terminated; the first is the default. */
    const char *const *formats;

    int (*create)(const lmh_host_api *host, const lmh_backend_api *be, lmh_backend *backend,
                  const lmh_cache_config *cfg, lmh_cache **out, char *err, size_t err_len);
    void (*destroy)(lmh_cache *c);

    /* Sequences are named by the host; ids are any uint64 not in use. */
    int (*seq_add)(lmh_cache *c, uint64_t seq);
    void (*seq_remove)(lmh_cache *c, uint64_t seq);
    /* Forgets positions >= len in every layer (speculative rollback, prompt reuse). */
    int (*seq_trim)(lmh_cache *c, uint64_t seq, int32_t len);
    /* Positions stored for the sequence (as of the last layer appended). */
    int32_t (*seq_len)(lmh_cache *c, uint64_t seq);

    /* Appends rows of keys [n, kv_heads, head_dim_k] and values [n, kv_heads, head_dim_v]
     * (f32 tensors on the cache's backend) for positions seq_len.. of `layer`. */
    int (*append)(lmh_cache *c, uint64_t seq, int32_t layer, lmh_tensor *k, lmh_tensor *v);
    /* Enqueues attention of q [n, heads, head_dim_k] at positions q_pos (i32 [n]) over
     * the stored keys/values of (seq, layer), writing out [n, heads, head_dim_v]. */
    int (*attend)(lmh_cache *c, uint64_t seq, int32_t layer, lmh_tensor *q, lmh_tensor *q_pos,
                  lmh_tensor *out, const lmh_attn_params *p);

    /* Bytes the cache holds on its backend, in all and for one sequence. */
    uint64_t (*bytes)(lmh_cache *c);
    uint64_t (*seq_bytes)(lmh_cache *c, uint64_t seq);
    /* Positions (seq, layer) holds in memory now: the sequence length for layers that
     * keep everything, at most about the window for sliding-window layers. */
    int32_t (*layer_rows)(lmh_cache *c, uint64_t seq, int32_t layer);
} lmh_cache_api;

#ifdef __cplusplus
}
#endif
#endif
