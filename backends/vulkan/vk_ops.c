/* The ops of the Vulkan backend: operand checks (the CPU backend's, plus what the
 * shaders need: 32-bit element indices, bindable sizes) and the dispatches that run
 * each op. Semantics are those of ops.h and backends/cpu/cpu_backend.c. */
#include "recurrent_check.h"
#include "vk_backend.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* eltwise.comp's OP */
enum {
    ELT_ADD,
    ELT_MUL,
    ELT_SCALE,
    ELT_SWIGLU,
    ELT_GEGLU,
    ELT_SOFTCAP,
    ELT_SIGMOID_GATE,
    ELT_UNARY,
    ELT_SWIGLU_OAI
};

#define MATVEC_MAXR     4 /* rows the matrix-vector kernels hold at most (matvec8: 8) */
#define MATVEC8_MAXR    8
#define MATMUL_BIG_SMEM (2 * 16 * 132 * 4) /* matmul_big's tiles: more than every device has */
/* matmul_big's 128-row tiles fewer than this: 64-row tiles (less than two rounds of an
 * H100's 132 cores: a 512-row chunk's gate and up products, 192 tiles, ran prefill 3-5%
 * slower than as 384 of 64 rows; with quantized weights 5-6% faster: README) */
#define BIG_FEW_TILES  256
#define QBIG_FEW_TILES 128
#define BIG_SPLIT_FEW  128 /* products of several tile rows split in two up to this many */
/* workgroups a product with fewer tiles aims for, split over k (1024 and 32 splits at most
 * against 256 and 16: 64 decode steps together 17.9 instead of 18.5 ms, 32 14.0 instead of
 * 14.8; README, H100) */
#define BIG_SPLIT_WGS   1024
#define BIG_SPLIT_MIN_K 256 /* columns a split takes at least */
#define BIG_SPLIT_MAX   32  /* splits at most */
#define ATTN_WG         128
/* rows from which matmul_coop.comp's 128-row tiles take a product where asked (fewer: a
 * batch of decode steps, whose products the f32 tiles split over k) */
#define COOP_MIN_ROWS 128
/* matmul_coop's 256-output tiles from this many of them (H100, 512 rows: the gate product's
 * 96 took 192 against 229 us in 128-output tiles; the 2048-output ones' 32, 294 against 184) */
#define COOP_WIDE_TILES 96
/* a product of at most COOP_SPLIT_TILES tiles split over k, towards COOP_SPLIT_WGS
 * workgroups (H100, 512 rows: the 2048-output products' 64 tiles 4 ways, 86 against 186 us
 * and 8 us to add them; the gate product's 96 wide tiles 3 ways were slower, 212 + 24
 * against 193 us) */
#define COOP_SPLIT_TILES  64
#define COOP_SPLIT_WGS    256
#define COOP_SPLIT_MIN_K  256 /* into splits of this many columns at least */
#define ATTN_COOP_WG      256 /* attn_coop.comp: 8 subgroups of 32, */
#define ATTN_COOP_BQ      128 /* BQ queries a workgroup, */
#define ATTN_COOP_MIN_WGS 16  /* used from this many workgroups */
#define ATTN_DEC_WG       128 /* attn_decode.comp's workgroup */
#define ATTN_DEC_MAXS     64  /* its splits at most (MAXS there) */
#define ATTN_DEC_MAXQ     16  /* queries per K/V head up to which it is used */
#define MOE_MAX_EXPERTS   1024
#define ROUTE_MAXK        32
/* The recurrent ops (ABI 1.7). CONV1D: a thread a channel for all rows (state rewritten in
 * the same dispatch) up to CONV_ROWS rows; past them a thread an output, then the state. */
#define CONV_ROWS    16
#define SCAN_WG      128 /* scan.comp and delta.comp's workgroups */
#define SCAN_TB      16  /* scan.comp's rows between sums of the lanes' parts */
#define SCAN_SPT     8   /* states a lane of scan.comp holds in registers at most */
#define SCAN_MIN_WGS 512 /* scan.comp's workgroups a GPU gets where the lanes allow */
#define CHUNK_L      64  /* ssd_chunk.comp's and delta_chunk.comp's chunk (their L) */
#define CHUNK_WG     256
#define DELTA_CB     16 /* delta_chunk.comp's SEQ: columns of S a workgroup (its CB) */
#define DELTA_SPT    16 /* delta.comp: rows of S a lane at most */
/* the chunked forms' scratch a pass at most: a longer op is cut into passes of whole chunks
 * (SSD: chunks x H x (2 L + P N) words; delta: chunks x Hv x BLK, delta_chunk.comp) */
#define SCAN_SCRATCH ((VkDeviceSize)64 << 20)

/* A weight operand: a float dtype, or quantized (made by tensor_quant). */
static int is_weight(lmh_dtype d) {
    return lmh_dtype_is_float(d) || lmh_dtype_is_packed(d);
}
static uint32_t dtc(lmh_dtype d) {
    return d == LMH_F16 ? 1u : d == LMH_BF16 ? 2u : 0u;
}
static uint32_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static uint32_t cdiv(uint64_t a, uint64_t b) {
    return (uint32_t)((a + b - 1) / b);
}

/* The CPU backend's operand checks: everything ops.h promises. */
static int check_semantics(const lmh_op *op) {
    const lmh_tensor *d = op->dst, *a = op->src[0], *b = op->src[1], *c = op->src[2];
    if (!d || !a) return LMH_EINVAL;
    switch (op->code) {
    case LMH_OP_GET_ROWS:
        if (!b || !is_weight(a->dtype) || b->dtype != LMH_I32 || d->dtype != LMH_F32) break;
        if (lmh_nelem(d) != lmh_nelem(b) * lmh_inner(a)) return LMH_ESHAPE;
        return LMH_OK;
    case LMH_OP_MATMUL: {
        if (!b || a->dtype != LMH_F32 || d->dtype != LMH_F32 || !is_weight(b->dtype)) break;
        if (b->ndim != 2 || lmh_inner(a) != b->ne[1]) return LMH_ESHAPE;
        int64_t rows = lmh_nelem(a) / lmh_inner(a);
        if (lmh_nelem(d) != rows * b->ne[0]) return LMH_ESHAPE;
        if (c && (!lmh_dtype_is_float(c->dtype) || lmh_nelem(c) != b->ne[0])) return LMH_ESHAPE;
        return LMH_OK;
    }
    case LMH_OP_RMS_NORM:
        if (a->dtype != LMH_F32 || d->dtype != LMH_F32) break;
        if (lmh_nelem(a) != lmh_nelem(d) || lmh_inner(a) != lmh_inner(d)) return LMH_ESHAPE;
        if (b && (!lmh_dtype_is_float(b->dtype) || lmh_nelem(b) != lmh_inner(a))) return LMH_ESHAPE;
        return LMH_OK;
    case LMH_OP_ADD:
    case LMH_OP_MUL:
        if (!b || a->dtype != LMH_F32 || d->dtype != LMH_F32 || !lmh_dtype_is_float(b->dtype))
            break;
        if (lmh_nelem(a) != lmh_nelem(d)) return LMH_ESHAPE;
        if (lmh_nelem(b) != lmh_nelem(a) && lmh_nelem(b) != lmh_inner(a) && lmh_nelem(b) != 1)
            return LMH_ESHAPE;
        if (lmh_nelem(b) == 0) return LMH_ESHAPE;
        return LMH_OK;
    case LMH_OP_SCALE:
    case LMH_OP_SOFTCAP:
        if (a->dtype != LMH_F32 || d->dtype != LMH_F32) break;
        if (op->code == LMH_OP_SOFTCAP && !(op->p.f[0] > 0)) return LMH_EINVAL;
        return lmh_nelem(a) == lmh_nelem(d) ? LMH_OK : LMH_ESHAPE;
    case LMH_OP_SWIGLU_OAI: /* (ABI 1.10) */
        if (a->dtype != LMH_F32 || d->dtype != LMH_F32) break;
        if (!(op->p.f[1] > 0) || !isfinite(op->p.f[0])) return LMH_EINVAL;
        return lmh_inner(a) == 2 * lmh_inner(d) && lmh_nelem(a) == 2 * lmh_nelem(d) ? LMH_OK
                                                                                    : LMH_ESHAPE;
    case LMH_OP_SWIGLU:
    case LMH_OP_GEGLU:
        if (a->dtype != LMH_F32 || d->dtype != LMH_F32 || (b && b->dtype != LMH_F32)) break;
        if (!b) /* fused [rows, 2d] -> [rows, d] */
            return lmh_inner(a) == 2 * lmh_inner(d) && lmh_nelem(a) == 2 * lmh_nelem(d)
                       ? LMH_OK
                       : LMH_ESHAPE;
        return lmh_nelem(a) == lmh_nelem(d) && lmh_nelem(b) == lmh_nelem(d) ? LMH_OK : LMH_ESHAPE;
    case LMH_OP_TRANSPOSE:
        if (a->dtype != LMH_F32 || d->dtype != LMH_F32) break;
        if (a->ndim != 3 || d->ndim != 3 || d->ne[0] != a->ne[1] || d->ne[1] != a->ne[0] ||
            d->ne[2] != a->ne[2])
            return LMH_ESHAPE;
        return LMH_OK;
    case LMH_OP_ROPE:
    case LMH_OP_ROPE_SWITCH: {
        /* the switch's long table and per-row values (ABI 1.10) */
        const int sw = op->code == LMH_OP_ROPE_SWITCH;
        const lmh_tensor *c2 = sw ? op->src[3] : c, *e = sw ? op->src_more[0] : b;
        if (!b || !c || !c2 || !e || a->dtype != LMH_F32 || d->dtype != LMH_F32 ||
            b->dtype != LMH_I32 || c->dtype != LMH_F32 || c2->dtype != LMH_F32 ||
            e->dtype != LMH_I32)
            break;
        if (a->ndim != 3 || lmh_nelem(a) != lmh_nelem(d) || lmh_nelem(b) != a->ne[0] ||
            lmh_nelem(e) != a->ne[0])
            return LMH_ESHAPE;
        if (op->p.i[0] <= 0 || op->p.i[0] % 2 || op->p.i[0] > a->ne[2] || op->p.i[0] > 1024 ||
            lmh_nelem(c) < op->p.i[0] / 2 || lmh_nelem(c2) < op->p.i[0] / 2 ||
            (op->p.i[1] != LMH_ROPE_HALF && op->p.i[1] != LMH_ROPE_INTERLEAVED) ||
            (sw && op->p.i[2] < 0))
            return LMH_EINVAL;
        return LMH_OK;
    }
    case LMH_OP_COPY:
        if (!lmh_dtype_is_float(a->dtype) || !lmh_dtype_is_float(d->dtype)) break;
        if (a->dtype != LMH_F32 && d->dtype != LMH_F32 && a->dtype != d->dtype) break;
        return lmh_nelem(a) == lmh_nelem(d) ? LMH_OK : LMH_ESHAPE;
    case LMH_OP_ATTENTION: {
        const lmh_tensor *K = b, *V = c, *pos = op->src[3];
        if (!K || !V || !pos || a->dtype != LMH_F32 || d->dtype != LMH_F32 ||
            !lmh_dtype_is_float(K->dtype) || !lmh_dtype_is_float(V->dtype) || pos->dtype != LMH_I32)
            break;
        if (a->ndim != 3 || K->ndim != 3 || V->ndim != 3 || d->ndim != 3) return LMH_ESHAPE;
        if (K->ne[1] <= 0 || a->ne[1] % K->ne[1] || V->ne[1] != K->ne[1] || K->ne[2] != a->ne[2] ||
            d->ne[0] != a->ne[0] || d->ne[1] != a->ne[1] || d->ne[2] != V->ne[2] ||
            lmh_nelem(pos) != a->ne[0] || V->ne[0] < K->ne[0])
            return LMH_ESHAPE;
        if (op->p.i[0] < 0 || op->p.i[0] > K->ne[0] || op->p.i[2] < 0 || op->p.i[3] < 0 ||
            (op->p.i[3] > 0 && (op->p.i[3] > K->ne[0] || op->p.i[4] < op->p.i[0])))
            return LMH_EINVAL;
        if (op->p.i[5] & ~LMH_ATTN_SINKS) return LMH_EINVAL;
        const lmh_tensor *sk = lmh_op_attn_sinks(op); /* (ABI 1.10) */
        if ((op->p.i[5] & LMH_ATTN_SINKS) &&
            (!sk || sk->dtype != LMH_F32 || lmh_nelem(sk) != a->ne[1]))
            return LMH_ESHAPE;
        return LMH_OK;
    }
    case LMH_OP_MOE_ROUTE:
        if (!b || a->dtype != LMH_F32 || d->dtype != LMH_F32 || b->dtype != LMH_I32) break;
        if (a->ndim != 2 || d->ndim != 2 || b->ndim != 2 || d->ne[0] != a->ne[0] ||
            d->ne[1] != op->p.i[0] || b->ne[0] != a->ne[0] || b->ne[1] != op->p.i[0])
            return LMH_ESHAPE;
        /* (ABI 1.11) src2: i32 [n], the experts each row uses */
        if (c && c->dtype != LMH_I32) break;
        if (c && lmh_nelem(c) != a->ne[0]) return LMH_ESHAPE;
        return op->p.i[0] >= 1 && op->p.i[0] <= a->ne[1] ? LMH_OK : LMH_EINVAL;
    case LMH_OP_MOE_MATMUL:
        if (!b || !c || a->dtype != LMH_F32 || d->dtype != LMH_F32 || !is_weight(b->dtype) ||
            c->dtype != LMH_I32)
            break;
        if (b->ndim != 3 || c->ndim != 2 || d->ndim != 3 || d->ne[0] != c->ne[0] ||
            d->ne[1] != c->ne[1] || d->ne[2] != b->ne[1] || lmh_inner(a) != b->ne[2] ||
            !((a->ndim == 2 && a->ne[0] == c->ne[0]) ||
              (a->ndim == 3 && a->ne[0] == c->ne[0] && a->ne[1] == c->ne[1])))
            return LMH_ESHAPE;
        return LMH_OK;
    case LMH_OP_SIGMOID_GATE: /* a gate a row, or (ABI 1.7) of src0's shape */
        if (!b || a->dtype != LMH_F32 || b->dtype != LMH_F32 || d->dtype != LMH_F32) break;
        if (lmh_nelem(a) != lmh_nelem(d) ||
            (lmh_nelem(b) * lmh_inner(a) != lmh_nelem(a) && lmh_nelem(b) != lmh_nelem(a)))
            return LMH_ESHAPE;
        return LMH_OK;
    case LMH_OP_COLS:
    case LMH_OP_UNARY:
    case LMH_OP_CONV1D:
    case LMH_OP_SSM_SCAN:
    case LMH_OP_SSD_SCAN:
    case LMH_OP_DELTA_RULE:
        return lmh_check_recurrent(op);
    case LMH_OP_ARGMAX:
        if (a->dtype != LMH_F32 || d->dtype != LMH_I32) break;
        if (lmh_inner(a) < 1 || lmh_nelem(d) * lmh_inner(a) != lmh_nelem(a)) return LMH_ESHAPE;
        return lmh_nelem(a) <= UINT32_MAX ? LMH_OK : LMH_EUNSUPPORTED;
    case LMH_OP_MOE_COMBINE:
        if (!b || a->dtype != LMH_F32 || b->dtype != LMH_F32 || d->dtype != LMH_F32) break;
        if (a->ndim != 3 || b->ndim != 2 || d->ndim != 2 || b->ne[0] != a->ne[0] ||
            b->ne[1] != a->ne[1] || d->ne[0] != a->ne[0] || d->ne[1] != a->ne[2])
            return LMH_ESHAPE;
        return LMH_OK;
    default:
        break;
    }
    return LMH_EUNSUPPORTED;
}

