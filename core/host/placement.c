#include "placement.h"
#include "log.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static htensor *root(htensor *t) {
    return t->base ? t->base : t;
}

size_t pl_bytes(const htensor *t) {
    size_t n = lmh_dtype_size(t->pub.dtype);
    for (int i = 0; i < t->pub.ndim; i++) n *= (size_t)t->pub.ne[i];
    return n;
}

static htensor *alloc_ht(lmh_dtype dt, int32_t ndim, const int64_t *ne) {
    htensor *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->pub.dtype = dt;
    t->pub.ndim = ndim;
    for (int i = 0; i < ndim; i++) t->pub.ne[i] = ne[i];
    t->pub.backend_priv = t;
    return t;
}

htensor *pl_new(pl_slot *slots, int slot, lmh_dtype dt, int32_t ndim, const int64_t *ne,
                uint32_t flags) {
    lmh_tensor *p = slots[slot].api->tensor_new(slots[slot].b, dt, ndim, ne, flags);
    if (!p) return NULL;
    htensor *t = pl_adopt(p, slot, (flags & LMH_TENSOR_WEIGHT) != 0);
    if (!t) slots[slot].api->tensor_free(slots[slot].b, p);
    return t;
}

htensor *pl_adopt(lmh_tensor *phys, int slot, int weight) {
    htensor *t = alloc_ht(phys->dtype, phys->ndim, phys->ne);
    if (!t) return NULL;
    t->phys[slot] = phys;
    t->valid = 1u << slot;
    t->weight = weight;
    return t;
}

htensor *pl_view(htensor *t, size_t offset, int32_t ndim, const int64_t *ne) {
    htensor *v = alloc_ht(t->pub.dtype, ndim, ne);
    if (!v) return NULL;
    v->base = root(t);
    v->offset = t->offset + offset;
    v->weight = t->weight;
    return v;
}

static const char *slot_name(const pl_slot *slots, int slot) {
    return slots[slot].plugin && slots[slot].plugin->info ? slots[slot].plugin->info->name
                                                          : "backend";
}

