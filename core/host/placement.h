/* Host tensors: what architecture plugins hold. Each stands for data that may live on one
 * or more backends; the engine places every op on the backend of its layer and, where an
 * operand's current data sits on another backend, copies it there first. This is what lets
 * one model span two backends (--gpu-layers) and move between them at run time. */
#ifndef LMHOST_PLACEMENT_H
#define LMHOST_PLACEMENT_H

#include "lmhost/lmhost.h"
#include "plugin_loader.h"

/* Up to 8 devices and the CPU in use, one more while a model moves to a new backend. */
#define PL_MAX_SLOTS 10

typedef struct pl_slot {
    const plugin *plugin;
    const lmh_backend_api *api;
    lmh_backend *b;
} pl_slot;

/* A quantized weight's checkpoint parts (backend.h, tensor_quant), in host memory that
 * outlives the tensor (the mapped file): a backend cannot download a quantized tensor, so a
 * copy on another slot is made from these with that backend's tensor_quant. */
typedef struct pl_qsrc {
    const uint32_t *packed;
    const void *scales, *biases;
    lmh_dtype sb_dtype;
} pl_qsrc;

typedef struct htensor {
    lmh_tensor pub;                 /* first: plugins see an lmh_tensor */
    struct htensor *base;           /* NULL for a tensor that owns its data */
    size_t offset;                  /* bytes into base (views) */
    lmh_tensor *phys[PL_MAX_SLOTS]; /* the backend tensor (or view) on each slot */
    unsigned valid;                 /* bases: slots whose copy is current */
    int weight;                     /* read-only: copies stay current for good */
    pl_qsrc q;                      /* quantized weights: where a copy on another slot comes from */
    struct xs_tensor *xs; /* experts streamed from disk (expert_stream.h): no copy anywhere */
} htensor;

static inline htensor *HT(lmh_tensor *t) {
    return (htensor *)t;
}

/* A new tensor on `slot` (its data there is current; contents undefined). */
htensor *pl_new(pl_slot *slots, int slot, lmh_dtype dt, int32_t ndim, const int64_t *ne,
                uint32_t flags);
/* A tensor around an existing backend tensor of `slot`. */
htensor *pl_adopt(lmh_tensor *phys, int slot, int weight);
/* Another shape over t's elements from byte `offset`. */
htensor *pl_view(htensor *t, size_t offset, int32_t ndim, const int64_t *ne);
/* The backend tensor for t on `slot`, copying the current data there first unless the
 * caller will overwrite all of t. NULL when memory runs out or the backend cannot hold t's
 * dtype; pl_on_why then says which (err may be NULL). */
lmh_tensor *pl_on(pl_slot *slots, htensor *t, int slot, int overwrite);
lmh_tensor *pl_on_why(pl_slot *slots, htensor *t, int slot, int overwrite, char *err,
                      size_t err_len);
/* Records that `slot` now holds the only current copy of t's data. */
void pl_written(htensor *t, int slot);
/* Drops t's copy on `slot` (after the data is current elsewhere). */
void pl_drop(pl_slot *slots, htensor *t, int slot);
void pl_free(pl_slot *slots, htensor *t);
size_t pl_bytes(const htensor *t);

#endif