/* Attention's queries per workgroup at most: accumulators (BQ * DPT <= 32 a thread) and
 * shared memory (q block, scores, reductions) bound it; 0 when nothing fits. */
static uint32_t attn_bq_max(const lmh_backend *b, int64_t d, int64_t dv) {
    uint32_t dpt = cdiv((uint64_t)dv, ATTN_WG), bq = 16;
    if (dpt == 0) dpt = 1;
    /* shared: q, the tile's scores (a key's queries in vec4s, an odd count: attention.comp's
     * SQ4), the reductions and four words a query */
    while (bq &&
           (bq * dpt > 32 || 4u * (ATTN_WG + 4 * bq) + 16u * cdiv((uint64_t)bq * (uint64_t)d, 4) +
                                     16u * ATTN_WG * (((bq + 3) / 4) | 1) >
                                 b->max_shared))
        bq /= 2;
    return bq;
}

/* COLS's gather indices all in [0, W), as the CPU backend checks them: read back from the
 * device (after what the ops so far write), once for each write of their memory (an index
 * table is a constant: one read a layer for a model's life). */
static int cols_index_ok(lmh_backend *b, const lmh_tensor *idx, int64_t W) {
    const vk_tensor *t = VT(idx);
    /* ops held back (vk_fuse.c) that write it recorded first: its generation is then current */
    vk_fuse_access(b, t, 0);
    struct vk_cols_seen *e = NULL;
    for (int i = 0; i < VK_COLS_CACHE && !e; i++) {
        struct vk_cols_seen *c = &b->cols_seen[i];
        if (c->a == t->a && c->gen == t->a->gen && c->off == t->off && c->bytes == t->bytes) e = c;
    }
    if (!e) {
        int64_t n = lmh_nelem(idx);
        int32_t *v = malloc((size_t)(n ? n : 1) * sizeof *v);
        if (!v) return LMH_ENOMEM;
        int rc = vk_read_locked(b, t, 0, v, (size_t)n * sizeof *v);
        if (rc) {
            free(v);
            return rc;
        }
        e = &b->cols_seen[b->cols_next++ % VK_COLS_CACHE];
        *e = (struct vk_cols_seen){t->a, t->a->gen, t->off, t->bytes, INT32_MAX, INT32_MIN};
        for (int64_t i = 0; i < n; i++) {
            if (v[i] < e->lo) e->lo = v[i];
            if (v[i] > e->hi) e->hi = v[i];
        }
        free(v);
    }
    return e->lo >= 0 && e->hi < W ? LMH_OK : LMH_EINVAL;
}

int vk_check_op(lmh_backend *b, const lmh_op *op) {
    int rc = check_semantics(op);
    if (rc != LMH_OK) return rc;
    /* the shaders index in 32 bits and bind every operand whole (a quantized weight is
     * addressed by words; tensor_quant keeps it under 4 GiB) */
    const int nsrc = lmh_op_n_src(op->code);
    const lmh_tensor *all[1 + LMH_OP_MAX_OPERANDS] = {op->dst};
    for (int i = 0; i < nsrc; i++) all[1 + i] = lmh_op_src(op, i);
    if (op->code == LMH_OP_ATTENTION) all[1 + LMH_OP_MAX_SRC] = lmh_op_attn_sinks(op);
    for (int i = 0; i < 1 + LMH_OP_MAX_OPERANDS; i++)
        if (all[i] &&
            ((!lmh_dtype_is_packed(all[i]->dtype) && lmh_nelem(all[i]) >= ((int64_t)1 << 31)) ||
             !vk_bindable(b, all[i])))
            return LMH_EUNSUPPORTED;
    const lmh_tensor *a = op->src[0], *w = op->src[1];
    switch (op->code) {
    case LMH_OP_ATTENTION:
        if (a->ne[2] > 1024 || op->src[2]->ne[2] > 8 * ATTN_WG ||
            !attn_bq_max(b, a->ne[2], op->src[2]->ne[2]))
            return LMH_EUNSUPPORTED;
        break;
    case LMH_OP_MOE_ROUTE:
        if (op->p.i[0] > ROUTE_MAXK) return LMH_EUNSUPPORTED;
        break;
    case LMH_OP_MOE_MATMUL:
        if (w->ne[0] > MOE_MAX_EXPERTS || 16 * ((w->ne[0] + 63) / 64 * 64) > b->max_shared ||
            cdiv((uint64_t)w->ne[1], MATVEC_NR) > 65535)
            return LMH_EUNSUPPORTED;
        break;
    case LMH_OP_MATMUL:
        if (cdiv((uint64_t)(lmh_nelem(a) / lmh_inner(a)), 64) > 65535) return LMH_EUNSUPPORTED;
        break;
    case LMH_OP_COLS: /* last: the one check that may wait for the device */
        if (w) return cols_index_ok(b, w, lmh_inner(a));
        break;
    default:
        break;
    }
    return LMH_OK;
}

/* ---- recording -------------------------------------------------------------------- */

/* Past row_max groups (65535: the least a device must offer a dimension) the grid goes 2D,
 * spread evenly: 65535 x 2 for 75968 groups would leave 42% of them idle (measured on an
 * H100: the 151936-row output head went from 2.0 to 2.66 TB/s). */
void vk_grid(vk_dispatch *d, uint64_t groups, uint32_t row_max) {
    if (!groups) groups = 1;
    uint64_t gy = cdiv(groups, row_max);
    d->groups[0] = (uint32_t)cdiv(groups, gy);
    d->groups[1] = (uint32_t)gy;
    d->groups[2] = 1;
}

static void grid(vk_dispatch *d, uint64_t groups) {
    vk_grid(d, groups, 65535);
}

static void count_read(lmh_backend *b, const lmh_tensor *w, uint64_t bytes) {
    if (VT(w)->a->weight) b->weight_read += bytes;
}

/* Bytes a kernel reads per row of a weight (a quantized one's codes, scales and biases, as
 * the CPU backend counts them). */
static uint64_t row_bytes(const lmh_tensor *w) {
    const vk_tensor *t = VT(w);
    if (lmh_dtype_is_mxfp4(w->dtype)) return (uint64_t)t->q_wpr * 4 + t->q_gpr;
    if (lmh_dtype_is_packed(w->dtype))
        return (uint64_t)t->q_wpr * 4 + 2 * (uint64_t)t->q_gpr * (t->q_sdt ? 2 : 4);
    return (uint64_t)lmh_inner(w) * lmh_dtype_size(w->dtype);
}

/* qmatvec.comp's WVEC: every 32-value chunk of W's rows starts on 16 bytes */
static uint32_t qchunks_aligned(const lmh_tensor *w) {
    const vk_tensor *t = VT(w);
    return t->off % 16 == 0 && t->q_wpr % 4 == 0 && (t->q_bits == 4 || t->q_bits == 8);
}

/* The specialization constants and push constants (after the matmul ones) of the q*.comp
 * shaders: see quant.glsl. */
static void quant_args(vk_dispatch *x, const lmh_tensor *w) {
    const vk_tensor *t = VT(w);
    x->spec[2] = t->q_sdt;
    x->spec[4] = t->q_bits;
    x->spec[5] = (uint32_t)w->group;
    x->pc[14] = t->q_wpr;
    x->pc[15] = t->q_gpr;
    x->pc[16] = t->q_scales;
    x->pc[17] = t->q_biases;
}

/* 16-byte loads are possible when the data and every row start on 16 bytes */
static int vec_ok(const lmh_tensor *t, int64_t row_elems) {
    return VT(t)->off % 16 == 0 && (row_elems * (int64_t)lmh_dtype_size(t->dtype)) % 16 == 0;
}

static int op_get_rows(lmh_backend *b, const lmh_op *op) {
    const lmh_tensor *tab = op->src[0], *ids = op->src[1];
    int64_t d = lmh_inner(tab), n = lmh_nelem(ids);
    vk_dispatch x = {.shader = VK_SH_GET_ROWS, .spec = {256, dtc(tab->dtype)}, .writes = 1};
    x.bind[0] = VT(op->dst);
    x.bind[1] = VT(tab);
    x.bind[2] = VT(ids);
    x.pc[5] = (uint32_t)(n * d);
    x.pc[6] = (uint32_t)d;
    x.pc[7] = (uint32_t)(lmh_nelem(tab) / (d ? d : 1));
    if (lmh_dtype_is_packed(tab->dtype)) { /* dequantizes the gathered rows only */
        x.shader = VK_SH_QGET_ROWS;
        quant_args(&x, tab);
        x.pc[8] = x.pc[14];
        x.pc[9] = x.pc[15];
        x.pc[10] = x.pc[16];
        x.pc[11] = x.pc[17];
        x.pc[14] = x.pc[15] = x.pc[16] = x.pc[17] = 0;
    }
    grid(&x, cdiv((uint64_t)(n * d), 256));
    count_read(b, tab, (uint64_t)n * row_bytes(tab));
    return vk_record(b, &x);
}

