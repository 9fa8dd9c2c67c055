/* The engine: one loaded model behind its plugin chain (architecture x backend x cache),
 * running batched steps of (sequence, token) rows. Not thread-safe: one caller at a time
 * (the server's scheduler thread, or a CLI command). */
#ifndef LMHOST_ENGINE_H
#define LMHOST_ENGINE_H

#include <json-c/json.h>
#include <stdint.h>
#include "plugin_loader.h"

#define ENGINE_MAX_DEVICES 8

typedef struct engine_opts {
    const char *model_dir;
    const char *backend; /* backend plugin name; NULL: "cpu" */
    const char *cache;   /* the default cache (cache_spec.h's spellings); NULL: "plain" */
    int threads;         /* 0: all cores */
    int device;          /* device index for backends with several */
    /* Several devices (n_devices > 0): an instance of `backend` on each of devices[], the
     * layers split into contiguous shares in proportion to tensor_split[] (n_devices
     * weights; all 0: to each device's free memory); `device` is then unused. */
    int n_devices;
    int devices[ENGINE_MAX_DEVICES];
    double tensor_split[ENGINE_MAX_DEVICES];
    int gpu_layers;  /* -1: every layer on `backend`; N: the first N there (split over
                        the devices), the rest on the CPU backend; 0: the CPU backend alone */
    int max_seq_len; /* 0: the model's max_position_embeddings or unbounded */
    int precision;   /* lmh_precision: 0 each backend's default, 1 exact, 2 fast */
    /* Mixtures of experts: with stream_experts the experts stay on disk and each backend
     * keeps expert_cache_bytes of them resident (0: half the memory available at start, at
     * most all of them); moe_top_k > 0 routes every row to that many of the model's
     * top_k (engine_seq_moe_top_k sets it per sequence). */
    int stream_experts;
    int64_t expert_cache_bytes;
    int moe_top_k;
    /* Optional: engine_open calls progress(progress_ctx, done, total) as the weights load,
     * done the bytes loaded so far (0 first, never above total) of the checkpoint's total,
     * and, where it called it at all, once more before it returns: done == total after a
     * successful load, done == ENGINE_LOAD_FAILED after a failed one. The host prints no
     * progress itself; the CLI and the server draw a bar with it. */
    void (*progress)(void *ctx, uint64_t done, uint64_t total);
    void *progress_ctx;
} engine_opts;

#define ENGINE_LOAD_FAILED UINT64_MAX

typedef struct engine engine;

typedef struct engine_row {
    uint64_t seq; /* rows of one sequence are contiguous within a step */
    int32_t token;
} engine_row;

#define ENGINE_MAX_BACKENDS (ENGINE_MAX_DEVICES + 1) /* the devices and the CPU's */
/* Caches open at once: one per cache spec in use (engine_cache_open). */
#define ENGINE_MAX_CACHES 8
#define ENGINE_CACHE_NAME 200

typedef struct engine_cache_stats {
    char name[ENGINE_CACHE_NAME]; /* "FORMAT" or "FORMAT,key=value": the format and its
                                     settings ("PLUGIN:" before where another plugin has the
                                     format) */
    char plugin[32];
    int index; /* engine_cache_open's */
    int seqs;  /* sequences living in it */
    uint64_t bytes, read_bytes;
} engine_cache_stats;

/* Experts streamed from disk (engine_opts.stream_experts), summed over backends. */
typedef struct engine_expert_stats {
    int streamed;            /* whether experts are streamed */
    uint64_t budget_bytes;   /* per backend */
    uint64_t expert_bytes;   /* the streamed experts' bytes in the checkpoint */
    uint64_t resident_bytes; /* experts held now */
    uint64_t stack_bytes;    /* memory set aside for them */
    uint64_t hits, misses, prefetched;
    uint64_t ahead, ahead_used; /* read for a predicted routing, and of those needed */
    uint64_t reads, read_bytes;
    double read_busy_s, depth_mean;
    uint32_t depth_max, depth_now;
} engine_expert_stats;

