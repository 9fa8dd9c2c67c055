/* Fusion on the Vulkan backend: which neighbouring ops run as one dispatch, and which are
 * put off so that the products reading their results compute them on the fly. Each takes
 * a step out of the chain of dependent dispatches a decode step is made of; on a GPU such
 * a step costs microseconds of launch and barrier whatever its size (README, H100).
 *
 * Held (one op, or a norm and its rope): an op that may lead a pair waits for the next op.
 *   ADD + RMS_NORM of its result                   -> rms_norm_add
 *   RMS_NORM of rows (heads) + ROPE in place        -> rms_norm_rope, which waits in turn
 *     for the next op: a COPY of the result        -> rms_norm_rope writing it there too
 *   ROPE in place + a COPY of its result           -> rms_norm_rope without the norm
 *   one-row MATMUL + in-place ADD of its result     -> the product's epilogue (fused.glsl)
 * (The COPY is the cache plugin's append of the new keys, which attention then reads: one
 * step less between the key product and attention.)
 * Put off (up to VK_NVIRT): a one-row RMS_NORM into another tensor and a one-row SWIGLU
 * are not recorded when they arrive; a one-row MATMUL reading their result computes it
 * from their operands (fused.glsl). The norm's first such reader also stores the result
 * for readers of other kinds. SwiGLU (in place in the families' code) is recorded only
 * when something else reads its result or changes its operands, and dropped when its
 * result is overwritten unread (by the next layer's gate product).
 * Held together (where the device gives shaders buffer addresses): the decode attention of
 * consecutive sequences (batched decode: the engine appends every sequence's keys, then
 * attends each), and consecutive copies (those appends), each kind recorded as one dispatch
 * when anything else comes. A dispatch a sequence was a launch each on the GPU: at 64
 * sequences a third of a step's time (README, H100).
 * Calls that observe memory (download, sync) or change it (upload) record what they need
 * first; freeing a tensor records what reads it and drops what only writes it. */
#include "vk_backend.h"

#include <stdlib.h>
#include <string.h>

static int same_f32(const lmh_tensor *t, int64_t n) {
    return t && t->dtype == LMH_F32 && lmh_nelem(t) == n;
}

/* bytes in common (exact byte ranges, not the 16-byte words the hazard tracker uses) */
static int overlap(const vk_tensor *x, const vk_tensor *y) {
    return x->a->blk == y->a->blk && x->off < y->off + y->bytes && y->off < x->off + x->bytes;
}

static int disjoint(const lmh_tensor *x, const lmh_tensor *y) {
    return !x || !y || !overlap(VT(x), VT(y));
}

static int same_range(const lmh_tensor *x, const lmh_tensor *y) {
    const vk_tensor *a = VT(x), *c = VT(y);
    return a->a->blk == c->a->blk && a->off == c->off && a->bytes == c->bytes;
}

/* x's bytes include all of y's */
static int covers(const vk_tensor *x, const vk_tensor *y) {
    return x->a->blk == y->a->blk && x->off <= y->off && y->off + y->bytes <= x->off + x->bytes;
}

static void note_err(lmh_backend *b, int rc) {
    if (rc && !b->held_err) b->held_err = rc;
}

int vk_fuse_take_err(lmh_backend *b) {
    int rc = b->held_err;
    b->held_err = 0;
    return rc;
}

/* ---- put-off ops ------------------------------------------------------------------ */

/* The op with its tensors pointing at the copies. */
static lmh_op virt_op(vk_virt *v) {
    lmh_op o = v->op;
    o.dst = &v->t[0].t;
    o.src[0] = &v->t[1].t;
    o.src[1] = v->op.src[1] ? &v->t[2].t : NULL;
    o.src[2] = o.src[3] = NULL;
    return o;
}