static void shape_of(const htensor *t, char *buf, size_t len) {
    size_t o = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < t->pub.ndim && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? ", " : "", (long long)t->pub.ne[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
}

/* A quantized weight on `slot`, made again from its checkpoint parts by that backend. */
static int migrate_quant(pl_slot *slots, htensor *b, int slot, char *err, size_t err_len) {
    const lmh_backend_api *api = slots[slot].api;
    char kind[32], shape[96];
    if (lmh_dtype_is_mxfp4(b->pub.dtype))
        snprintf(kind, sizeof kind, "microscaled 4-bit");
    else
        snprintf(kind, sizeof kind, "%d-bit", lmh_quant_bits(b->pub.dtype));
    shape_of(b, shape, sizeof shape);
    if (!b->q.packed)
        return errf(err, err_len, "a %s quantized tensor %s has no host copy to move from", kind,
                    shape);
    if (api->size < offsetof(lmh_backend_api, tensor_quant) + sizeof api->tensor_quant ||
        !api->tensor_quant ||
        (lmh_dtype_is_mxfp4(b->pub.dtype) && slots[slot].plugin && slots[slot].plugin->info &&
         slots[slot].plugin->info->abi_minor < 10))
        return errf(err, err_len, "backend %s cannot run quantized weights (a %s tensor %s)",
                    slot_name(slots, slot), kind, shape);
    if (!b->phys[slot])
        b->phys[slot] =
            api->tensor_quant(slots[slot].b, b->pub.dtype, b->pub.group, b->pub.ndim, b->pub.ne,
                              b->q.packed, b->q.sb_dtype, b->q.scales, b->q.biases);
    if (!b->phys[slot])
        return errf(err, err_len,
                    "backend %s refused a %s quantized tensor %s in groups of %d (out of "
                    "memory, or a layout it does not take)",
                    slot_name(slots, slot), kind, shape, b->pub.group);
    b->valid |= 1u << slot;
    return 0;
}

/* Makes the base's copy on `slot` current: from the first slot that has one, through host
 * memory (both ends are sync points of their backends). */
static int migrate(pl_slot *slots, htensor *b, int slot, char *err, size_t err_len) {
    if (lmh_dtype_is_packed(b->pub.dtype)) return migrate_quant(slots, b, slot, err, err_len);
    size_t n = pl_bytes(b);
    int from = 0;
    while (from < PL_MAX_SLOTS && !(b->valid & (1u << from))) from++;
    if (from == PL_MAX_SLOTS) return errf(err, err_len, "a tensor has no current copy to move");
    if (!b->phys[slot]) {
        b->phys[slot] = slots[slot].api->tensor_new(slots[slot].b, b->pub.dtype, b->pub.ndim,
                                                    b->pub.ne, b->weight ? LMH_TENSOR_WEIGHT : 0);
        if (!b->phys[slot])
            return errf(err, err_len, "out of %s memory for a %s tensor of %zu bytes",
                        slot_name(slots, slot), lmh_dtype_name(b->pub.dtype), n);
    }
    void *buf = malloc(n ? n : 1);
    if (!buf) return errf(err, err_len, "out of host memory copying %zu bytes", n);
    int rc = slots[from].api->download(slots[from].b, b->phys[from], 0, buf, n);
    if (rc == 0) rc = slots[slot].api->upload(slots[slot].b, b->phys[slot], 0, buf, n);
    free(buf);
    if (rc != 0)
        return errf(err, err_len, "copying %zu bytes from %s to %s failed (error %d)", n,
                    slot_name(slots, from), slot_name(slots, slot), rc);
    b->valid |= 1u << slot;
    return 0;
}

lmh_tensor *pl_on(pl_slot *slots, htensor *t, int slot, int overwrite) {
    return pl_on_why(slots, t, slot, overwrite, NULL, 0);
}

lmh_tensor *pl_on_why(pl_slot *slots, htensor *t, int slot, int overwrite, char *err,
                      size_t err_len) {
    htensor *b = root(t);
    if (!(b->valid & (1u << slot))) {
        if (overwrite && b == t && !lmh_dtype_is_packed(b->pub.dtype)) {
            if (!b->phys[slot])
                b->phys[slot] = slots[slot].api->tensor_new(slots[slot].b, b->pub.dtype,
                                                            b->pub.ndim, b->pub.ne, 0);
            if (!b->phys[slot]) {
                errf(err, err_len, "out of %s memory for a %s tensor of %zu bytes",
                     slot_name(slots, slot), lmh_dtype_name(b->pub.dtype), pl_bytes(b));
                return NULL;
            }
        } else if (migrate(slots, b, slot, err, err_len) != 0) {
            return NULL;
        }
    }
    if (b == t) return b->phys[slot];
    if (!t->phys[slot])
        t->phys[slot] = slots[slot].api->tensor_view(slots[slot].b, b->phys[slot], t->offset,
                                                     t->pub.dtype, t->pub.ndim, t->pub.ne);
    if (!t->phys[slot]) errf(err, err_len, "%s cannot make a view", slot_name(slots, slot));
    return t->phys[slot];
}

void pl_written(htensor *t, int slot) {
    htensor *b = root(t);
    b->valid = 1u << slot;
}

void pl_drop(pl_slot *slots, htensor *t, int slot) {
    if (t->phys[slot]) slots[slot].api->tensor_free(slots[slot].b, t->phys[slot]);
    t->phys[slot] = NULL;
    t->valid &= ~(1u << slot);
}

void pl_free(pl_slot *slots, htensor *t) {
    if (!t) return;
    for (int s = 0; s < PL_MAX_SLOTS; s++)
        if (t->phys[s]) slots[s].api->tensor_free(slots[s].b, t->phys[s]);
    free(t);
}