/* A workgroup a row (argmax.comp) */
static int op_argmax(lmh_backend *b, const lmh_op *op) {
    const lmh_tensor *x = op->src[0];
    int64_t n = lmh_inner(x), rows = lmh_nelem(op->dst);
    vk_dispatch d = {
        .shader = VK_SH_ARGMAX, .spec = {b->argmax_wg, (uint32_t)vec_ok(x, n)}, .writes = 1};
    d.bind[0] = VT(op->dst);
    d.bind[1] = VT(x);
    d.pc[5] = (uint32_t)n;
    d.pc[6] = (uint32_t)rows;
    grid(&d, (uint64_t)rows);
    return vk_record(b, &d);
}

/* Splits of k (columns) for a product of `tiles` tiles: towards `wgs` workgroups, each split
 * `min_k` columns at least and a whole number of `step`-column steps, `most` splits at most;
 * *kchunk gets a split's columns. */
static uint32_t k_splits(uint64_t tiles, int64_t in, uint64_t wgs, uint64_t min_k, uint64_t most,
                         uint32_t step, uint32_t *kchunk) {
    uint64_t want = cdiv(wgs, tiles);
    if (want > (uint64_t)in / min_k) want = (uint64_t)in / min_k;
    if (want > most) want = most;
    if (want < 1) want = 1;
    *kchunk = (uint32_t)(cdiv(cdiv((uint64_t)in, want), step) * step);
    return (uint32_t)cdiv((uint64_t)in, *kchunk);
}

/* Whether a product of `rows` rows goes to matmul_big.comp's tiles; if so, x's shader, tile
 * height (specialization constant tm_id) and grid are set. */
static int big_tiles(const lmh_backend *b, vk_dispatch *x, enum vk_shader sh, int tm_id,
                     int64_t rows, int64_t in, int64_t out) {
    if (!b->matmul_big || (uint64_t)rows < b->matmul_big || b->max_shared < MATMUL_BIG_SMEM)
        return 0;
    /* f32 tiles of 128 outputs x 128 rows, or 64 rows where 128 would give a device of
     * about 128 cores less than two tiles each, or be half empty at least (a batch of 64
     * decode steps: the output head's 1187 tiles; README, H100) */
    uint64_t tiles128 = cdiv((uint64_t)out, 128) * cdiv((uint64_t)rows, 128);
    uint64_t few = sh == VK_SH_QMATMUL_BIG ? QBIG_FEW_TILES : BIG_FEW_TILES;
    uint32_t tm = b->matmul_tm ? b->matmul_tm : rows <= 64 || tiles128 < few ? 4 : 8;
    x->shader = sh;
    x->spec[0] = 256;
    x->spec[tm_id] = tm;
    x->groups[0] = cdiv((uint64_t)out, 128);
    x->groups[1] = cdiv((uint64_t)rows, 16 * tm);
    x->groups[2] = 1;
    /* One row of few tiles (a batch of decode steps, a short prefill chunk: 16 tiles for
     * 2048 outputs) leaves most cores idle and each tile a long chain of k steps: split k
     * over the z groups, the sums then added by split_sum.comp (op_matmul). More rows of
     * few tiles (a 512-row prefill chunk's 2048- and 1024-output products: 128 and 64
     * tiles, a core each at most) split in two (273 + 7 against 372 us, and 113 + 6 against
     * 210, H100); those of more tiles not (gate and up: 1% slower). */
    uint64_t tiles = (uint64_t)x->groups[0] * x->groups[1];
    uint32_t nsplit = 1, kchunk = (uint32_t)in;
    if (x->groups[1] == 1 && tiles < BIG_SPLIT_WGS / 2 && in >= 2 * BIG_SPLIT_MIN_K) {
        nsplit = k_splits(tiles, in, BIG_SPLIT_WGS, BIG_SPLIT_MIN_K, BIG_SPLIT_MAX, 16, &kchunk);
    } else if (x->groups[1] > 1 && tiles <= BIG_SPLIT_FEW && in >= 4 * BIG_SPLIT_MIN_K) {
        kchunk = (uint32_t)(cdiv(cdiv((uint64_t)in, 2), 16) * 16);
        nsplit = (uint32_t)cdiv((uint64_t)in, kchunk);
    }
    x->groups[2] = nsplit;
    x->pc[18] = kchunk;
    return 1;
}

/* The row groups of a matrix-vector product of `rows` rows (matvec_reduce.glsl) */
static uint64_t row_groups(int64_t rows) {
    return rows <= MATVEC_MAXR ? 1 : cdiv((uint64_t)rows, MATVEC8_MAXR);
}

/* matmul.comp's (qmatmul.comp's) 64 x 64 tiles, where no larger kind of tile applies */
static void tiles64(vk_dispatch *x, enum vk_shader sh, int64_t rows, int64_t out) {
    x->shader = sh;
    x->spec[0] = 256;
    x->groups[0] = cdiv((uint64_t)out, 64);
    x->groups[1] = cdiv((uint64_t)rows, 64);
    x->groups[2] = 1;
}

/* matmul_coop.comp where asked (f16 operands, f32 sums) for products of COOP_MIN_ROWS rows
 * or more: 128 x 256 tiles, or 128 x 128 where those are few; k split over the z groups
 * where even those are few (a 512-row prefill chunk's 1024- and 2048-output products: 32
 * and 64), each split's sums added by split_sum.comp (op_matmul). */
static int coop_tiles(const lmh_backend *b, vk_dispatch *x, int64_t rows, int64_t in, int64_t out) {
    if (!b->coopmat || rows < COOP_MIN_ROWS) return 0;
    uint64_t wide = (uint64_t)cdiv((uint64_t)out, 256) * cdiv((uint64_t)rows, 128);
    uint32_t bn = wide >= COOP_WIDE_TILES ? 256 : 128;
    x->shader = VK_SH_MATMUL_COOP;
    x->spec[0] = bn;
    x->groups[0] = cdiv((uint64_t)out, bn);
    x->groups[1] = cdiv((uint64_t)rows, 128);
    uint64_t tiles = (uint64_t)x->groups[0] * x->groups[1];
    uint32_t nsplit = 1, kchunk = (uint32_t)in;
    if (tiles <= COOP_SPLIT_TILES && in >= 2 * COOP_SPLIT_MIN_K)
        nsplit = k_splits(tiles, in, COOP_SPLIT_WGS, COOP_SPLIT_MIN_K, UINT32_MAX, 32, &kchunk);
    x->groups[2] = nsplit;
    x->pc[18] = kchunk;
    return 1;
}

/* A matmul's dispatch (not recorded): matrix-vector kernels up to b->matvec_rows rows (a
 * batch of decode steps, a short prefill chunk), 8 rows a workgroup past MATVEC_MAXR; tiles
 * beyond. The tiles (matmul.comp's 64 x 64) left a device of 132 cores 32 workgroups for a
 * 2048-output product of 5 rows, each loading a chain of 128 small tiles: 0.56 ms where
 * the weights take 3 us to read (H100). */
static void matmul_dispatch(lmh_backend *b, const lmh_op *op, vk_dispatch *d) {
    const lmh_tensor *xt = op->src[0], *W = op->src[1], *bias = op->src[2];
    int64_t in = lmh_inner(xt), rows = lmh_nelem(xt) / in, out = W->ne[0];
    int exact = op->code == LMH_OP_MATMUL && (op->p.i[0] & LMH_MATMUL_EXACT); /* a router */
    vk_dispatch x = {.writes = 1};
    x.bind[0] = VT(op->dst);
    x.bind[1] = VT(xt);
    x.bind[2] = VT(W);
    x.bind[3] = bias ? VT(bias) : NULL;
    x.pc[5] = (uint32_t)in;
    x.pc[6] = (uint32_t)out;
    x.pc[7] = (uint32_t)rows;
    x.pc[8] = bias != NULL;
    x.pc[9] = bias ? dtc(bias->dtype) : 0;
    if (lmh_dtype_is_packed(W->dtype)) {
        quant_args(&x, W);
        if (rows <= b->matvec_rows) {
            x.shader = rows == 1             ? VK_SH_QMATVEC1
                       : rows <= MATVEC_MAXR ? VK_SH_QMATVEC
                                             : VK_SH_QMATVEC8;
            x.spec[0] = MATVEC_WG; /* one row too: 128 threads were slower (README) */
            x.spec[1] = QMATVEC_NR;
            x.spec[10] = x.shader != VK_SH_QMATVEC1; /* several rows: by pieces (qmatvec.comp) */
            x.spec[9] = qchunks_aligned(W);
            x.spec[3] = (uint32_t)vec_ok(xt, in);
            grid(&x, cdiv((uint64_t)out, QMATVEC_NR) * row_groups(rows));
        } else if (!exact && coop_tiles(b, &x, rows, in, out)) {
            x.shader = VK_SH_QMATMUL_COOP; /* the codes dequantized into the f16 tiles */
            x.spec[3] = (uint32_t)(vec_ok(xt, in) && in % 8 == 0);
        } else if (big_tiles(b, &x, VK_SH_QMATMUL_BIG, 6, rows, in, out)) {
            x.spec[3] = (uint32_t)(vec_ok(xt, in) && in % 8 == 0);
        } else {
            tiles64(&x, VK_SH_QMATMUL, rows, out);
        }
    } else {
        /* float weights: their dtype, and 16-byte loads where both operands' rows allow */
        int vec = vec_ok(W, in) && vec_ok(xt, in);
        x.spec[2] = dtc(W->dtype);
        if (rows <= b->matvec_rows) {
            /* one row (decode): the variant whose registers hold one row's sums, not four */
            x.shader = rows == 1             ? VK_SH_MATVEC1
                       : rows <= MATVEC_MAXR ? VK_SH_MATVEC
                                             : VK_SH_MATVEC8;
            uint32_t nr = rows > MATVEC_MAXR ? b->matvec8_nr : b->matvec_nr;
            x.spec[0] = rows == 1 ? b->matvec1_wg : b->matvec_wg;
            x.spec[1] = nr;
            x.spec[3] = (uint32_t)vec;
            grid(&x, cdiv((uint64_t)out, nr) * row_groups(rows));
        } else if ((!exact && coop_tiles(b, &x, rows, in, out)) ||
                   big_tiles(b, &x, VK_SH_MATMUL_BIG, 4, rows, in, out)) {
            x.spec[3] = (uint32_t)(vec && in % 8 == 0);
        } else {
            tiles64(&x, VK_SH_MATMUL, rows, out);
        }
    }
    /* matmul_big's and matmul_coop's split sums: the product's own result where it does not
     * split (a shared dummy would make side-by-side products look dependent to the
     * validation layer) */
    if (x.shader == VK_SH_MATMUL_BIG || x.shader == VK_SH_QMATMUL_BIG ||
        x.shader == VK_SH_MATMUL_COOP || x.shader == VK_SH_QMATMUL_COOP)
        x.bind[4] = VT(op->dst);
    count_read(b, W, (uint64_t)out * row_bytes(W));
    if (bias) count_read(b, bias, (uint64_t)out * lmh_dtype_size(bias->dtype));
    *d = x;
}

/* Room for a split product's sums: VK_SPLIT_SLOTS buffers the backend keeps, taken in turn
 * (the products of one step need no barrier between them), each grown to the most asked of
 * it. Scratch of its own for every product made prefill allocate and give back 256 MiB
 * blocks as it went: 512-token prefill 12-18% slower with its products split (README). */
static vk_tensor *split_room(lmh_backend *b, VkDeviceSize bytes) {
    vk_tensor **slot = &b->split_room[b->split_next++ % VK_SPLIT_SLOTS];
    if (*slot && (*slot)->bytes >= bytes) return *slot;
    vk_tensor_release(b, *slot); /* freed once the work recorded on it has run */
    return *slot = vk_scratch(b, bytes);
}