static void virt_keep(vk_virt *v, const lmh_op *op) {
    memset(v, 0, sizeof *v);
    v->op = *op;
    const lmh_tensor *ts[3] = {op->dst, op->src[0], op->src[1]};
    for (int i = 0; i < 3; i++)
        if (ts[i]) {
            v->t[i] = *VT(ts[i]);
            v->t[i].owned = 0;
        }
}

static void materialize(lmh_backend *b, vk_virt *v) {
    if (v->done) return;
    lmh_op o = virt_op(v);
    note_err(b, vk_enqueue_op(b, &o));
    v->done = 1;
}

static void drop(lmh_backend *b, int i) {
    memmove(&b->virt[i], &b->virt[i + 1], (size_t)(b->nvirt - i - 1) * sizeof b->virt[0]);
    b->nvirt--;
}

/* x shares bytes with an operand of the put-off op */
static int hits_operand(const vk_virt *v, const vk_tensor *x) {
    return overlap(x, &v->t[1]) || (v->op.src[1] && overlap(x, &v->t[2]));
}

/* its result overwrote an operand: once recorded it cannot be computed again */
static int in_place(const vk_virt *v) {
    return hits_operand(v, &v->t[0]);
}

/* What an op reads and writes, as put-off ops see it: its sources are read (and MoE
 * routing's src1 written too, and a recurrent op's state: ABI 1.7), its dst written. */
static int writes_src(const lmh_op *op, int k) {
    return (op->code == LMH_OP_MOE_ROUTE && k == 1) || k == lmh_op_state_src(op->code);
}

/* Settles the put-off ops (but skip) against an op about to be recorded that reads the
 * tensors rd (nr of them) and writes wr (nw; whole: all of wr[0]): records each one whose
 * result it reads or whose operands it changes, and forgets each one whose result it
 * changes (unrecorded, when it overwrites all of that result without reading it). */
static void settle(lmh_backend *b, const vk_tensor *const *rd, int nr, const vk_tensor *const *wr,
                   int nw, int whole, int skip) {
    for (int i = b->nvirt - 1; i >= 0; i--) {
        if (i == skip) continue;
        vk_virt *v = &b->virt[i];
        int reads = 0, wd = 0, ws = 0;
        for (int k = 0; k < nr; k++) reads |= overlap(rd[k], &v->t[0]);
        for (int k = 0; k < nw; k++) {
            wd |= overlap(wr[k], &v->t[0]);
            ws |= hits_operand(v, wr[k]);
        }
        int dead = whole && nw && covers(wr[0], &v->t[0]) && !reads;
        if (reads || ((wd || ws) && !dead)) materialize(b, v);
        if (wd || ws || (v->done && in_place(v))) drop(b, i);
    }
}

static void settle_op(lmh_backend *b, const lmh_op *op, int skip) {
    const vk_tensor *rd[LMH_OP_MAX_OPERANDS], *wr[1 + LMH_OP_MAX_OPERANDS];
    int nr = 0, nw = 0;
    wr[nw++] = VT(op->dst);
    for (int k = 0; k < lmh_op_n_src(op->code); k++) { /* src_more too (ABI 1.7) */
        const lmh_tensor *t = lmh_op_src(op, k);
        if (t) {
            rd[nr++] = VT(t);
            if (writes_src(op, k)) wr[nw++] = VT(t);
        }
    }
    const lmh_tensor *sinks = lmh_op_attn_sinks(op); /* (ABI 1.10) past src[] */
    if (sinks) rd[nr++] = VT(sinks);
    settle(b, rd, nr, wr, nw, 1, skip);
}

/* A one-row norm into another tensor, or a one-row SwiGLU (in place or not). */
static int can_put_off(const lmh_backend *b, const lmh_op *op) {
    const lmh_tensor *d = op->dst, *a = op->src[0], *w = op->src[1];
    int64_t n = lmh_nelem(d);
    if (!b->fuse_products || n != lmh_inner(d) || !same_f32(d, n) || !same_f32(a, n)) return 0;
    if (op->code == LMH_OP_RMS_NORM) return disjoint(d, a) && disjoint(d, w);
    if (op->code == LMH_OP_SWIGLU)
        return same_f32(w, n) && (same_range(d, a) || disjoint(d, a)) && disjoint(d, w);
    return 0;
}