typedef struct engine_stats {
    uint64_t weight_bytes;      /* all weights of the checkpoint as loaded */
    uint64_t weight_read_bytes; /* weight bytes read by ops so far (all backends) */
    uint64_t mm_flops;          /* 2 x the multiply-adds of matrix products enqueued so far */
    uint64_t cache_bytes;       /* every open cache's */
    uint64_t cache_read_bytes;  /* stored keys, values and recurrent state read so far */
    uint64_t state_seq_bytes;   /* recurrent state a sequence keeps; 0 for models without */
    int cache_read_counted;     /* whether every open cache's plugin counts them (ABI 1.5) */
    uint64_t backend_bytes;     /* backend memory beyond mapped weights */
    int n_backends;
    struct {
        char name[32];
        uint64_t weights, other, mapped; /* device memory by use; mapped: used in place */
        int device;                      /* the backend's device index */
        int32_t first_layer, last_layer; /* the layers it runs (-1 for none) */
    } backend[ENGINE_MAX_BACKENDS];
    int n_caches;
    engine_cache_stats cache[ENGINE_MAX_CACHES]; /* the open caches, by index */
    engine_expert_stats experts;
} engine_stats;

engine *engine_open(const registry *reg, const engine_opts *o, char *err, size_t err_len);
void engine_close(engine *e);

int32_t engine_vocab(const engine *e);
int32_t engine_n_layers(const engine *e);
json_object *engine_config(const engine *e);
/* "arch=NAME backend=DESC cache=NAME(FORMAT)": the plugin chain in use. */
const char *engine_chain(const engine *e);
/* The file the architecture plugin running the model was loaded from. */
const char *engine_arch_file(const engine *e);
/* "exact" or "fast": the precision mode the backends run in ("fast+exact" where a split
 * model's backends differ, in slot order). */
const char *engine_precision(const engine *e);
void engine_get_stats(engine *e, engine_stats *s);
/* Backend i's (engine_stats order) memory read bandwidth in bytes/s, measured by the
 * backend; LMH_EUNSUPPORTED where it offers no probe. */
int engine_backend_read_bandwidth(engine *e, int i, double *bytes_per_s);
/* Backend i's multiply-add rate (lmh_backend_api.compute_peak), what it measured in `what`;
 * LMH_EUNSUPPORTED where it offers no probe. */
int engine_backend_compute_peak(engine *e, int i, double *flop_per_s, char *what, size_t what_len);

/* Caches: the engine holds one per cache spec in use (a cache plugin, a format and its
 * settings), each with an instance on every backend of the model, and every sequence lives
 * in one of them; one step may mix sequences of several. engine_open opens index 0,
 * engine_opts.cache's, which stays open. engine_cache_open returns the index of the cache
 * `spec` names (cache_spec.h's spellings: "FORMAT", "PLUGIN:FORMAT,key=value"...), opened
 * now or already open with the same plugin, format and settings. On failure it returns a negative
 * LMH_E* code with err saying why and leaves the engine as it was: LMH_ENOMEM for out of
 * memory or all ENGINE_MAX_CACHES caches in use by sequences; otherwise an unknown spec
 * (err names the formats there are), settings the plugin refuses, or a plugin that cannot
 * run on this backend or model. With every entry taken, a cache no sequence uses (never
 * index 0) is closed to make room: an index is kept while a sequence lives in its cache,
 * and otherwise may name another cache after a later engine_cache_open. */
int engine_cache_open(engine *e, const char *spec, char *err, size_t err_len);
/* Adds sequence seq in cache `cache` (engine_cache_open's index); engine_seq_add is
 * engine_seq_add_in(e, seq, 0). An id in use in any cache is refused (LMH_EINVAL). */
int engine_seq_add_in(engine *e, uint64_t seq, int cache);
int engine_seq_add(engine *e, uint64_t seq);
/* The cache index seq lives in; -1 for an unknown sequence. */
int engine_seq_cache(const engine *e, uint64_t seq);
void engine_seq_remove(engine *e, uint64_t seq);
/* A mixture of experts' top_k as its architecture plugin declared it, and its experts
 * (0, 0 for models without, or whose plugin does not take moe_top_k). */
int32_t engine_moe_top_k(const engine *e, int32_t *n_experts);
/* Routes seq's rows to k of the model's top_k experts (0: engine_opts.moe_top_k's, else the
 * model's). LMH_EUNSUPPORTED where engine_moe_top_k is 0; LMH_EINVAL for k out of 0..top_k
 * or an unknown sequence. */