static int op_matmul(lmh_backend *b, const lmh_op *op) {
    vk_dispatch x;
    matmul_dispatch(b, op, &x);
    uint32_t nsplit = x.groups[2];
    if (nsplit <= 1) return vk_record(b, &x);
    /* split over k (big_tiles): the splits' sums, then their total and the bias in dst */
    const lmh_tensor *xt = op->src[0], *bias = op->src[2];
    uint64_t n = (uint64_t)(lmh_nelem(xt) / lmh_inner(xt)) * (uint64_t)op->src[1]->ne[0];
    vk_tensor *part = split_room(b, (VkDeviceSize)nsplit * n * 4);
    if (!part) return LMH_ENOMEM;
    x.bind[4] = part;
    x.writes = 1u | 1u << 4; /* (dst too, as the shader declares it) */
    int rc = vk_record(b, &x);
    vk_dispatch r = {.shader = VK_SH_SPLIT_SUM, .spec = {256}, .writes = 1};
    r.bind[0] = VT(op->dst);
    r.bind[1] = part;
    r.bind[3] = bias ? VT(bias) : NULL;
    r.pc[5] = (uint32_t)n;
    r.pc[6] = (uint32_t)op->src[1]->ne[0];
    r.pc[7] = nsplit;
    r.pc[8] = bias != NULL;
    r.pc[9] = bias ? dtc(bias->dtype) : 0;
    grid(&r, cdiv(n, 256));
    if (!rc) rc = vk_record(b, &r);
    return rc;
}

/* Quantized weights excepted: qmatvec1.comp with the norm's prologue took 24-26 us a
 * product of a Llama-2-7B-shaped 4-bit model against 17 us without (H200, profiled): each
 * workgroup's share of the norm costs more than the 4-bit weights it reads. */
int vk_matvec_fusable(const lmh_op *mm) {
    return mm->code == LMH_OP_MATMUL && lmh_nelem(mm->src[0]) == lmh_inner(mm->src[0]) &&
           !lmh_dtype_is_packed(mm->src[1]->dtype);
}

int vk_matvec_fused(lmh_backend *b, const lmh_op *mm, const lmh_op *pro, int write_pro,
                    const lmh_op *add) {
    vk_dispatch x;
    matmul_dispatch(b, mm, &x);
    int quant = x.shader == VK_SH_QMATVEC1;
    x.shader = quant ? VK_SH_QMATVEC1_FX : VK_SH_MATVEC1_FX;
    const lmh_tensor *xin = pro ? pro->src[0] : mm->src[0];
    int64_t in = lmh_inner(mm->src[0]);
    x.spec[3] = (uint32_t)(vec_ok(xin, in) && (quant || vec_ok(mm->src[1], in)));
    if (pro && pro->code == LMH_OP_RMS_NORM) {
        const lmh_tensor *w = pro->src[1];
        x.spec[6] = 1;
        x.bind[1] = VT(pro->src[0]);
        x.bind[4] = w ? VT(w) : NULL;
        x.spec[8] = (uint32_t)(!w || vec_ok(w, in));
        x.pc[20] = w != NULL;
        x.pc[21] = w ? dtc(w->dtype) : 0;
        x.pc[22] = fbits(pro->p.f[0]);
        x.pc[23] = fbits(pro->p.f[1]);
        if (write_pro) {
            x.bind[6] = VT(pro->dst);
            x.writes |= 1u << 6;
            x.pc[19] = vk_elem_off(b, VT(pro->dst));
            x.pc[24] = 1;
        }
    } else if (pro) { /* SwiGLU: gate src0, up src1 */
        x.spec[6] = 2;
        x.bind[1] = VT(pro->src[0]);
        x.bind[4] = VT(pro->src[1]);
        x.spec[8] = (uint32_t)vec_ok(pro->src[1], in);
    }
    if (add) { /* in place: the operand that is not the product's result is the add's dst */
        x.spec[7] = 1;
        x.bind[5] = VT(add->dst);
        x.writes |= 1u << 5;
        x.pc[18] = vk_elem_off(b, VT(add->dst));
    }
    /* The shader writes bindings 5 and 6 under spec constants the validation layer does
     * not evaluate: unused, they are bound to the product's own output (written anyway)
     * rather than to the shared dummy, which other bindings read. */
    for (int i = 5; i <= 6; i++)
        if (!x.bind[i]) {
            x.bind[i] = x.bind[0];
            x.writes |= 1u << i;
        }
    return vk_record(b, &x);
}

/* RMSNorm; with add (an ADD whose result the norm reads), the add in the same dispatch:
 * the residual stream's x = x + o and the norm of it then cost one step of the
 * dependency chain instead of two. With rope (a ROPE of the norm's result in place), the
 * rotation of each normalized row in the same dispatch (Qwen3's and Gemma's q/k norms). */
int vk_rms_norm(lmh_backend *b, const lmh_op *op, const lmh_op *add, const lmh_op *rope,
                const lmh_op *copy) {
    const lmh_tensor *a = add ? add->src[0] : op ? op->src[0] : rope->src[0];
    const lmh_tensor *w = op ? op->src[1] : NULL;
    int64_t d = lmh_inner(a), rows = lmh_nelem(a) / d;
    /* One workgroup per row, each thread summing d / wg elements in a dependent chain of
     * loads: wide rows get wide workgroups (up to 1024, at most 4 elements a thread), so
     * a decode step's norm is not a string of memory latencies (7.8 us at 128 threads for
     * d = 2048 on an H100). */
    uint32_t wg = 128, lim = b->props.limits.maxComputeWorkGroupInvocations;
    if (b->props.limits.maxComputeWorkGroupSize[0] < lim)
        lim = b->props.limits.maxComputeWorkGroupSize[0];
    while (wg < 1024 && (int64_t)wg * 4 < d && wg * 2 <= lim) wg *= 2;
    vk_dispatch x = {.shader = add    ? VK_SH_RMS_NORM_ADD
                               : rope ? VK_SH_RMS_NORM_ROPE
                                      : VK_SH_RMS_NORM,
                     .spec = {wg},
                     .writes = 1};
    x.bind[0] = VT(op ? op->dst : rope->dst);
    x.bind[1] = VT(a);
    x.bind[2] = w ? VT(w) : NULL;
    if (add) {
        x.bind[3] = VT(add->src[1]);
        x.bind[4] = VT(add->dst);
        x.writes |= 1u << 4;
    }
    if (rope) {
        x.bind[3] = VT(rope->src[1]);
        x.bind[4] = VT(rope->src[2]);
        x.pc[11] = (uint32_t)rope->src[0]->ne[1];
        x.pc[12] = (uint32_t)rope->p.i[0];
        x.pc[13] = (uint32_t)rope->p.i[1];
        x.pc[14] = fbits(rope->p.f[0]);
        x.pc[16] = op != NULL;
        /* binding 5 is written under a push constant: unused, it is bound to dst */
        x.bind[5] = copy ? VT(copy->dst) : x.bind[0];
        x.writes |= 1u << 5;
        if (copy) {
            x.pc[15] = vk_elem_off(b, VT(copy->dst));
            x.pc[17] = 1;
            x.pc[18] = dtc(copy->dst->dtype);
        }
    }
    x.pc[5] = (uint32_t)d;
    x.pc[6] = (uint32_t)rows;
    x.pc[7] = w != NULL;
    x.pc[8] = w ? dtc(w->dtype) : 0;
    x.pc[9] = op ? fbits(op->p.f[0]) : 0;
    x.pc[10] = op ? fbits(op->p.f[1]) : 0;
    grid(&x, (uint64_t)rows);
    return vk_record(b, &x);
}

static int op_eltwise(lmh_backend *b, const lmh_op *op) {
    const lmh_tensor *a = op->src[0], *s1 = op->src[1];
    int64_t n = lmh_nelem(op->dst);
    uint32_t kind = op->code == LMH_OP_ADD          ? ELT_ADD
                    : op->code == LMH_OP_MUL        ? ELT_MUL
                    : op->code == LMH_OP_SCALE      ? ELT_SCALE
                    : op->code == LMH_OP_SWIGLU     ? ELT_SWIGLU
                    : op->code == LMH_OP_GEGLU      ? ELT_GEGLU
                    : op->code == LMH_OP_SOFTCAP    ? ELT_SOFTCAP
                    : op->code == LMH_OP_UNARY      ? ELT_UNARY
                    : op->code == LMH_OP_SWIGLU_OAI ? ELT_SWIGLU_OAI
                                                    : ELT_SIGMOID_GATE;
    int uses_b = kind == ELT_ADD || kind == ELT_MUL || kind == ELT_SIGMOID_GATE ||
                 ((kind == ELT_SWIGLU || kind == ELT_GEGLU) && s1);
    vk_dispatch x = {.shader = VK_SH_ELTWISE, .spec = {256, kind}, .writes = 1};
    x.bind[0] = VT(op->dst);
    x.bind[1] = VT(a);
    x.bind[2] = uses_b ? VT(s1) : NULL;
    x.pc[5] = (uint32_t)n;
    x.pc[6] = uses_b ? (uint32_t)lmh_nelem(s1) : 1;
    x.pc[7] = uses_b ? dtc(s1->dtype) : 0;
    x.pc[8] = (uint32_t)lmh_inner(op->dst);
    /* the gate elementwise where it has src0's shape (checked first, as the CPU does) */
    if (kind == ELT_SIGMOID_GATE && lmh_nelem(s1) == lmh_nelem(a)) x.pc[8] = 1;
    x.pc[9] = (kind == ELT_SWIGLU || kind == ELT_GEGLU) && !s1;
    x.pc[10] = fbits(op->p.f[0]);
    x.pc[11] = kind == ELT_UNARY        ? (uint32_t)op->p.i[0]
               : kind == ELT_SWIGLU_OAI ? fbits(op->p.f[1]) /* the limit */
                                        : 0;
    grid(&x, cdiv((uint64_t)n, 256));
    return vk_record(b, &x);
}

static int op_rope(lmh_backend *b, const lmh_op *op) {
    const lmh_tensor *a = op->src[0];
    int64_t n = a->ne[0], heads = a->ne[1], hd = a->ne[2];
    int32_t rot = op->p.i[0];
    int inplace = VT(a)->a == VT(op->dst)->a && VT(a)->off == VT(op->dst)->off;
    int64_t per = rot / 2 + (inplace ? 0 : hd - rot);
    vk_dispatch x = {.shader = VK_SH_ROPE, .spec = {256}, .writes = 1};
    x.bind[0] = VT(op->dst);
    x.bind[1] = VT(a);
    x.bind[2] = VT(op->src[1]);
    x.bind[3] = VT(op->src[2]);
    x.pc[5] = (uint32_t)(n * heads * per);
    x.pc[6] = (uint32_t)per;
    x.pc[7] = (uint32_t)heads;
    x.pc[8] = (uint32_t)hd;
    x.pc[9] = (uint32_t)rot;
    x.pc[10] = (uint32_t)op->p.i[1];
    x.pc[11] = fbits(op->p.f[0]);
    if (op->code == LMH_OP_ROPE_SWITCH) { /* the long table (pc[4] its offset), row values */
        const lmh_tensor *ends = op->src_more[0];
        x.shader = VK_SH_ROPE_SWITCH;
        x.bind[4] = VT(op->src[3]);
        x.bind[5] = VT(ends);
        x.pc[12] = fbits(op->p.f[1]);
        x.pc[13] = (uint32_t)op->p.i[2];
        x.pc[14] = vk_elem_off(b, VT(ends));
    }
    grid(&x, cdiv((uint64_t)(n * heads * per), 256));
    return vk_record(b, &x);
}

static int op_copy(lmh_backend *b, const lmh_op *op) {
    int64_t n = lmh_nelem(op->dst);
    vk_dispatch x = {.shader = VK_SH_COPY,
                     .spec = {256, dtc(op->src[0]->dtype), dtc(op->dst->dtype)},
                     .writes = 1};
    x.bind[0] = VT(op->dst);
    x.bind[1] = VT(op->src[0]);
    x.pc[5] = (uint32_t)n;
    /* a 16-bit dst is written a word per thread: n / 2 + 1 words, + 1 when it starts odd */
    uint64_t threads = op->dst->dtype == LMH_F32 ? (uint64_t)n : (uint64_t)n / 2 + 2;
    grid(&x, cdiv(threads, 256));
    return vk_record(b, &x);
}

