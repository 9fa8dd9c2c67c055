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
    uint32_t size;                 /* sizeof(lmh_cache_config) as the host knows it */
    const char *format;            /* one of the plugin's formats, e.g. "f16"; NULL: its default */
    int32_t n_layers;              /* layers this cache holds (indices 0..n_layers-1) */
    const lmh_layer_state *layers; /* their declared state */
    int32_t max_seq_len;           /* positions a sequence may reach; 0: unbounded */
    /* (ABI 1.7) The layers' recurrent state (n_bufs 0 where none), n_layers entries; NULL
     * or absent by size: no layer has any. A cache plugin that keeps none refuses it. */
    const lmh_recurrent_state *recurrent;
    /* (ABI 1.8) The format's settings, "key=value[,key=value...]" as the user gave them
     * (`--cache tq3,hot=0`), or NULL for its defaults. A plugin refuses keys it does not
     * know, with a message naming those it does. */
    const char *options;
    uint32_t flags; /* (ABI 1.8) LMH_CACHE_* below */
} lmh_cache_config;

/* Store every row in the format's final form when it is appended, with no staging (a
 * window of recent rows kept at higher precision, say): what a codec measurement needs
 * (`lmhost cache-eval`). Formats without staging have nothing to do. */
#define LMH_CACHE_SETTLED 1u

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

    /* (ABI 1.5) Bytes of stored keys and values read by the attention it enqueued, since
     * creation: for each attend(), the rows its queries can see, each row once (what any
     * kernel must read; a tiled one may read some twice), times the rows' bytes over the
     * K/V heads. `lmhost bench` adds them to the weights in decode's bandwidth bound: at
     * long contexts they are a large share of what a step reads. May be NULL (or absent by
     * size): not counted. */
    uint64_t (*bytes_read)(lmh_cache *c);

    /* ---- (ABI 1.7) recurrent state (arch.h): may be NULL (or absent by size) in a
     * plugin that keeps none; the host then refuses models that declare any ---- */

    /* Enqueues `op` (a recurrent op, ops.h, over n = dst->ne[0] rows of one sequence) with
     * the state buffer `buf` of (seq, layer) as its state operand, however the plugin
     * stores it; the buffer has then taken n more positions. A sequence's length is its
     * layers' common position: seq_trim to fewer positions than a recurrent layer has
     * taken starts its state over at 0, else leaves it unusable (recur fails) until
     * state_load sets it. bytes_read counts the state read. */
    int (*recur)(lmh_cache *c, uint64_t seq, int32_t layer, int32_t buf, const lmh_op *op);
    /* Bytes state_save writes for the sequence now: its recurrent state and, with with_kv,
     * the key and value rows it holds. */
    uint64_t (*state_size)(lmh_cache *c, uint64_t seq, int with_kv);
    /* Copies the sequence's state at its length to host memory (a sync point), in a layout
     * of the plugin's that any instance of it with the same format reads back, on any
     * backend: its length, its recurrent state and, with with_kv, its key and value rows. */
    int (*state_save)(lmh_cache *c, uint64_t seq, int with_kv, void *dst, uint64_t n);
    /* Takes the sequence to what state_save wrote: its length, its recurrent state and,
     * where the copy has them, its key and value rows (in place of its own). A copy
     * without them keeps the sequence's own rows below the length, which it must still hold
     * (LMH_EINVAL, or LMH_EUNSUPPORTED where a sliding window has moved past them: nothing
     * changed). */
    int (*state_load)(lmh_cache *c, uint64_t seq, const void *src, uint64_t n);

    /* (ABI 1.8) Enqueues writing the keys and values of positions [first, first + n) of
     * (seq, layer) as attention reads them (decoded to f32) into k [n, kv_heads,
     * head_dim_k] and v [n, kv_heads, head_dim_v], f32 tensors on the cache's backend.
     * The positions must be held (LMH_EINVAL otherwise). For codec checks and tests;
     * may be NULL (or absent by size). */
    int (*read_rows)(lmh_cache *c, uint64_t seq, int32_t layer, int32_t first, int32_t n,
                     lmh_tensor *k, lmh_tensor *v);
    /* (ABI 1.8) Bytes one position takes in layer `layer`, all its K/V heads, in the
     * format's settled storage: *k for its keys, *v for its values (0 for a layer without
     * attention state). What a position costs, not what is allocated (bytes()). May be
     * NULL (or absent by size). */
    void (*row_bytes)(lmh_cache *c, int32_t layer, uint64_t *k, uint64_t *v);

    /* (ABI 1.13) Per format, in the order of `formats`: the bits of mlx-lm's "kv_bits" the
     * format stands for (an MLX-style affine group quantization of that many bits a value,
     * its group the setting group=N), or 0 for a format that is not one. A request's
     * kv_bits picks the format that says its number. May be NULL (or absent by size). */
    const int32_t *kv_bits;
} lmh_cache_api;

#ifdef __cplusplus
}
#endif
#endif