int engine_seq_moe_top_k(engine *e, uint64_t seq, int32_t k);
int32_t engine_seq_len(engine *e, uint64_t seq);
/* The next n rows of seq are one prompt, which the caller may feed over several steps
 * (chunked prefill): until the sequence reaches the prompt's end, its rows' seq_ends
 * (lmh_batch, ABI 1.10) say that end, as one step over the whole prompt would. A trim or a
 * restore forgets it; n = 0 too. LMH_EINVAL for an unknown sequence or n < 0. */
int engine_seq_prompt(engine *e, uint64_t seq, int32_t n);
/* Forgets positions >= len. A model with recurrent state can only go back to 0 this way:
 * to another length it answers LMH_EUNSUPPORTED and the sequence's state is unusable until
 * engine_seq_restore. */
int engine_seq_trim(engine *e, uint64_t seq, int32_t len);
/* Positions layer `layer` of the sequence holds in the cache now. */
int32_t engine_layer_rows(engine *e, uint64_t seq, int32_t layer);
/* Bytes a position takes in layer `layer`'s cache, its keys (*k) and values (*v), in the
 * format's settled storage (lmh_cache_api.row_bytes, ABI 1.8; 0 for a layer without keys
 * and values). LMH_EUNSUPPORTED where the cache plugin does not say. */
int engine_layer_row_bytes(const engine *e, int32_t layer, uint64_t *k, uint64_t *v);
/* The cache plugin's name and the format in use, as the plugin names them. */
const char *engine_cache_plugin(const engine *e);
const char *engine_cache_format(const engine *e);
/* The state layer `layer` declared: keys and values, and recurrent state (n_bufs 0 for
 * none). */
const lmh_layer_state *engine_layer_state(const engine *e, int32_t layer);
const lmh_recurrent_state *engine_layer_recurrent(const engine *e, int32_t layer);

/* A sequence's state at its current length, kept in host memory: its length, its layers'
 * recurrent state (which, unlike keys and values, cannot be trimmed back) and, with with_kv,
 * the keys and values it holds. Restoring one takes a sequence there: without keys and
 * values, the same sequence, which must still hold its rows below the length (rows past it
 * are forgotten; a sliding window that moved past them refuses); with them, any sequence
 * in a cache of the same plugin, format and settings, also after engine_swap_backend. Not
 * while steps are started. */
typedef struct engine_snapshot engine_snapshot;
engine_snapshot *engine_seq_snapshot(engine *e, uint64_t seq, int with_kv, char *err,
                                     size_t err_len);
int engine_seq_restore(engine *e, uint64_t seq, const engine_snapshot *sn, char *err,
                       size_t err_len);
int32_t engine_snapshot_len(const engine_snapshot *sn);
uint64_t engine_snapshot_bytes(const engine_snapshot *sn);
void engine_snapshot_free(engine_snapshot *sn);

/* Sequences alive now. */
int engine_seq_count(const engine *e);
/* Moves the model to backend plugin `name` (no sequence may be alive). On failure the old
 * backend keeps serving and err says why. The default cache (index 0) moves with it; the
 * others are closed, to be opened again (engine_cache_open) when asked for: a format that
 * cannot run on the new backend is then refused there, not in the move. */
int engine_swap_backend(engine *e, const char *name, char *err, size_t err_len);

/* One forward step. Each row's position continues its sequence. Writes the logits of
 * rows out_rows[0..n_out) into logits[n_out * vocab] and, with ids, each row's greedy pick
 * (sampler_argmax's rule) into ids[n_out]. Either may be NULL. Picks without logits are
 * made where the logits are (LMH_OP_ARGMAX) when that backend runs it: only the ids come
 * back, not n_out rows of the vocabulary. Returns 0, or non-zero with err set: LMH_ENOMEM
 * where memory ran out (the sequences are then as before the step, but for recurrent state,
 * which a layer may have moved on: restore a snapshot before going on), else -1.
 * engine_step_start answers the same. */
int engine_step(engine *e, const engine_row *rows, int32_t n_rows, const int32_t *out_rows,
                int32_t n_out, float *logits, int32_t *ids, char *err, size_t err_len);

/* A debugging trace (check-plugin): while on, each engine_step also keeps every layer's
 * output, taken as the result of the last op the architecture plugin enqueued for that
 * layer (its residual add, in every family so far), f32 [rows of the step, width].
 * engine_trace_layer gives the last step's, or NULL for a layer that had none. */