/* ---- copies of several sequences in one dispatch (copy_seqs.comp) ------------------- */

/* t's device address into a table's two words, low first */
static void put_addr(uint32_t *w, const lmh_tensor *t) {
    VkDeviceAddress a = vk_addr(VT(t));
    w[0] = (uint32_t)a;
    w[1] = (uint32_t)(a >> 32);
}

#define COPY_WORDS 8    /* a copy's table entry: source and destination addresses, count */
#define COPY_MAX   4096 /* copies a dispatch */

/* A copy copy_seqs.comp can take: both tensors reached by address, on 32-bit words. */
static int copy_seq_ok(const lmh_op *op) {
    const vk_tensor *d = VT(op->dst), *s = VT(op->src[0]);
    int64_t n = lmh_nelem(op->dst);
    int words16 = d->t.dtype != LMH_F32 || s->t.dtype != LMH_F32;
    return vk_addr(d) && vk_addr(s) && d->off % 4 == 0 && s->off % 4 == 0 && n > 0 &&
           n <= UINT32_MAX && !(words16 && n % 2);
}

static int copy_seqs_dispatch(lmh_backend *b, const lmh_op *ops, int m) {
    void *map = NULL;
    vk_tensor *tt = vk_args(b, (size_t)m * COPY_WORDS * 4, &map);
    const vk_tensor **xrd = malloc((size_t)m * sizeof *xrd);
    const vk_tensor **xwr = malloc((size_t)m * sizeof *xwr);
    int rc = tt && xrd && xwr ? LMH_OK : LMH_ENOMEM;
    uint64_t most = 1;
    for (int j = 0; j < m && rc == LMH_OK; j++) {
        uint32_t *e = (uint32_t *)map + (size_t)j * COPY_WORDS;
        put_addr(e, ops[j].src[0]);
        put_addr(e + 2, ops[j].dst);
        uint64_t n = (uint64_t)lmh_nelem(ops[j].dst);
        e[4] = (uint32_t)n;
        uint64_t words = ops[j].dst->dtype == LMH_F32 ? n : n / 2;
        if (words > most) most = words;
        xrd[j] = VT(ops[j].src[0]);
        xwr[j] = VT(ops[j].dst);
    }
    if (rc == LMH_OK) {
        vk_dispatch x = {.shader = VK_SH_COPY_SEQS,
                         .spec = {256, dtc(ops[0].src[0]->dtype), dtc(ops[0].dst->dtype)},
                         .bind = {[1] = tt},
                         .xrd = xrd,
                         .nxrd = m,
                         .xwr = xwr,
                         .nxwr = m};
        uint64_t gx = cdiv(most, 256);
        x.groups[0] = (uint32_t)(gx < 64 ? gx : 64);
        x.groups[1] = (uint32_t)m;
        x.groups[2] = 1;
        rc = vk_record(b, &x);
    }
    vk_tensor_release(b, tt);
    free(xrd);
    free(xwr);
    return rc;
}

int vk_copy_seqs(lmh_backend *b, const lmh_op *ops, int n) {
    int rc = LMH_OK;
    for (int i = 0; i < n && rc == LMH_OK; i += COPY_MAX) {
        int m = n - i < COPY_MAX ? n - i : COPY_MAX;
        rc = m == 1 ? op_copy(b, &ops[i]) : copy_seqs_dispatch(b, ops + i, m);
    }
    return rc;
}

static int op_transpose(lmh_backend *b, const lmh_op *op) {
    const lmh_tensor *a = op->src[0];
    int64_t n = lmh_nelem(a);
    vk_dispatch x = {.shader = VK_SH_TRANSPOSE, .spec = {256}, .writes = 1};
    x.bind[0] = VT(op->dst);
    x.bind[1] = VT(a);
    x.pc[5] = (uint32_t)n;
    x.pc[6] = (uint32_t)a->ne[0];
    x.pc[7] = (uint32_t)a->ne[1];
    x.pc[8] = (uint32_t)a->ne[2];
    grid(&x, cdiv((uint64_t)n, 256));
    return vk_record(b, &x);
}

/* One pass of bw_read.comp over buf (its 16-byte words, RU a thread), writing nothing but
 * (in a 1 in 2^128 case) dst's first word: the read bandwidth probe. */
int vk_record_read_probe(lmh_backend *b, vk_tensor *buf, vk_tensor *dst) {
    enum { WG = 256, RU = 16 };
    uint64_t n4 = buf->bytes / 16, groups = cdiv(n4, WG * RU);
    if (!n4 || groups > 65535 || n4 > UINT32_MAX) return LMH_EINVAL;
    vk_dispatch x = {.shader = VK_SH_BW_READ, .spec = {WG, RU}, .writes = 1};
    x.bind[0] = dst;
    x.bind[1] = buf;
    x.pc[5] = (uint32_t)n4;
    x.groups[0] = (uint32_t)groups;
    x.groups[1] = x.groups[2] = 1;
    return vk_record(b, &x);
}

/* One run of fma_peak.comp, or coop_peak.comp where the products run on the matrix cores:
 * PEAK_ITERS steps a thread of 8 vec4 chains x 4 rounds (256 FLOP), or a subgroup of 8
 * 16x16x16 products (65536 FLOP). */
int vk_record_peak_probe(lmh_backend *b, vk_tensor *dst, uint32_t groups, double *flop) {
    enum { WG = 256, PEAK_ITERS = 64 };
    vk_dispatch x = {
        .shader = b->coopmat ? VK_SH_COOP_PEAK : VK_SH_FMA_PEAK, .spec = {WG}, .writes = 1};
    x.bind[0] = dst;
    x.pc[5] = PEAK_ITERS;
    float m = 0.999f, c = 0.5f;
    memcpy(&x.pc[6], &m, 4);
    memcpy(&x.pc[7], &c, 4);
    x.groups[0] = groups;
    x.groups[1] = x.groups[2] = 1;
    double per = b->coopmat ? (double)(WG / 32) * 8 * 2 * 16 * 16 * 16 : (double)WG * 8 * 4 * 2 * 4;
    *flop = per * PEAK_ITERS * groups;
    return vk_record(b, &x);
}

/* attn_decode.comp's shape for this op: lanes per key and queries per workgroup; 0 where
 * it does not apply (many queries, dv != d, rows not in whole aligned 16-byte words, no
 * subgroup shuffles, or its shared memory does not fit). */
static int attn_decode_shape(const lmh_backend *b, const lmh_op *op, uint32_t *tpk, uint32_t *bq) {
    const lmh_tensor *q = op->src[0], *K = op->src[1], *V = op->src[2];
    int64_t nq = q->ne[0] * (q->ne[1] / K->ne[1]), d = q->ne[2];
    uint32_t kch = K->dtype == LMH_F32 ? 4 : 8, vch = V->dtype == LMH_F32 ? 4 : 8;
    uint32_t ch = kch > vch ? kch : vch, t = b->attn_dec_tpk;
    if (!t || nq > ATTN_DEC_MAXQ || V->ne[2] != d || d > 1024 || VT(K)->off % 16 || VT(V)->off % 16)
        return 0;
    while (t > 1 && d % (t * ch)) t /= 2;
    if (d % (t * ch)) return 0;
    /* a lane's q and output: BQ * d / TPK registers each, 64 at most */
    uint32_t ept = (uint32_t)d / t, n = 1;
    while (n < nq && 2 * n * ept <= 64) n *= 2;
    if (n * ept > 64) return 0;
    uint32_t kp = ATTN_DEC_WG / t;
    /* its shared memory: the key groups' (max, sum, acc[d]), the splits' (max, sum), red4 */
    if (4u * (kp * n * ((uint32_t)d + 2) + 2 * n * ATTN_DEC_MAXS + n + 4 * ATTN_DEC_WG + 1) >
        b->max_shared)
        return 0;
    *tpk = t;
    *bq = n;
    return 1;
}

/* An attention's dispatch but for its bindings (and their offsets), and its key splits. */
typedef struct attn_plan {
    vk_dispatch x;
    int dec; /* attn_decode.comp */
    uint32_t qblocks, nsplit;
    VkDeviceSize part_bytes; /* the splits' partials (0: no splits) */
} attn_plan;

static void attn_plan_make(lmh_backend *b, const lmh_op *op, attn_plan *pl) {
    const lmh_tensor *q = op->src[0], *K = op->src[1], *V = op->src[2];
    int64_t n = q->ne[0], heads = q->ne[1], d = q->ne[2], kvh = K->ne[1], dv = V->ne[2];
    int64_t group = heads / kvh, nq = n * group;
    int32_t n_kv = op->p.i[0];
    uint32_t tpk, dbq;
    int dec = attn_decode_shape(b, op, &tpk, &dbq);
    /* prefill on the matrix cores where they run the products (attn_coop.comp: no key
     * splits, so only where the queries alone give enough workgroups) */
    int coop = b->attn_coop && !dec && d == dv && d % 16 == 0 && d <= 128 &&
               cdiv((uint64_t)nq, ATTN_COOP_BQ) * (uint64_t)kvh >= ATTN_COOP_MIN_WGS &&
               VT(q)->off % 16 == 0 && VT(K)->off % 16 == 0 && VT(V)->off % 16 == 0;
    uint32_t dpt = cdiv((uint64_t)dv, ATTN_WG), bq = dec ? dbq : attn_bq_max(b, d, dv);
    if (!dpt) dpt = 1;
    while (bq > 1 && bq / 2 >= nq) bq /= 2;
    if (coop) bq = ATTN_COOP_BQ;
    uint32_t qblocks = cdiv((uint64_t)nq, bq);
    /* split the keys when the queries alone give the device too few workgroups: into
     * tiles of ATTN_WG keys for attention.comp; for attn_decode.comp into at least a key
     * per key group and ATTN_DEC_MAXS splits at most */
    uint32_t unit = dec ? ATTN_DEC_WG / tpk : ATTN_WG, most = UINT32_MAX;
    if (dec) /* and its last split weighs every split's partials a thread each */
        most = ATTN_DEC_MAXS < ATTN_DEC_WG / bq ? ATTN_DEC_MAXS : ATTN_DEC_WG / bq;
    uint32_t tiles = cdiv((uint64_t)n_kv, unit), nsplit = 1, chunk_tiles = tiles ? tiles : 1;
    uint64_t wgs = (uint64_t)qblocks * (uint64_t)kvh;
    /* attn_decode's workgroups do more each: by default half as many (256 on a GPU, about
     * two an SM of an H100, measured best there at 512 and 8K keys, against 128 and 512) */
    uint32_t target = dec ? b->attn_dec_wgs : b->attn_target_wgs;
    if (!coop && tiles > 1 && wgs < target && wgs <= b->attn_target_wgs /* the counters' room */) {
        nsplit = cdiv(target, wgs);
        if (nsplit > tiles) nsplit = tiles;
        if (nsplit > most) nsplit = most;
        chunk_tiles = cdiv(tiles, nsplit);
        nsplit = cdiv(tiles, chunk_tiles);
    }
    uint32_t kch = K->dtype == LMH_F32 ? 4 : 8;
    int kvec = d % kch == 0 && VT(K)->off % 16 == 0;
    /* K chunks loaded together: the most that divides a row's chunks */
    uint32_t ku = b->attn_ku < (uint32_t)d / kch ? b->attn_ku : (uint32_t)d / kch;
    while (ku > 1 && ((uint32_t)d / kch) % ku) ku--;
    vk_dispatch x = {.shader = VK_SH_ATTENTION,
                     .spec = {ATTN_WG, dtc(K->dtype), dtc(V->dtype), bq, (uint32_t)d, dpt,
                              (uint32_t)kvec, kvec ? ku : 1, b->attn_vu}};
    if (coop)
        x = (vk_dispatch){.shader = VK_SH_ATTN_COOP,
                          .spec = {ATTN_COOP_WG, dtc(K->dtype), dtc(V->dtype), 0, (uint32_t)d}};
    if (dec)
        x = (vk_dispatch){.shader = VK_SH_ATTN_DECODE,
                          .spec = {ATTN_DEC_WG, dtc(K->dtype), dtc(V->dtype), bq, (uint32_t)d, tpk,
                                   b->attn_dec_ku}};
    x.pc[5] = (uint32_t)nq;
    x.pc[6] = (uint32_t)heads;
    x.pc[7] = (uint32_t)kvh;
    x.pc[8] = (uint32_t)group;
    x.pc[9] = (uint32_t)dv;
    x.pc[10] = (uint32_t)n_kv;
    x.pc[11] = (uint32_t)op->p.i[1];
    x.pc[12] = (uint32_t)op->p.i[2];
    x.pc[13] = (uint32_t)op->p.i[3];
    x.pc[14] = (uint32_t)op->p.i[4];
    x.pc[15] = chunk_tiles * unit;
    x.pc[16] = nsplit;
    x.pc[17] = fbits(op->p.f[0]);
    x.pc[18] = fbits(op->p.f[1]);
    /* pc[19]: the counters' offset (the caller's); pc[20]: the sinks' (ABI 1.10), 1 + it */
    const lmh_tensor *sinks = lmh_op_attn_sinks(op);
    x.bind[7] = sinks ? VT(sinks) : NULL;
    x.pc[20] = sinks ? 1 + vk_elem_off(b, VT(sinks)) : 0;
    x.groups[0] = qblocks;
    x.groups[1] = (uint32_t)kvh;
    x.groups[2] = nsplit;
    pl->x = x;
    pl->dec = dec;
    pl->qblocks = qblocks;
    pl->nsplit = nsplit;
    /* a split's (max, sum, acc[dv]); attn_decode.comp puts acc 16-byte aligned */
    pl->part_bytes =
        nsplit > 1 ? (VkDeviceSize)(n * heads) * nsplit * (VkDeviceSize)(dv + (dec ? 4 : 2)) * 4
                   : 0;
}