static void put_off(lmh_backend *b, const lmh_op *op) {
    if (b->nvirt == VK_NVIRT) { /* full: the oldest is recorded */
        materialize(b, &b->virt[0]);
        drop(b, 0);
    }
    virt_keep(&b->virt[b->nvirt++], op);
}

/* The put-off op whose result a one-row product reads, or -1. */
static int producer(const lmh_backend *b, const lmh_op *mm) {
    if (!vk_matvec_fusable(mm)) return -1;
    for (int i = 0; i < b->nvirt; i++) {
        const vk_virt *v = &b->virt[i];
        const lmh_tensor *d = &v->t[0].t;
        if (!same_range(mm->src[0], d) || lmh_nelem(mm->src[0]) != lmh_nelem(d)) continue;
        /* the product's output leaves the producer's operands alone */
        if (!disjoint(mm->dst, d) || !disjoint(mm->dst, &v->t[1].t) ||
            (v->op.src[1] && !disjoint(mm->dst, &v->t[2].t)))
            continue;
        if (v->op.code == LMH_OP_SWIGLU && v->done) continue; /* gate overwritten */
        return i;
    }
    return -1;
}

/* ---- held ops --------------------------------------------------------------------- */

static int record_held(lmh_backend *b, const lmh_op *add) {
    b->has_held = 0;
    if (b->held_has_rope) {
        b->held_has_rope = 0;
        return vk_rms_norm(b, &b->held, NULL, &b->held_rope, NULL);
    }
    if (!b->held_has_pro && !add) return vk_enqueue_op(b, &b->held);
    lmh_op pro = virt_op(&b->held_pro);
    return vk_matvec_fused(b, &b->held, b->held_has_pro ? &pro : NULL, b->held_write_pro, add);
}

/* An op that may lead a pair. */
static int can_lead(const lmh_op *op) {
    int64_t n = lmh_nelem(op->dst);
    /* an element-wise f32 add without broadcast: add + rms_norm */
    if (op->code == LMH_OP_ADD)
        return same_f32(op->dst, n) && same_f32(op->src[0], n) && same_f32(op->src[1], n);
    /* an f32 norm of rows short enough for one workgroup's shared memory: rms_norm + rope */
    if (op->code == LMH_OP_RMS_NORM)
        return same_f32(op->dst, n) && same_f32(op->src[0], n) &&
               lmh_inner(op->dst) <= VK_FUSE_ROPE_MAXD;
    /* an f32 rope in place, rows as short: rope + the copy of its result */
    if (op->code == LMH_OP_ROPE)
        return same_f32(op->dst, n) && same_range(op->src[0], op->dst) && op->dst->ndim == 3 &&
               lmh_inner(op->dst) <= VK_FUSE_ROPE_MAXD && op->p.i[0] <= lmh_inner(op->dst);
    /* a one-row product: its residual add */
    return vk_matvec_fusable(op);
}

/* The residual add x = x + product (either order), x apart from what the product reads. */
static int residual_add(const lmh_backend *b, const lmh_op *mm, const lmh_op *add) {
    if (add->code != LMH_OP_ADD) return 0;
    int64_t n = lmh_nelem(mm->dst);
    const lmh_tensor *d = add->dst, *s0 = add->src[0], *s1 = add->src[1];
    if (!same_f32(d, n) || !same_f32(s0, n) || !same_f32(s1, n)) return 0;
    if (!((same_range(s0, mm->dst) && same_range(s1, d)) ||
          (same_range(s1, mm->dst) && same_range(s0, d))))
        return 0;
    if (!disjoint(d, mm->dst) || !disjoint(d, mm->src[0]) || !disjoint(d, mm->src[1]) ||
        !disjoint(d, mm->src[2]))
        return 0;
    if (b->held_has_pro) {
        const vk_virt *v = &b->held_pro;
        if (hits_operand(v, VT(d)) || (b->held_write_pro && overlap(VT(d), &v->t[0]))) return 0;
    }
    return 1;
}