int engine_trace(engine *e, int on);
const float *engine_trace_layer(const engine *e, int32_t layer, int64_t *rows, int64_t *width);

/* Greedy decoding without a host round trip between steps. engine_step_start enqueues a step
 * as engine_step does with ids and no logits, and returns before the picks are known; with
 * `chain`, each row's token is output i of the step started just before (rows[i].token is
 * ignored; that step had n_rows outputs), so the device goes from one step to the next while
 * the host reads the earlier picks. engine_step_finish waits for the oldest started step's
 * picks, writes up to n_ids of them and returns how many it had (-1 on error). At most
 * ENGINE_MAX_PENDING steps are outstanding; a step started past a stop (EOS) is finished
 * and its position trimmed (engine_seq_trim) by the caller. Where the backend cannot copy
 * without waiting, the picks are read at start and nothing overlaps. */
#define ENGINE_MAX_PENDING 2
/* Whether started steps overlap with the host here (the backend holding the logits copies
 * picks without waiting); where they do not, callers had better step plainly: a started
 * step then runs in full before engine_step_start returns, and a chained one delays the
 * tokens before it by a step. */
int engine_step_overlaps(const engine *e);
int engine_step_start(engine *e, const engine_row *rows, int32_t n_rows, const int32_t *out_rows,
                      int32_t n_out, int chain, char *err, size_t err_len);
int32_t engine_step_finish(engine *e, int32_t *ids, int32_t n_ids, char *err, size_t err_len);

/* ---- embeddings ------------------------------------------------------------------------
 * A sequence's embedding is the model's final hidden states (after the final norm: the
 * input of the product into the logits, which is not computed), pooled and L2-normalized
 * (in double). */
typedef enum engine_pooling {
    ENGINE_POOL_MODEL = 0, /* the model directory's own (engine_embed_pooling) */
    ENGINE_POOL_MEAN = 1,  /* the mean over the sequence's tokens */
    ENGINE_POOL_LAST = 2,  /* the last token's (decoder-only embedding models) */
    ENGINE_POOL_CLS = 3,   /* the first token's */
} engine_pooling;

/* "mean", "last", "cls" (NULL for anything else), and back (-1 for an unknown name). */
const char *engine_pooling_name(int pooling);
int engine_pooling_parse(const char *name);

/* Values an embedding has: config.json's hidden_size (text_config's where nested); 0 where
 * it does not say, and engine_embed refuses. */
int32_t engine_embed_dim(const engine *e);

/* The pooling the model directory asks for, read at engine_open: its sentence-transformers
 * Pooling module (modules.json, 1_Pooling/config.json; md_read_pooling), ENGINE_POOL_MEAN
 * where it has none. -1 where those files are malformed or ask for what the host cannot
 * do, with *why (when why is non-NULL) saying so; the engine serves everything else. */
int engine_embed_pooling(const engine *e, const char **why);

/* Sequence ids from ENGINE_SEQ_TEMP up are the engine's own: engine_embed's temporary
 * sequences take the first ones not in use there. Callers keep their ids below it (the
 * scheduler counts up from 1). */
#define ENGINE_SEQ_TEMP ((uint64_t)1 << 63)

/* Embeds n_seqs token sequences in one step: each runs as a temporary sequence in the
 * default cache (index 0; a quantized format there rounds what the rows attend to), removed
 * before it returns, so the step may run between other sequences' steps and leaves them as
 * they were. tokens[i][0..n_tokens[i]) is sequence i (n_tokens[i] >= 1); out[n_seqs *
 * engine_embed_dim] gets one L2-normalized vector each (zeros where the pooled state is all
 * zeros). Pooling ENGINE_POOL_MODEL takes engine_embed_pooling's. Every row of every
 * sequence runs in this one step, so the caller bounds their total. On the CPU a sequence's
 * vector is the same bits whatever runs beside it. Not while steps are started
 * (engine_step_start). Returns 0, or non-zero with err set: LMH_ENOMEM where memory ran
 * out (nothing changed: free memory, e.g. parked sequences, and try again), else -1. */
int engine_embed(engine *e, const int32_t *const *tokens, const int32_t *n_tokens, int32_t n_seqs,
                 int pooling, float *out, char *err, size_t err_len);

#endif