/* The next set of split counters (attn_target_wgs of them, zero at rest). */
static vk_tensor *attn_counters(lmh_backend *b) {
    return b->attn_slot[b->attn_next++ % VK_ATTN_CNT_SLOTS];
}

static int op_attention(lmh_backend *b, const lmh_op *op) {
    attn_plan pl;
    attn_plan_make(b, op, &pl);
    vk_dispatch x = pl.x; /* the sinks bound (7) by the plan */
    x.bind[0] = VT(op->dst);
    x.bind[1] = VT(op->src[0]);
    x.bind[2] = VT(op->src[1]);
    x.bind[3] = VT(op->src[2]);
    x.bind[4] = VT(op->src[3]);
    /* The split counters: a set of its own (wgs <= attn_target_wgs, what a set holds), and
     * without splits the partials' binding there too: the shaders declare both, so bound
     * to a shared dummy they would make consecutive attentions (batched decode's sequences)
     * look dependent to the validation layer. */
    vk_tensor *part = NULL, *cnt = attn_counters(b);
    x.bind[5] = x.bind[6] = cnt;
    x.writes = 1u | 1u << 5 | 1u << 6;
    x.pc[19] = vk_elem_off(b, cnt);
    if (pl.part_bytes) {
        part = vk_scratch(b, pl.part_bytes);
        if (!part) return LMH_ENOMEM;
        x.bind[5] = part;
    }
    int rc = vk_record(b, &x);
    vk_tensor_release(b, part);
    return rc;
}

/* ---- decode attention of several sequences in one dispatch --------------------------- */

/* A sequence's entry in attn_decode.comp's table (SEQS): the addresses of q, dst, K, V and
 * the positions (two words each, low first), then n_kv, kv0, ring, total, chunk, nsplit,
 * its partials' word offset, its first counter and the splits a workgroup takes in turn. */
#define SEQ_WORDS 20

/* Sequences a dispatch: each takes K/V-heads counters of a set. */
static int attn_seqs_per_dispatch(const lmh_backend *b, uint32_t kvh) {
    uint32_t n = kvh ? b->attn_target_wgs / kvh : 0, most = 65536 / (SEQ_WORDS * 4);
    return (int)(n < most ? n : most);
}

int vk_seq_key(lmh_backend *b, const lmh_op *op, uint32_t key[VK_SEQ_KEY]) {
    memset(key, 0, VK_SEQ_KEY * sizeof *key);
    if (!b->seq_attn) return 0;
    key[0] = (uint32_t)op->code;
    if (op->code == LMH_OP_COPY) { /* one pipeline a pair of dtypes */
        key[1] = (uint32_t)op->src[0]->dtype;
        key[2] = (uint32_t)op->dst->dtype;
        return copy_seq_ok(op);
    }
    if (op->code != LMH_OP_ATTENTION) return 0;
    attn_plan pl;
    attn_plan_make(b, op, &pl);
    if (!pl.dec || pl.qblocks != 1 || attn_seqs_per_dispatch(b, pl.x.groups[1]) < 2) return 0;
    const lmh_tensor *ts[5] = {op->dst, op->src[0], op->src[1], op->src[2], op->src[3]};
    for (int i = 0; i < 5; i++)
        if (!vk_addr(VT(ts[i])) || VT(ts[i])->off % 4) return 0;
    /* one pipeline; the same heads, group, dims, window, scale and soft cap */
    static const int same_pc[8] = {5, 6, 7, 8, 9, 12, 17, 18};
    memcpy(key + 1, pl.x.spec, sizeof pl.x.spec);
    for (int i = 0; i < 8; i++) key[1 + VK_NSPEC + i] = pl.x.pc[same_pc[i]];
    /* and the same sinks (one binding for all): their memory and offset */
    const lmh_tensor *sinks = lmh_op_attn_sinks(op);
    if (sinks) {
        uint64_t a = (uint64_t)(uintptr_t)VT(sinks)->a;
        key[1 + VK_NSPEC + 8] = 1;
        key[1 + VK_NSPEC + 9] = (uint32_t)a;
        key[1 + VK_NSPEC + 10] = (uint32_t)(a >> 32);
        key[1 + VK_NSPEC + 11] = (uint32_t)VT(sinks)->off;
    }
    return 1;
}

/* One dispatch for ops[0..m) (2 <= m <= attn_seqs_per_dispatch): each sequence's
 * workgroups are those its own dispatch would have, its key splits included. */
static int attn_seqs_dispatch(lmh_backend *b, const lmh_op *ops, int m) {
    void *map = NULL;
    vk_tensor *tt = vk_args(b, (size_t)m * SEQ_WORDS * 4, &map), *part = NULL;
    uint32_t *tab = map;
    const vk_tensor **xrd = malloc((size_t)m * 4 * sizeof *xrd);
    const vk_tensor **xwr = malloc((size_t)m * sizeof *xwr);
    vk_tensor *cnt = attn_counters(b);
    attn_plan pl, p0 = {0};
    VkDeviceSize part_bytes = 0;
    uint64_t split_wgs = 0;
    uint32_t nsplit_max = 1;
    int rc = tab && xrd && xwr && tt ? LMH_OK : LMH_ENOMEM;
    for (int j = 0; j < m && rc == LMH_OK; j++) {
        const lmh_op *op = &ops[j];
        attn_plan_make(b, op, &pl);
        if (j == 0) p0 = pl;
        uint32_t *e = tab + (size_t)j * SEQ_WORDS;
        put_addr(e + 0, op->src[0]);
        put_addr(e + 2, op->dst);
        put_addr(e + 4, op->src[1]);
        put_addr(e + 6, op->src[2]);
        put_addr(e + 8, op->src[3]);
        e[10] = pl.x.pc[10]; /* n_kv */
        e[11] = pl.x.pc[11]; /* kv0 */
        e[12] = pl.x.pc[13]; /* ring */
        e[13] = pl.x.pc[14]; /* total */
        e[14] = pl.x.pc[15]; /* chunk */
        e[15] = pl.nsplit;
        e[16] = (uint32_t)(part_bytes / 4);
        e[17] = vk_elem_off(b, cnt) + (uint32_t)j * pl.x.groups[1];
        part_bytes += pl.part_bytes;
        split_wgs += (uint64_t)pl.nsplit * pl.x.groups[1];
        if (pl.nsplit > nsplit_max) nsplit_max = pl.nsplit;
        for (int k = 0; k < 4; k++) xrd[4 * j + k] = VT(op->src[k]);
        xwr[j] = VT(op->dst);
    }
    if (rc == LMH_OK && part_bytes && !(part = vk_scratch(b, part_bytes))) rc = LMH_ENOMEM;
    if (rc == LMH_OK && part && vk_elem_off(b, part))
        for (int j = 0; j < m; j++) tab[(size_t)j * SEQ_WORDS + 16] += vk_elem_off(b, part);
    /* A split is a few dozen keys at 512 context: as workgroups of their own, thousands a
     * dispatch at 64 sequences, each mostly fixed cost. Past attn_seq_wgs workgroups, each
     * takes several splits of its sequence in turn (computed as before: the same bits). */
    uint32_t per = (uint32_t)(split_wgs / b->attn_seq_wgs);
    if (per < 1) per = 1;
    if (per > nsplit_max) per = nsplit_max;
    if (rc == LMH_OK) {
        for (int j = 0; j < m; j++) tab[(size_t)j * SEQ_WORDS + 18] = per;
        vk_dispatch x = p0.x;
        x.shader = VK_SH_ATTN_DECODE_SEQS;
        x.bind[1] = tt;
        x.bind[5] = part ? part : cnt;
        x.bind[6] = cnt;
        x.writes = 1u << 5 | 1u << 6;
        x.xrd = xrd;
        x.nxrd = 4 * m;
        x.xwr = xwr;
        x.nxwr = m;
        x.groups[0] = (uint32_t)m;
        x.groups[2] = cdiv(nsplit_max, per);
        rc = vk_record(b, &x);
    }
    vk_tensor_release(b, tt);
    vk_tensor_release(b, part);
    free(xrd);
    free(xwr);
    return rc;
}

int vk_attention_seqs(lmh_backend *b, const lmh_op *ops, int n) {
    int per = attn_seqs_per_dispatch(b, (uint32_t)ops[0].src[1]->ne[1]), rc = LMH_OK;
    for (int i = 0; i < n && rc == LMH_OK; i += per) {
        int m = n - i < per ? n - i : per;
        rc = m == 1 ? op_attention(b, &ops[i]) : attn_seqs_dispatch(b, ops + i, m);
    }
    return rc;
}

static int op_moe_route(lmh_backend *b, const lmh_op *op) {
    const lmh_tensor *a = op->src[0];
    vk_dispatch x = {.shader = VK_SH_MOE_ROUTE, .spec = {64}, .writes = 1 | 1u << 2};
    x.bind[0] = VT(op->dst);
    x.bind[1] = VT(a);
    x.bind[2] = VT(op->src[1]);
    x.bind[3] = op->src[2] ? VT(op->src[2]) : NULL; /* (ABI 1.11) experts a row uses */
    x.pc[5] = (uint32_t)a->ne[0];
    x.pc[6] = (uint32_t)a->ne[1];
    x.pc[7] = (uint32_t)op->p.i[0];
    x.pc[8] = op->p.i[1] != 0;
    x.pc[9] = op->src[2] != NULL;
    grid(&x, (uint64_t)a->ne[0]); /* a workgroup a row */
    return vk_record(b, &x);
}

/* Groups the (row, slot) pairs by expert on the device (moe_sort.comp), then runs one
 * indirect dispatch over the work items it made: matrix-vector for a few rows (each
 * expert's weights read once per item of up to 4 rows), tiled otherwise. */
