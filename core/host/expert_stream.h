/* Experts streamed from disk (--stream-experts): the stacked expert weights of a mixture of
 * experts, [E, out, in], stay in their files; each backend holds a fixed budget of them in
 * resident stacks, one per weight, [slots, out, in], filled on demand by reads from several
 * threads (O_DIRECT where the file system allows, so the page cache does not hold the model
 * behind the budget's back). An expert product over such a weight runs on its resident
 * stack with the expert ids mapped to slots (xs_resident); the engine splits a product
 * whose rows route to more experts than the stack holds. */
#ifndef LMHOST_EXPERT_STREAM_H
#define LMHOST_EXPERT_STREAM_H

#include "placement.h"

#include <stdint.h>

typedef struct xs_store xs_store;
typedef struct xs_tensor xs_tensor;

/* Where expert e's bytes of one part of a weight are: file path and offset (len a part). */
typedef struct xs_loc {
    const char *path;
    uint64_t off;
} xs_loc;

/* A weight to stream: logical [n_experts, out, in] of `dtype` (float, MLX affine or MXFP4;
 * group for the packed ones), its parts per expert as checkpoint-layout bytes: float 1 part
 * (transposed: stored [in, out] per expert), MLX affine 3 (packed, scales, biases), MXFP4 2
 * (blocks, scales). loc[p][e] says where part p of expert e lies; part_bytes[p] its length. */
typedef struct xs_desc {
    int32_t layer, slot;
    lmh_dtype dtype, sb_dtype;
    int32_t group;
    int64_t n_experts, out, in;
    int transposed;
    int n_parts;
    size_t part_bytes[3];
    const xs_loc *loc[3];
} xs_desc;

typedef struct xs_stats {
    uint64_t budget_bytes;   /* per backend, as given */
    uint64_t expert_bytes;   /* all streamed experts' bytes */
    uint64_t resident_bytes; /* experts held in the stacks now (all backends) */
    uint64_t stack_bytes;    /* the stacks' size (all backends) */
    uint64_t hits, misses;   /* expert lookups by products (a weight's expert each) */
    uint64_t prefetched;     /* misses already being read when asked for */
    uint64_t ahead;          /* experts read for a predicted routing (xs_prefetch) */
    uint64_t ahead_used;     /* of those, the ones a product then needed */
    uint64_t reads, read_bytes;
    double read_busy_s; /* wall time with at least one read in flight */
    double depth_time;  /* the integral of reads in flight over time (mean depth = / busy) */
    uint32_t depth_max; /* most reads in flight at once */
    uint32_t depth_now;
    int n_weights;
} xs_stats;

/* A store for a per-backend budget of budget_bytes, reading with io_threads threads. */
xs_store *xs_new(uint64_t budget_bytes, int io_threads);
void xs_free(xs_store *st, pl_slot *slots);
/* Registers a weight; the tensor is then the handle the engine keeps with it. NULL on bad
 * descriptions or files that cannot be opened (err says why). */
xs_tensor *xs_add(xs_store *st, const xs_desc *d, char *err, size_t err_len);
/* After the last weight: shares the budget out (each weight the same fraction of its
 * experts, at least min_slots of them: the experts one row routes to). -1 (err says why)
 * when the budget cannot hold min_slots of every weight. */
int xs_plan(xs_store *st, int32_t min_slots, char *err, size_t err_len);
/* The experts a resident stack of t holds. */
int32_t xs_slots(const xs_tensor *t);
int64_t xs_n_experts(const xs_tensor *t);
/* Makes the experts ids[0..n) name (at most xs_slots distinct ones) resident in t's stack
 * on its backend, reading what is missing, and writes each id's slot into slot_ids[0..n).
 * The other weights of t's layer start reading the same experts (their products follow with
 * the same routing). Returns the stack (the backend's tensor) or NULL with err set. */
lmh_tensor *xs_resident(xs_store *st, xs_tensor *t, pl_slot *slots, const int32_t *ids, int64_t n,
                        int32_t *slot_ids, char *err, size_t err_len);
/* Starts reading the experts ids[0..n) of every weight of `layer` on backend `slot` that are
 * not resident: a routing predicted before that layer runs (the least recently used slots make
 * room; a wrong guess costs reads, not results). */
void xs_prefetch(xs_store *st, int32_t layer, int slot, const int32_t *ids, int64_t n);
/* Whether a pass should predict: yes while at least 70% of recent guesses were used, else
 * one pass in 16 (to keep judging). */
int xs_predict_ok(xs_store *st);
/* Whether any weight of `layer` is streamed. */
int xs_layer_streams(const xs_store *st, int32_t layer);
/* Frees every resident stack (a backend is going away); they are made again on use. */
void xs_drop_stacks(xs_store *st, pl_slot *slots);
void xs_get_stats(xs_store *st, xs_stats *s);

#endif