/* A COPY of all of a rope's result into another f32 tensor, or into a 16-bit one in whole
 * 32-bit words (norm: the norm before the rope, or NULL). */
static int rope_copy(const lmh_backend *b, const lmh_op *norm, const lmh_op *rope,
                     const lmh_op *cp) {
    if (cp->code != LMH_OP_COPY) return 0;
    const lmh_tensor *d = cp->dst, *s = cp->src[0];
    int64_t n = lmh_nelem(rope->dst);
    if (!same_f32(s, n) || !same_range(s, rope->dst) || lmh_nelem(d) != n) return 0;
    if (d->dtype != LMH_F32 && d->dtype != LMH_F16 && d->dtype != LMH_BF16) return 0;
    if (d->dtype != LMH_F32 && (lmh_inner(rope->dst) % 2 || vk_elem_off(b, VT(d)) % 2)) return 0;
    return disjoint(d, rope->dst) && disjoint(d, rope->src[1]) && disjoint(d, rope->src[2]) &&
           (!norm || disjoint(d, norm->src[1]));
}

/* 0: op taken (recorded with lead as one dispatch, or held with it); 1: not a pair
 * (nothing recorded). */
static int record_pair(lmh_backend *b, const lmh_op *lead, const lmh_op *op) {
    if (b->held_has_rope) {
        if (!rope_copy(b, lead, &b->held_rope, op)) return 1;
        b->has_held = b->held_has_rope = 0;
        return vk_rms_norm(b, lead, NULL, &b->held_rope, op);
    }
    if (lead->code == LMH_OP_ADD && op->code == LMH_OP_RMS_NORM &&
        same_range(op->src[0], lead->dst) && op->dst->dtype == LMH_F32 &&
        lmh_inner(op->src[0]) == lmh_inner(lead->dst) && disjoint(op->dst, lead->dst) &&
        disjoint(op->dst, lead->src[0]) && disjoint(op->dst, lead->src[1])) {
        b->has_held = 0;
        return vk_rms_norm(b, op, lead, NULL, NULL);
    }
    /* the rope in place on the norm's output, its rows the norm's rows: held together
     * for a copy of the result */
    if (lead->code == LMH_OP_RMS_NORM && op->code == LMH_OP_ROPE &&
        same_range(op->src[0], lead->dst) && same_range(op->dst, lead->dst) &&
        op->src[0]->ndim == 3 && op->src[0]->ne[2] == lmh_inner(lead->dst) &&
        op->p.i[0] <= op->src[0]->ne[2]) {
        b->held_rope = *op;
        b->held_has_rope = 1;
        return 0;
    }
    if (lead->code == LMH_OP_ROPE && rope_copy(b, NULL, lead, op)) {
        b->has_held = 0;
        return vk_rms_norm(b, NULL, NULL, lead, op);
    }
    if (lead->code == LMH_OP_MATMUL && residual_add(b, lead, op)) return record_held(b, op);
    return 1;
}

/* ---- the same op for several sequences --------------------------------------------- */

/* The held op with its tensors pointing at the copies. */
static lmh_op seq_op(vk_held_seq *h) {
    lmh_op o = h->op;
    o.dst = &h->t[0].t;
    for (int k = 0; k < 4; k++) o.src[k] = h->op.src[k] ? &h->t[k + 1].t : NULL;
    if (lmh_op_attn_sinks(&h->op)) o.src_more[0] = &h->t[5].t;
    return o;
}