static int op_moe_matmul(lmh_backend *b, const lmh_op *op) {
    const lmh_tensor *xt = op->src[0], *W = op->src[1], *ids = op->src[2];
    int64_t n = ids->ne[0], k = ids->ne[1], E = W->ne[0], out = W->ne[1], in = W->ne[2];
    int64_t pairs = n * k;
    int mv = n <= MATVEC_MAXR;
    uint32_t item_rows = mv ? MATVEC_MAXR : 64;
    uint32_t list_at = 4, items_at = 4 + (uint32_t)pairs;
    vk_tensor *s = vk_scratch(b, (VkDeviceSize)(4 + 4 * pairs) * 4);
    if (!s) return LMH_ENOMEM;
    const vk_tensor *stats = NULL;
    uint64_t per_expert = VT(W)->a->weight ? (uint64_t)out * row_bytes(W) : 0;
    int slot = vk_moe_slot(b, per_expert, &stats);
    if (slot < 0) {
        vk_tensor_release(b, s);
        return LMH_ENOMEM;
    }
    vk_dispatch so = {.shader = VK_SH_MOE_SORT,
                      .spec = {256, (uint32_t)((E + 63) / 64 * 64)},
                      .writes = 1 | 1u << 5 | 1u << 6,
                      .groups = {1, 1, 1}};
    so.bind[0] = VT(op->dst);
    so.bind[3] = VT(ids);
    so.bind[5] = s;
    so.bind[6] = stats;
    so.pc[5] = (uint32_t)pairs;
    so.pc[6] = (uint32_t)E;
    so.pc[7] = item_rows;
    uint32_t nr = lmh_dtype_is_packed(W->dtype) ? QMATVEC_NR : MATVEC_NR;
    so.pc[8] = mv ? cdiv((uint64_t)out, nr) : cdiv((uint64_t)out, 64);
    so.pc[9] = list_at;
    so.pc[10] = items_at;
    so.pc[11] = (uint32_t)slot;
    so.pc[12] = (uint32_t)out;
    int rc = vk_record(b, &so);
    if (rc == LMH_OK) {
        vk_dispatch x = {.writes = 1, .indirect = s};
        x.bind[0] = VT(op->dst);
        x.bind[1] = VT(xt);
        x.bind[2] = VT(W);
        x.bind[5] = s;
        x.pc[5] = (uint32_t)in;
        x.pc[6] = (uint32_t)out;
        x.pc[10] = (uint32_t)k;
        x.pc[11] = xt->ndim == 3;
        x.pc[12] = list_at;
        x.pc[13] = items_at;
        int quant = lmh_dtype_is_packed(W->dtype);
        if (quant) quant_args(&x, W);
        if (mv && quant) {
            x.shader = VK_SH_QMATVEC_MOE;
            x.spec[0] = MATVEC_WG;
            x.spec[1] = QMATVEC_NR;
            x.spec[9] = qchunks_aligned(W);
            x.spec[3] = (uint32_t)vec_ok(xt, in);
        } else if (quant) {
            x.shader = VK_SH_QMATMUL_MOE;
            x.spec[0] = 256;
        } else if (mv) {
            x.shader = VK_SH_MATVEC_MOE;
            x.spec[0] = MATVEC_WG;
            x.spec[1] = MATVEC_NR;
            x.spec[2] = dtc(W->dtype);
            x.spec[3] = (uint32_t)(vec_ok(W, in) && vec_ok(xt, in));
        } else {
            x.shader = VK_SH_MATMUL_MOE;
            x.spec[0] = 256;
            x.spec[2] = dtc(W->dtype);
        }
        rc = vk_record(b, &x);
    }
    vk_tensor_release(b, s);
    return rc;
}

static int op_moe_combine(lmh_backend *b, const lmh_op *op) {
    const lmh_tensor *y = op->src[0];
    int64_t n = y->ne[0], k = y->ne[1], d = y->ne[2];
    vk_dispatch x = {.shader = VK_SH_MOE_COMBINE, .spec = {256}, .writes = 1};
    x.bind[0] = VT(op->dst);
    x.bind[1] = VT(y);
    x.bind[2] = VT(op->src[1]);
    x.pc[5] = (uint32_t)(n * d);
    x.pc[6] = (uint32_t)d;
    x.pc[7] = (uint32_t)k;
    grid(&x, cdiv((uint64_t)(n * d), 256));
    return vk_record(b, &x);
}

/* ---- ABI 1.7: columns and the recurrent ops ----------------------------------------- */

static int op_cols(lmh_backend *b, const lmh_op *op) {
    const lmh_tensor *a = op->src[0], *idx = op->src[1];
    int64_t n = lmh_nelem(op->dst);
    vk_dispatch x = {.shader = VK_SH_COLS, .spec = {256}, .writes = 1};
    x.bind[0] = VT(op->dst);
    x.bind[1] = VT(a);
    x.bind[2] = idx ? VT(idx) : NULL;
    x.pc[5] = (uint32_t)n;
    x.pc[6] = (uint32_t)lmh_inner(op->dst);
    x.pc[7] = (uint32_t)lmh_inner(a);
    x.pc[8] = (uint32_t)op->p.i[0];
    x.pc[9] = idx != NULL;
    grid(&x, cdiv((uint64_t)n, 256));
    return vk_record(b, &x);
}

/* Operand i (4..7) of a recurrent op at binding i + 1 (5..8), its element offset in push
 * constant word i + 1 (the shaders' oC/oB.., oD/oA.., oT, oS): record() fills in those of
 * bindings 0..4 only. */
static void bind_more(lmh_backend *b, vk_dispatch *x, const lmh_op *op, int i) {
    if (i < LMH_OP_MAX_SRC || i >= LMH_OP_MAX_OPERANDS) return;
    const lmh_tensor *t = lmh_op_src(op, i);
    x->bind[i + 1] = t ? VT(t) : NULL;
    x->pc[i + 1] = t ? vk_elem_off(b, VT(t)) : 0;
}

/* The state is read and written by the same dispatch: it is bound as written, which the
 * hazard tracking takes as both (record(): a write waits for earlier reads and writes, and
 * later reads and writes wait for it). */
static int op_conv1d(lmh_backend *b, const lmh_op *op) {
    const lmh_tensor *xt = op->src[0], *w = op->src[1], *bias = op->src[2], *st = op->src[3];
    int64_t C = lmh_inner(xt), n = lmh_nelem(xt) / C, K = lmh_inner(w), S = K - 1;
    vk_dispatch x = {.shader = VK_SH_CONV1D, .spec = {64, 0}, .writes = 1u | 1u << 4};
    x.bind[0] = VT(op->dst);
    x.bind[1] = VT(xt);
    x.bind[2] = VT(w);
    x.bind[3] = bias ? VT(bias) : NULL;
    x.bind[4] = VT(st);
    x.pc[5] = (uint32_t)n;
    x.pc[6] = (uint32_t)C;
    x.pc[7] = (uint32_t)K;
    x.pc[8] = bias != NULL;
    x.pc[9] = dtc(w->dtype);
    x.pc[10] = bias ? dtc(bias->dtype) : 0;
    x.pc[11] = (uint32_t)op->p.i[0];
    if (n <= CONV_ROWS || n < S) { /* a thread a channel, state rewritten after its reads */
        grid(&x, cdiv((uint64_t)C, 64));
        return vk_record(b, &x);
    }
    /* a thread an output, then (the state's reads done: a barrier) the new state from x */
    x.spec[0] = 256;
    x.spec[1] = 1;
    grid(&x, cdiv((uint64_t)(n * C), 256));
    int rc = vk_record(b, &x);
    if (rc) return rc;
    x.spec[1] = 2;
    grid(&x, cdiv((uint64_t)(S * C), 256));
    return vk_record(b, &x);
}

/* Lanes a channel (a power of two up to `most`) and states a lane for N states: as few lanes
 * as hold SCAN_SPT states each, so that a workgroup takes many channels (its fixed costs,
 * barriers above all, shared by more); *global where even `most` lanes would hold more (the
 * states then stay in memory). */
static void lanes_for(int64_t N, uint32_t most, uint32_t *lpc, uint32_t *spt, int *global) {
    uint32_t l = 1;
    while ((uint64_t)l * SCAN_SPT < (uint64_t)N && l < most) l *= 2;
    uint64_t k = cdiv((uint64_t)N, l);
    *lpc = l;
    *spt = k ? (uint32_t)k : 1;
    *global = k > SCAN_SPT;
}

/* The scans' weights: dtypes and presence (words 16..20 of scan.comp's and ssd_chunk.comp's
 * push constants), and Mamba-2's d bounds (21..23). */
static void scan_params(vk_dispatch *x, const lmh_op *op) {
    const lmh_tensor *D = op->src_more[1], *dtb = op->src_more[2];
    x->pc[16] = D != NULL;
    x->pc[17] = dtb != NULL;
    x->pc[18] = dtc(op->src[2]->dtype);
    x->pc[19] = D ? dtc(D->dtype) : 0;
    x->pc[20] = dtb ? dtc(dtb->dtype) : 0;
    if (op->code == LMH_OP_SSD_SCAN) {
        x->pc[21] = fbits(op->p.f[0]);
        x->pc[22] = fbits(op->p.f[1]);
        x->pc[23] = op->p.f[1] > 0;
    }
}

/* SSM_SCAN, and SSD_SCAN row by row (scan.comp): a channel's states over lanes. */
static int op_scan(lmh_backend *b, const lmh_op *op) {
    int ssd = op->code == LMH_OP_SSD_SCAN;
    const lmh_tensor *d = op->dst;
    int64_t n = d->ne[0], nch = lmh_inner(d), H = ssd ? op->p.i[0] : nch, G = ssd ? op->p.i[1] : 1;
    int64_t N = lmh_inner(op->src[3]) / G;
    uint32_t lpc, spt;
    int global;
    lanes_for(N, SCAN_WG, &lpc, &spt, &global);
    /* a GPU wants workgroups for its cores: more lanes a channel where the channels alone
     * give few (Mamba-1's 5120 channels of 16 states: 80 workgroups of 8 states a lane made
     * a 512-row scan 2.3x slower than 640 of 1, H200); a CPU device wants few */
    if (b->props.deviceType != VK_PHYSICAL_DEVICE_TYPE_CPU)
        while (!global && lpc < 32 && lpc < N &&
               cdiv((uint64_t)nch, SCAN_WG / lpc) < SCAN_MIN_WGS) {
            lpc *= 2;
            spt = (uint32_t)cdiv((uint64_t)N, lpc);
        }
    vk_dispatch x = {
        .shader = VK_SH_SCAN,
        .spec = {SCAN_WG, lpc, global ? 1 : spt, (uint32_t)ssd, (uint32_t)global, SCAN_TB},
        .writes = 1u | 1u << 8};
    x.bind[0] = VT(d);
    for (int i = 0; i < 4; i++) x.bind[1 + i] = VT(op->src[i]);
    for (int i = 4; i < 8; i++) bind_more(b, &x, op, i);
    x.pc[9] = (uint32_t)n;
    x.pc[10] = (uint32_t)nch;
    x.pc[11] = (uint32_t)N;
    x.pc[12] = (uint32_t)(nch / H);
    x.pc[13] = (uint32_t)H;
    x.pc[14] = (uint32_t)G;
    x.pc[15] = spt;
    scan_params(&x, op);
    grid(&x, cdiv((uint64_t)nch, SCAN_WG / lpc));
    return vk_record(b, &x);
}

/* A chunked scan's passes: chunks of CHUNK_L rows, `seg` of them a pass (the scratch's
 * `bytes` hold one pass); the delta rule's `per` scratch words a (chunk, head) and `cb`
 * columns of S a workgroup. */
typedef struct chunk_plan {
    uint32_t nchunks, seg, per, cb;
    VkDeviceSize bytes;
} chunk_plan;

/* Whether an op of n rows runs chunked, with `per_chunk` scratch words a chunk and `smem`
 * bytes of shared memory: from b->scan_chunk rows (0: never), where the device has the shared
 * memory and the scratch of a chunk can be bound (else row by row: never refused). */
static int plan_chunks(const lmh_backend *b, int64_t n, uint64_t per_chunk, uint32_t smem,
                       chunk_plan *pl) {
    if (!b->scan_chunk || n < (int64_t)b->scan_chunk || smem > b->max_shared) return 0;
    uint64_t nch = cdiv((uint64_t)n, CHUNK_L), bytes = per_chunk * 4;
    uint64_t seg = bytes <= SCAN_SCRATCH ? SCAN_SCRATCH / bytes : 1;
    if (b->scan_seg && seg > b->scan_seg) seg = b->scan_seg;
    if (seg > nch) seg = nch;
    /* scratch words indexed in 32 bits, bound whole */
    if (seg * bytes > b->max_range || seg * per_chunk >= ((uint64_t)1 << 31)) return 0;
    pl->nchunks = (uint32_t)nch;
    pl->seg = (uint32_t)seg;
    pl->bytes = (VkDeviceSize)(seg * bytes);
    return 1;
}

/* The chunked scans' scratch: one buffer kept, grown to the most asked (consecutive scans
 * depend on each other anyway; the hazard tracking orders its reuse). */
