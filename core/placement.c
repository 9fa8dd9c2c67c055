#include "placement.h"
#include "log.h"

#include <stdlib.h>
#include <string.h>

static htensor *root(htensor *t) { return t->base ? t->base : t; }

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

/* Makes the base's copy on `slot` current: from the first slot that has one, through host
 * memory (both ends are sync points of their backends). */
static int migrate(pl_slot *slots, htensor *b, int slot) {
    size_t n = pl_bytes(b);
    int from = 0;
    while (from < PL_MAX_SLOTS && !(b->valid & (1u << from))) from++;
    if (from == PL_MAX_SLOTS) return -1;
    if (!b->phys[slot]) {
        b->phys[slot] = slots[slot].api->tensor_new(slots[slot].b, b->pub.dtype, b->pub.ndim,
                                                   b->pub.ne, b->weight ? LMH_TENSOR_WEIGHT : 0);
        if (!b->phys[slot]) return -1;
    }
    void *buf = malloc(n ? n : 1);
    if (!buf) return -1;
    int rc = slots[from].api->download(slots[from].b, b->phys[from], 0, buf, n);
    if (rc == 0) rc = slots[slot].api->upload(slots[slot].b, b->phys[slot], 0, buf, n);
    free(buf);
    if (rc == 0) b->valid |= 1u << slot;
    return rc;
}

lmh_tensor *pl_on(pl_slot *slots, htensor *t, int slot, int overwrite) {
    htensor *b = root(t);
    if (!(b->valid & (1u << slot))) {
        if (overwrite && b == t) {
            if (!b->phys[slot])
                b->phys[slot] = slots[slot].api->tensor_new(slots[slot].b, b->pub.dtype,
                                                           b->pub.ndim, b->pub.ne, 0);
            if (!b->phys[slot]) return NULL;
        } else if (migrate(slots, b, slot) != 0) {
            return NULL;
        }
    }
    if (b == t) return b->phys[slot];
    if (!t->phys[slot])
        t->phys[slot] = slots[slot].api->tensor_view(slots[slot].b, b->phys[slot], t->offset,
                                                    t->pub.dtype, t->pub.ndim, t->pub.ne);
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