/* Records the held ops: one dispatch for them all, where there are enough to gain from it
 * (b->seq_attn), else each as it came. */
static void flush_seqs(lmh_backend *b) {
    int n = b->nhseq;
    if (!n) return;
    b->nhseq = 0;
    memset(b->nhrng, 0, sizeof b->nhrng);
    lmh_op *ops = malloc((size_t)n * sizeof *ops);
    if (!ops) {
        note_err(b, LMH_ENOMEM);
        return;
    }
    for (int i = 0; i < n; i++) ops[i] = seq_op(&b->hseq[i]);
    if ((uint32_t)n < b->seq_attn) {
        int rc = LMH_OK;
        for (int i = 0; i < n && rc == LMH_OK; i++) rc = vk_enqueue_op(b, &ops[i]);
        note_err(b, rc);
    } else {
        note_err(b, ops[0].code == LMH_OP_ATTENTION ? vk_attention_seqs(b, ops, n)
                                                    : vk_copy_seqs(b, ops, n));
    }
    free(ops);
}

/* The held ops' tensors of operand k (dst, src0..src3) as byte ranges, each merged into
 * the one before where the two overlap or touch, so exactly their union: rows of one tensor,
 * sequence after sequence, are one range. A joining op is checked against these, not
 * against every held op: at 64 sequences the held op by held op check took about 0.28 ms
 * of host time a layer a step (perf on lavapipe), 9 comparisons a held op. */
static int hrng_hits(const lmh_backend *b, int k, const vk_tensor *t) {
    for (int i = 0; i < b->nhrng[k]; i++) {
        const vk_range *r = &b->hrng[k][i];
        if (r->blk == t->a->blk && r->lo < t->off + t->bytes && t->off < r->hi) return 1;
    }
    return 0;
}

static void hrng_add(lmh_backend *b, int k, const vk_tensor *t) {
    vk_range r = {t->a->blk, t->off, t->off + t->bytes};
    vk_range *l = b->nhrng[k] ? &b->hrng[k][b->nhrng[k] - 1] : NULL;
    if (l && l->blk == r.blk && r.lo <= l->hi && l->lo <= r.hi) {
        if (r.lo < l->lo) l->lo = r.lo;
        if (r.hi > l->hi) l->hi = r.hi;
        return;
    }
    b->hrng[k][b->nhrng[k]++] = r;
}

/* op (of key `key`, from vk_seq_key) can run in one dispatch with the held ones: the same
 * key, and nothing of theirs it writes or they write it reads. */
static int seq_joins(lmh_backend *b, const lmh_op *op, const uint32_t key[VK_SEQ_KEY]) {
    if (!b->nhseq) return 1;
    if (memcmp(key, b->hseq[0].key, VK_SEQ_KEY * sizeof *key)) return 0;
    for (int k = 0; k < 5; k++)
        if (hrng_hits(b, k, VT(op->dst))) return 0;
    for (int k = 0; k < 4; k++)
        if (op->src[k] && hrng_hits(b, 0, VT(op->src[k]))) return 0;
    return 1;
}

static int hold_seq(lmh_backend *b, const lmh_op *op, const uint32_t key[VK_SEQ_KEY]) {
    if (b->nhseq == b->caphseq) {
        int cap = b->caphseq ? 2 * b->caphseq : 16;
        vk_held_seq *p = realloc(b->hseq, (size_t)cap * sizeof *p);
        if (!p) return LMH_ENOMEM;
        b->hseq = p;
        for (int k = 0; k < 5; k++) {
            vk_range *r = realloc(b->hrng[k], (size_t)cap * sizeof *r);
            if (!r) return LMH_ENOMEM;
            b->hrng[k] = r;
        }
        b->caphseq = cap;
    }
    vk_held_seq *h = &b->hseq[b->nhseq++];
    memset(h, 0, sizeof *h);
    h->op = *op;
    memcpy(h->key, key, sizeof h->key);
    const lmh_tensor *ts[5] = {op->dst, op->src[0], op->src[1], op->src[2], op->src[3]};
    for (int k = 0; k < 5; k++)
        if (ts[k]) {
            h->t[k] = *VT(ts[k]);
            h->t[k].owned = 0;
            hrng_add(b, k, VT(ts[k]));
        }
    const lmh_tensor *sinks = lmh_op_attn_sinks(op);
    if (sinks) {
        h->t[5] = *VT(sinks);
        h->t[5].owned = 0;
    }
    return LMH_OK;
}