static vk_tensor *scan_room(lmh_backend *b, VkDeviceSize bytes) {
    if (b->scan_room && b->scan_room->bytes >= bytes) return b->scan_room;
    vk_tensor_release(b, b->scan_room); /* freed once the work recorded on it has run */
    return b->scan_room = vk_scratch(b, bytes);
}

static int ssd_plan(const lmh_backend *b, const lmh_op *op, chunk_plan *pl) {
    int64_t H = op->p.i[0], P = lmh_inner(op->dst) / H, N = lmh_inner(op->src[3]) / op->p.i[1];
    /* ssd_chunk.comp's OUT: d, cum, M, and its tiles */
    uint32_t smem = (2 * CHUNK_L + CHUNK_L * (CHUNK_L + 1) + 3 * CHUNK_L * 17) * 4;
    return (uint64_t)P * (uint64_t)N < ((uint64_t)1 << 31) &&
           plan_chunks(b, op->dst->ne[0], (uint64_t)H * (2 * CHUNK_L + (uint64_t)(P * N)), smem,
                       pl);
}

/* SSD_SCAN chunked (ssd_chunk.comp): a pass's chunks' states (a workgroup a 64 x 64 block
 * of a head's), the states passed along the chunks into the state operand, the outputs (a
 * workgroup 64 channels of a head); pass after pass. */
static int op_ssd_chunked(lmh_backend *b, const lmh_op *op, const chunk_plan *pl) {
    const lmh_tensor *d = op->dst;
    int64_t n = d->ne[0], H = op->p.i[0], G = op->p.i[1], P = lmh_inner(d) / H;
    int64_t N = lmh_inner(op->src[3]) / G;
    vk_tensor *scr = scan_room(b, pl->bytes);
    if (!scr) return LMH_ENOMEM;
    vk_dispatch x = {.spec = {CHUNK_WG}};
    x.pc[9] = (uint32_t)n;
    x.pc[12] = (uint32_t)H;
    x.pc[13] = (uint32_t)P;
    x.pc[14] = (uint32_t)G;
    x.pc[15] = (uint32_t)N;
    scan_params(&x, op);
    x.pc[24] = (uint32_t)(pl->seg * H * 2 * CHUNK_L); /* CS after DC */
    int rc = LMH_OK;
    for (uint32_t c0 = 0; c0 < pl->nchunks && !rc; c0 += pl->seg) {
        uint32_t nc = pl->nchunks - c0 < pl->seg ? pl->nchunks - c0 : pl->seg;
        x.pc[10] = c0 * CHUNK_L;
        x.pc[11] = nc;
        vk_dispatch s = x; /* the chunks' own states */
        s.shader = VK_SH_SSD_STATES;
        s.writes = 1;
        s.bind[0] = scr;
        for (int i = 0; i < 4; i++) s.bind[1 + i] = VT(op->src[i]);
        bind_more(b, &s, op, 6); /* dt_bias */
        grid(&s, (uint64_t)nc * H * cdiv((uint64_t)P, 64) * cdiv((uint64_t)N, 64));
        rc = vk_record(b, &s);
        vk_dispatch p = x; /* along the chunks */
        p.shader = VK_SH_SSD_PASS;
        p.writes = 1u | 1u << 8;
        p.bind[0] = scr;
        bind_more(b, &p, op, 7);
        grid(&p, cdiv((uint64_t)(H * P * N), CHUNK_WG));
        if (!rc) rc = vk_record(b, &p);
        vk_dispatch o = x; /* the outputs */
        o.shader = VK_SH_SSD_OUT;
        o.writes = 1;
        o.bind[0] = VT(d);
        o.bind[1] = VT(op->src[0]);
        o.bind[2] = scr;
        o.bind[4] = VT(op->src[3]);
        bind_more(b, &o, op, 4);
        bind_more(b, &o, op, 5);
        grid(&o, (uint64_t)nc * H * cdiv((uint64_t)P, 64));
        if (!rc) rc = vk_record(b, &o);
    }
    return rc;
}

/* The delta rule's flags, scales and weights' dtypes: push constant words 14 + at .. 19 + at
 * (delta.comp: at = 0; delta_chunk.comp: at = 2). */
static void delta_params(vk_dispatch *x, const lmh_op *op, int at) {
    const lmh_tensor *dtb = op->src_more[2];
    x->pc[14 + at] = (uint32_t)op->p.i[0];
    x->pc[15 + at] = fbits(op->p.f[1]);
    x->pc[16 + at] = fbits(op->p.f[0]);
    x->pc[17 + at] = dtb != NULL;
    x->pc[18 + at] = dtc(op->src_more[1]->dtype);
    x->pc[19 + at] = dtb ? dtc(dtb->dtype) : 0;
}

/* DELTA_RULE row by row (delta.comp): a column of a head's state over lanes. */
static int op_delta(lmh_backend *b, const lmh_op *op) {
    const lmh_tensor *q = op->src[0], *v = op->src[2];
    int64_t n = q->ne[0], Hk = q->ne[1], dk = q->ne[2], Hv = v->ne[1], dv = v->ne[2];
    /* lanes a column: up to 16 rows of S a lane, in registers (dk <= 1024: 64 lanes at
     * most), so that a workgroup takes many columns and redoes q's and k's norms for fewer */
    uint32_t lpc = 1;
    while (lpc * DELTA_SPT < dk) lpc *= 2;
    uint32_t spt = dk ? cdiv((uint64_t)dk, lpc) : 1;
    uint32_t cpw = SCAN_WG / lpc, cblocks = cdiv((uint64_t)dv, cpw);
    uint32_t maxdk = (uint32_t)(dk > 32 ? (dk + 31) / 32 * 32 : 32);
    vk_dispatch x = {
        .shader = VK_SH_DELTA, .spec = {SCAN_WG, lpc, spt, maxdk}, .writes = 1u | 1u << 8};
    x.bind[0] = VT(op->dst);
    for (int i = 0; i < 4; i++) x.bind[1 + i] = VT(op->src[i]);
    for (int i = 4; i < 8; i++) bind_more(b, &x, op, i);
    x.pc[9] = (uint32_t)n;
    x.pc[10] = (uint32_t)Hk;
    x.pc[11] = (uint32_t)Hv;
    x.pc[12] = (uint32_t)dk;
    x.pc[13] = (uint32_t)dv;
    delta_params(&x, op, 0);
    x.pc[20] = cblocks;
    grid(&x, (uint64_t)Hv * cblocks);
    return vk_record(b, &x);
}

static int delta_plan(const lmh_backend *b, const lmh_op *op, chunk_plan *pl) {
    const lmh_tensor *q = op->src[0], *v = op->src[2];
    int64_t dk = q->ne[2], Hv = v->ne[1], dv = v->ne[2];
    /* SEQ keeps 16 columns of S in shared memory (dk <= 256: within the 32 KB lavapipe has;
     * longer keys run row by row), with v_new and a tile; PREP T, 4 vectors and two tiles */
    uint32_t seq = (uint32_t)((dk * DELTA_CB + CHUNK_L * DELTA_CB + 2 * CHUNK_L * 17) * 4);
    uint32_t prep = (4 * CHUNK_L + CHUNK_L * (CHUNK_L + 1) + 2 * CHUNK_L * 17) * 4;
    if (dk < 1 || dk > 256) return 0;
    pl->per = (uint32_t)(CHUNK_L * (dv + 3 * dk) + CHUNK_L * CHUNK_L + 4);
    pl->cb = DELTA_CB;
    return plan_chunks(b, q->ne[0], (uint64_t)Hv * pl->per, seq > prep ? seq : prep, pl);
}

/* DELTA_RULE chunked (delta_chunk.comp): a pass's chunks in their WY form, then the chunks
 * in order; pass after pass. */
static int op_delta_chunked(lmh_backend *b, const lmh_op *op, const chunk_plan *pl) {
    const lmh_tensor *q = op->src[0], *v = op->src[2];
    int64_t n = q->ne[0], Hk = q->ne[1], dk = q->ne[2], Hv = v->ne[1], dv = v->ne[2];
    vk_tensor *scr = scan_room(b, pl->bytes);
    if (!scr) return LMH_ENOMEM;
    uint32_t cblocks = cdiv((uint64_t)dv, pl->cb);
    vk_dispatch x = {.spec = {CHUNK_WG, (uint32_t)dk * pl->cb}};
    x.pc[9] = (uint32_t)n;
    x.pc[12] = (uint32_t)Hk;
    x.pc[13] = (uint32_t)Hv;
    x.pc[14] = (uint32_t)dk;
    x.pc[15] = (uint32_t)dv;
    delta_params(&x, op, 2);
    x.pc[22] = pl->per;
    x.pc[23] = cblocks;
    int rc = LMH_OK;
    for (uint32_t c0 = 0; c0 < pl->nchunks && !rc; c0 += pl->seg) {
        uint32_t nc = pl->nchunks - c0 < pl->seg ? pl->nchunks - c0 : pl->seg;
        x.pc[10] = c0 * CHUNK_L;
        x.pc[11] = nc;
        vk_dispatch p = x; /* each chunk's WY form (SEQ's size not its: one pipeline) */
        p.shader = VK_SH_DELTA_PREP;
        p.spec[1] = 0;
        p.writes = 1;
        p.bind[0] = scr;
        for (int i = 0; i < 4; i++) p.bind[1 + i] = VT(op->src[i]);
        for (int i = 4; i < 7; i++) bind_more(b, &p, op, i);
        grid(&p, (uint64_t)nc * Hv);
        rc = vk_record(b, &p);
        vk_dispatch s = x; /* the chunks in order, CB columns of S a workgroup */
        s.shader = VK_SH_DELTA_SEQ;
        s.writes = 1u | 1u << 8;
        s.bind[0] = VT(op->dst);
        s.bind[1] = scr;
        bind_more(b, &s, op, 7);
        grid(&s, (uint64_t)Hv * cblocks);
        if (!rc) rc = vk_record(b, &s);
    }
    return rc;
}

int vk_enqueue_op(lmh_backend *b, const lmh_op *op) {
    if (lmh_nelem(op->dst) == 0) return LMH_OK; /* nothing to write */
    switch (op->code) {
    case LMH_OP_GET_ROWS:
        return op_get_rows(b, op);
    case LMH_OP_MATMUL:
        return op_matmul(b, op);
    case LMH_OP_RMS_NORM:
        return vk_rms_norm(b, op, NULL, NULL, NULL);
    case LMH_OP_ADD:
    case LMH_OP_MUL:
    case LMH_OP_SCALE:
    case LMH_OP_SWIGLU:
    case LMH_OP_GEGLU:
    case LMH_OP_SOFTCAP:
    case LMH_OP_SIGMOID_GATE:
    case LMH_OP_SWIGLU_OAI:
        return op_eltwise(b, op);
    case LMH_OP_ROPE:
    case LMH_OP_ROPE_SWITCH:
        return op_rope(b, op);
    case LMH_OP_COPY:
        return op_copy(b, op);
    case LMH_OP_TRANSPOSE:
        return op_transpose(b, op);
    case LMH_OP_ATTENTION:
        return op_attention(b, op);
    case LMH_OP_MOE_ROUTE:
        return op_moe_route(b, op);
    case LMH_OP_MOE_MATMUL:
        return op_moe_matmul(b, op);
    case LMH_OP_MOE_COMBINE:
        return op_moe_combine(b, op);
    case LMH_OP_ARGMAX:
        return op_argmax(b, op);
    case LMH_OP_UNARY:
        return op_eltwise(b, op);
    case LMH_OP_COLS:
        return op_cols(b, op);
    case LMH_OP_CONV1D:
        return op_conv1d(b, op);
    case LMH_OP_SSM_SCAN:
        return op_scan(b, op);
    case LMH_OP_SSD_SCAN: {
        chunk_plan pl;
        return ssd_plan(b, op, &pl) ? op_ssd_chunked(b, op, &pl) : op_scan(b, op);
    }
    case LMH_OP_DELTA_RULE: {
        chunk_plan pl;
        return delta_plan(b, op, &pl) ? op_delta_chunked(b, op, &pl) : op_delta(b, op);
    }
    default:
        return LMH_EUNSUPPORTED;
    }
}