/* a held op's tensor lives in allocation a */
static int seqs_use(const lmh_backend *b, const vk_alloc *a) {
    for (int i = 0; i < b->nhseq; i++)
        for (int k = 0; k < 6; k++)
            if (b->hseq[i].t[k].a == a) return 1;
    return 0;
}

/* ---- entry points ----------------------------------------------------------------- */

int vk_fuse_enqueue(lmh_backend *b, const lmh_op *op) {
    uint32_t key[VK_SEQ_KEY];
    int seq = vk_seq_key(b, op, key);
    if (b->nhseq && !(seq && seq_joins(b, op, key))) flush_seqs(b);
    int pi = op->code == LMH_OP_MATMUL ? producer(b, op) : -1;
    settle_op(b, op, pi);
    if (pi >= 0) pi = producer(b, op); /* the same entry, perhaps moved by settle's drops */
    int rc = LMH_OK, done = 0;
    if (b->has_held) {
        rc = record_pair(b, &b->held, op);
        if (rc == 1)
            rc = record_held(b, NULL);
        else
            done = 1;
    }
    if (rc == LMH_OK && !done) {
        if (can_put_off(b, op)) {
            put_off(b, op);
        } else if (can_lead(op)) {
            b->held = *op;
            b->has_held = 1;
            b->held_has_rope = 0;
            b->held_has_pro = pi >= 0;
            b->held_write_pro = 0;
            if (pi >= 0) {
                vk_virt *v = &b->virt[pi];
                /* the norm's first reader stores its result (before anything later runs) */
                b->held_write_pro = v->op.code == LMH_OP_RMS_NORM && !v->done;
                if (b->held_write_pro) v->done = 1;
                b->held_pro = *v;
            }
        } else if (!seq || hold_seq(b, op, key) != LMH_OK) {
            rc = vk_enqueue_op(b, op);
        }
    }
    if (rc == LMH_OK) rc = vk_fuse_take_err(b);
    return rc;
}

static void flush_held(lmh_backend *b) {
    if (b->has_held) note_err(b, record_held(b, NULL));
}

void vk_fuse_flush(lmh_backend *b) {
    flush_held(b);
    flush_seqs(b);
    for (int i = 0; i < b->nvirt; i++) materialize(b, &b->virt[i]);
    b->nvirt = 0;
}

void vk_fuse_access(lmh_backend *b, const vk_tensor *t, int write) {
    flush_held(b);
    flush_seqs(b);
    if (write) /* perhaps part of t: what it overwrites is recorded first, not dropped */
        settle(b, NULL, 0, &t, 1, 0, -1);
    else
        settle(b, &t, 1, NULL, 0, 0, -1);
}

void vk_fuse_free(lmh_backend *b, const vk_tensor *t) {
    flush_held(b); /* it may point at t */
    if (t->owned && seqs_use(b, t->a)) flush_seqs(b);
    if (!t->owned) return; /* a view: the memory stays, and put-off ops hold copies */
    for (int i = b->nvirt - 1; i >= 0; i--) {
        vk_virt *v = &b->virt[i];
        int dst = v->t[0].a == t->a;
        int src = v->t[1].a == t->a || (v->op.src[1] && v->t[2].a == t->a);
        if (!dst && src) materialize(b, v); /* its operands go: now or never */
        if (dst || src) drop(b, i);
    }
}
