/* ABI 1.11 on one backend plugin (the CPU's on every SIMD path this CPU runs, or Vulkan's):
 * what the host needs to stream experts into a resident stack and to route rows to fewer
 * experts than k.
 *  - tensor_quant without parts + tensor_quant_write: a stack whose rows are written expert by
 *    expert (Q4 group 64 bf16 scales, Q8 group 32 f16, MXFP4) gives moe_matmul and matmul
 *    results bit-identical to the same weights made by tensor_quant from full parts; writes
 *    between enqueued ops (op on slot s, new rows into slot s, the op again, then sync) give
 *    the old then the new result; out-of-range rows, tensors made from parts, float tensors
 *    and malformed parts give LMH_EINVAL; memory() counts the stack as weights.
 *  - A float weight (LMH_TENSOR_WEIGHT) uploaded to again and again between ops: products and
 *    a conv's weights (which the CPU backend keeps in f32) see each new upload.
 *  - LMH_OP_MOE_ROUTE's src2 (experts a row uses): m = k gives the result without src2 bit
 *    for bit; m = 1, 2 of k = 4 (and values to clamp) with and without renormalisation match
 *    a plain C reference (softmax over all, top m, renormalised over the m), the columns
 *    past m repeating column 0's expert at weight 0; malformed src2 refused.
 * usage: test_moe_stream BACKEND_PLUGIN. Exit 0 pass, 1 fail, 77 skip (no device). */
#include "lmhost/lmhost.h"
#include "../test_debug.h"

#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const lmh_backend_api *api;
static lmh_backend *be;
static const char *g_path = "";
static int g_fail, g_checks;

static void host_log(int level, const char *fmt, ...) {
    if (level > LMH_LOG_WARN) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "log: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static const lmh_host_api g_host = {
    .size = sizeof(lmh_host_api), .abi_minor = LMH_ABI_MINOR, .log = host_log};

static void expect(int ok, const char *fmt, ...) {
    g_checks++;
    if (ok) return;
    g_fail++;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL [%s] ", g_path);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static uint64_t g_rng = 0x243f6a8885a308d3ull;
static uint32_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 32);
}
static float frand(float lo, float hi) {
    return lo + (hi - lo) * (float)((double)rnd() / 4294967296.0);
}

static uint16_t to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

static uint16_t to_f16(float f) { /* normal range only (the test's scales and biases) */
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000, ax = x & 0x7fffffff;
    if (ax < 0x38800000) return (uint16_t)sign;
    ax += 0xc8000fffu + ((ax >> 13) & 1);
    return (uint16_t)(sign | (ax >> 13));
}

static lmh_tensor *f32_new(int ndim, int64_t n0, int64_t n1, int64_t n2, const float *v) {
    int64_t ne[3] = {n0, n1, n2}, n = 1;
    for (int i = 0; i < ndim; i++) n *= ne[i];
    lmh_tensor *t = api->tensor_new(be, LMH_F32, ndim, ne, 0);
    if (!t || (v && api->upload(be, t, 0, v, (size_t)n * 4))) {
        fprintf(stderr, "tensor_new/upload failed\n");
        exit(1);
    }
    return t;
}

static lmh_tensor *i32_new(int ndim, int64_t n0, int64_t n1, const int32_t *v) {
    int64_t ne[2] = {n0, n1}, n = ndim == 2 ? n0 * n1 : n0;
    lmh_tensor *t = api->tensor_new(be, LMH_I32, ndim, ne, 0);
    if (!t || (v && api->upload(be, t, 0, v, (size_t)n * 4))) {
        fprintf(stderr, "tensor_new/upload failed\n");
        exit(1);
    }
    return t;
}

static float *get(const lmh_tensor *t, int64_t n) {
    float *v = malloc((size_t)n * 4);
    int rc = api->download(be, t, 0, v, (size_t)n * 4);
    if (rc) {
        expect(0, "download: %d", rc);
        memset(v, 0, (size_t)n * 4);
    }
    return v;
}

/* ---- quantized stacks ------------------------------------------------------------- */

/* One format: MLX affine (bits, group, scale dtype) or MXFP4 (bits 0). */
typedef struct fmt {
    const char *name;
    int bits, group;
    lmh_dtype sdt;
} fmt;

/* Checkpoint parts of `rows` rows of `in` values. */
typedef struct parts {
    uint32_t *q;
    uint8_t *s, *bias; /* bias NULL for MXFP4 */
    size_t qr, sr;     /* bytes a row of each */
} parts;

static int is_mx(const fmt *f) {
    return f->bits == 0;
}

static parts parts_new(const fmt *f, int64_t rows, int64_t in) {
    parts p = {0};
    size_t es = is_mx(f) ? 1 : lmh_dtype_size(f->sdt);
    p.qr = is_mx(f) ? (size_t)in / 2 : (size_t)(in * f->bits / 32) * 4;
    p.sr = (size_t)(in / f->group) * es;
    p.q = malloc(p.qr * (size_t)rows);
    p.s = malloc(p.sr * (size_t)rows);
    p.bias = is_mx(f) ? NULL : malloc(p.sr * (size_t)rows);
    for (size_t i = 0; i < p.qr * (size_t)rows / 4; i++) p.q[i] = rnd();
    int64_t ng = rows * (in / f->group);
    for (int64_t g = 0; g < ng; g++) {
        if (is_mx(f)) {
            p.s[g] = (uint8_t)(120 + rnd() % 10);
            continue;
        }
        for (int part = 0; part < 2; part++) {
            float v = part ? frand(-0.5f, 0.5f) : frand(0.5f, 1.5f) / (float)(1 << f->bits);
            uint8_t *dst = (part ? p.bias : p.s) + (size_t)g * es;
            if (f->sdt == LMH_F32) {
                memcpy(dst, &v, 4);
            } else {
                uint16_t h = f->sdt == LMH_F16 ? to_f16(v) : to_bf16(v);
                memcpy(dst, &h, 2);
            }
        }
    }
    return p;
}

static void parts_free(parts *p) {
    free(p->q);
    free(p->s);
    free(p->bias);
}

static lmh_dtype qtype(const fmt *f) {
    return is_mx(f) ? LMH_MXFP4 : lmh_quant_dtype(f->bits);
}

/* A tensor [E, out, in] (ndim 3) or [out, in] (ndim 2, E 1) from the parts, or without them
 * (p NULL). */
static lmh_tensor *quant_new(const fmt *f, int ndim, int64_t E, int64_t out, int64_t in,
                             const parts *p) {
    int64_t ne[3] = {E, out, in};
    const int64_t *n = ndim == 3 ? ne : ne + 1;
    lmh_tensor *t =
        api->tensor_quant(be, qtype(f), f->group, ndim, n, p ? p->q : NULL,
                          is_mx(f) ? LMH_U8 : f->sdt, p ? p->s : NULL, p ? p->bias : NULL);
    if (!t) {
        fprintf(stderr, "FAIL [%s] %s: tensor_quant (%s parts) failed\n", g_path, f->name,
                p ? "with" : "without");
        exit(1);
    }
    return t;
}

/* Rows [r0, r0 + n) of t from rows [s0, s0 + n) of p. */
static int qwrite(lmh_tensor *t, int64_t r0, int64_t n, const parts *p, int64_t s0) {
    return api->tensor_quant_write(be, t, r0, n, (const uint32_t *)((uint8_t *)p->q + s0 * p->qr),
                                   p->s + s0 * p->sr, p->bias ? p->bias + s0 * p->sr : NULL);
}

/* moe_matmul of x [n, in] over W with ids [n, k]: dst [n, k, out] (enqueued, not synced) */
static lmh_tensor *enq_moe(lmh_tensor *x, lmh_tensor *W, lmh_tensor *ids, int64_t n, int64_t k,
                           int64_t out) {
    int64_t ne[3] = {n, k, out};
    lmh_tensor *y = api->tensor_new(be, LMH_F32, 3, ne, 0);
    lmh_op op = {.code = LMH_OP_MOE_MATMUL, .dst = y, .src = {x, W, ids}};
    int rc = y ? api->enqueue(be, &op) : LMH_ENOMEM;
    expect(rc == LMH_OK, "moe_matmul enqueue: %d", rc);
    return y;
}

static lmh_tensor *enq_mm(lmh_tensor *x, lmh_tensor *W, int64_t n, int64_t out) {
    int64_t ne[2] = {n, out};
    lmh_tensor *y = api->tensor_new(be, LMH_F32, 2, ne, 0);
    lmh_op op = {.code = LMH_OP_MATMUL, .dst = y, .src = {x, W}};
    int rc = y ? api->enqueue(be, &op) : LMH_ENOMEM;
    expect(rc == LMH_OK, "matmul enqueue: %d", rc);
    return y;
}

/* a and b (n floats on the device) hold the same bits */
static void same_bits(const lmh_tensor *a, const lmh_tensor *b, int64_t n, const char *fmt_, ...) {
    float *va = get(a, n), *vb = get(b, n);
    int64_t at = -1;
    for (int64_t i = 0; i < n && at < 0; i++)
        if (memcmp(&va[i], &vb[i], 4)) at = i;
    char what[200];
    va_list ap;
    va_start(ap, fmt_);
    vsnprintf(what, sizeof what, fmt_, ap);
    va_end(ap);
    expect(at < 0, "%s: differs at %lld (%g against %g)", what, (long long)at,
           at < 0 ? 0.0 : (double)va[at], at < 0 ? 0.0 : (double)vb[at]);
    free(va);
    free(vb);
}

/* A stack made without parts, written expert by expert, against the same made from parts. */
static void t_stack(const fmt *f, int64_t E, int64_t out, int64_t in) {
    parts p = parts_new(f, E * out, in);
    lmh_backend_mem m0, m1;
    api->memory(be, &m0);
    lmh_tensor *full = quant_new(f, 3, E, out, in, &p), *mid = NULL;
    api->memory(be, &m1);
    lmh_tensor *st = quant_new(f, 3, E, out, in, NULL);
    lmh_backend_mem m2;
    api->memory(be, &m2);
    /* (the parts' bytes: the stack's own memory holds at least those) */
    uint64_t need = (uint64_t)(E * out) * (p.qr + p.sr * (is_mx(f) ? 1 : 2));
    expect(m2.weights - m1.weights >= need && m2.mapped == m1.mapped,
           "%s: memory() counts %llu weight bytes for a stack of %llu", f->name,
           (unsigned long long)(m2.weights - m1.weights), (unsigned long long)need);
    (void)m0;
    /* experts in reverse order, the last one in two writes */
    for (int64_t e = E - 1; e >= 0; e--) {
        int rc = e == E - 1 ? qwrite(st, e * out, 3, &p, e * out) |
                                  qwrite(st, e * out + 3, out - 3, &p, e * out + 3)
                            : qwrite(st, e * out, out, &p, e * out);
        expect(rc == LMH_OK, "%s: tensor_quant_write expert %lld: %d", f->name, (long long)e, rc);
    }
    int64_t k = 2;
    for (int ni = 0; ni < 3; ni++) {
        int64_t n = ni == 0 ? 1 : ni == 1 ? 3 : 20;
        float *xv = malloc((size_t)(n * in) * 4);
        int32_t *iv = malloc((size_t)(n * k) * 4);
        for (int64_t i = 0; i < n * in; i++) xv[i] = frand(-1, 1);
        for (int64_t i = 0; i < n * k; i++) iv[i] = (int32_t)((i * 7 + i / k) % E);
        lmh_tensor *x = f32_new(2, n, in, 0, xv), *ids = i32_new(2, n, k, iv);
        lmh_tensor *y0 = enq_moe(x, full, ids, n, k, out), *y1 = enq_moe(x, st, ids, n, k, out);
        expect(api->sync(be) == LMH_OK, "sync");
        same_bits(y0, y1, n * k * out, "%s: moe_matmul of %lld rows, written stack against full",
                  f->name, (long long)n);
        api->tensor_free(be, y0);
        api->tensor_free(be, y1);
        api->tensor_free(be, x);
        api->tensor_free(be, ids);
        free(xv);
        free(iv);
    }
    /* refusals: rows out of range, a tensor from parts, malformed parts */
    int64_t rows = E * out;
    expect(qwrite(st, -1, 1, &p, 0) == LMH_EINVAL, "%s: row0 -1 accepted", f->name);
    expect(qwrite(st, rows - 2, 3, &p, 0) == LMH_EINVAL, "%s: rows past the end accepted", f->name);
    expect(qwrite(st, rows, 1, &p, 0) == LMH_EINVAL, "%s: row0 = rows accepted", f->name);
    expect(api->tensor_quant_write(be, st, 0, -1, p.q, p.s, p.bias) == LMH_EINVAL,
           "%s: n -1 accepted", f->name);
    expect(api->tensor_quant_write(be, st, 0, 0, NULL, NULL, NULL) == LMH_OK,
           "%s: an empty write refused", f->name);
    expect(qwrite(full, 0, 1, &p, 0) == LMH_EINVAL, "%s: a tensor made from parts written",
           f->name);
    expect(api->tensor_quant_write(be, st, 0, 1, p.q, NULL, p.bias) == LMH_EINVAL,
           "%s: no scales accepted", f->name);
    expect(api->tensor_quant_write(be, st, 0, 1, p.q, p.s, is_mx(f) ? p.s : NULL) == LMH_EINVAL,
           "%s: %s accepted", f->name, is_mx(f) ? "biases for MXFP4" : "no biases");
    api->tensor_free(be, st);
    api->tensor_free(be, full);
    (void)mid;
    parts_free(&p);
}

/* Writes between ops: an op on slot 0, slot 0 rewritten, the op again, then one sync; against
 * the two experts made from parts. The matmul form (one row: what the Vulkan backend holds
 * back to fuse) too. */
static void t_interleaved(const fmt *f, int64_t out, int64_t in) {
    parts p = parts_new(f, 2 * out, in); /* experts A and B */
    lmh_tensor *full = quant_new(f, 3, 2, out, in, &p);
    lmh_tensor *st = quant_new(f, 3, 3, out, in, NULL);
    for (int64_t s = 0; s < 3; s++) expect(qwrite(st, s * out, out, &p, 0) == LMH_OK, "write A");
    for (int ni = 0; ni < 2; ni++) {
        int64_t n = ni ? 6 : 1, k = 2;
        float *xv = malloc((size_t)(n * in) * 4);
        int32_t *iv = calloc((size_t)(n * k), 4), *i1 = malloc((size_t)(n * k) * 4);
        for (int64_t i = 0; i < n * in; i++) xv[i] = frand(-1, 1);
        for (int64_t i = 0; i < n * k; i++) i1[i] = 1;
        lmh_tensor *x = f32_new(2, n, in, 0, xv), *ids0 = i32_new(2, n, k, iv),
                   *ids1 = i32_new(2, n, k, i1);
        expect(qwrite(st, 0, out, &p, 0) == LMH_OK, "write A");
        lmh_tensor *ya = enq_moe(x, st, ids0, n, k, out);
        expect(qwrite(st, 0, out, &p, out) == LMH_OK, "write B");
        lmh_tensor *yb = enq_moe(x, st, ids0, n, k, out);
        /* half of slot 0 back to A's rows: the next op sees the mix */
        expect(qwrite(st, 0, out / 2, &p, 0) == LMH_OK, "write half of A");
        lmh_tensor *ymix = enq_moe(x, st, ids0, n, k, out);
        lmh_tensor *ra = enq_moe(x, full, ids0, n, k, out), *rb = enq_moe(x, full, ids1, n, k, out);
        expect(api->sync(be) == LMH_OK, "sync");
        same_bits(ya, ra, n * k * out, "%s: %lld rows: the op before the write", f->name,
                  (long long)n);
        same_bits(yb, rb, n * k * out, "%s: %lld rows: the op after the write", f->name,
                  (long long)n);
        float *vm = get(ymix, n * k * out), *va = get(ra, n * k * out), *vb = get(rb, n * k * out);
        int bad = 0;
        for (int64_t r = 0; r < n * k; r++)
            for (int64_t o = 0; o < out; o++)
                bad |= memcmp(&vm[r * out + o], o < out / 2 ? &va[r * out + o] : &vb[r * out + o],
                              4) != 0;
        expect(!bad, "%s: %lld rows: half a slot rewritten", f->name, (long long)n);
        free(vm);
        free(va);
        free(vb);
        lmh_tensor *ts[] = {ya, yb, ymix, ra, rb, x, ids0, ids1};
        for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) api->tensor_free(be, ts[i]);
        free(xv);
        free(iv);
        free(i1);
    }
    /* a 2-D weight [out, in] under matmul: one row and several */
    parts pa = parts_new(f, out, in), pb = parts_new(f, out, in);
    lmh_tensor *fa = quant_new(f, 2, 1, out, in, &pa), *fb = quant_new(f, 2, 1, out, in, &pb);
    lmh_tensor *w = quant_new(f, 2, 1, out, in, NULL);
    for (int ni = 0; ni < 2; ni++) {
        int64_t n = ni ? 5 : 1;
        float *xv = malloc((size_t)(n * in) * 4);
        for (int64_t i = 0; i < n * in; i++) xv[i] = frand(-1, 1);
        lmh_tensor *x = f32_new(2, n, in, 0, xv);
        expect(qwrite(w, 0, out, &pa, 0) == LMH_OK, "write A");
        lmh_tensor *ya = enq_mm(x, w, n, out);
        expect(qwrite(w, 0, out - 1, &pb, 0) == LMH_OK && qwrite(w, out - 1, 1, &pb, out - 1) == 0,
               "write B");
        lmh_tensor *yb = enq_mm(x, w, n, out);
        lmh_tensor *ra = enq_mm(x, fa, n, out), *rb = enq_mm(x, fb, n, out);
        expect(api->sync(be) == LMH_OK, "sync");
        same_bits(ya, ra, n * out, "%s: matmul of %lld rows before the write", f->name,
                  (long long)n);
        same_bits(yb, rb, n * out, "%s: matmul of %lld rows after the write", f->name,
                  (long long)n);
        lmh_tensor *ts[] = {ya, yb, ra, rb, x};
        for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) api->tensor_free(be, ts[i]);
        free(xv);
    }
    api->tensor_free(be, w);
    api->tensor_free(be, fa);
    api->tensor_free(be, fb);
    api->tensor_free(be, st);
    api->tensor_free(be, full);
    parts_free(&p);
    parts_free(&pa);
    parts_free(&pb);
}

/* Float weights uploaded again and again between ops: a bf16 stack's slot, a 2-D weight under
 * a one-row matmul, and a conv's weights (kept in f32 by the CPU backend). */
static void t_float_weights(void) {
    const int64_t out = 24, in = 64, n = 3, k = 2;
    size_t slice = (size_t)(out * in);
    uint16_t *wa = malloc(slice * 2), *wb = malloc(slice * 2);
    for (size_t i = 0; i < slice; i++) {
        wa[i] = to_bf16(frand(-1, 1));
        wb[i] = to_bf16(frand(-1, 1));
    }
    int64_t ne3[3] = {2, out, in};
    lmh_tensor *full = api->tensor_new(be, LMH_BF16, 3, ne3, LMH_TENSOR_WEIGHT);
    lmh_tensor *st = api->tensor_new(be, LMH_BF16, 3, ne3, LMH_TENSOR_WEIGHT);
    expect(full && st, "tensor_new (weights)");
    if (!full || !st) return;
    api->upload(be, full, 0, wa, slice * 2);
    api->upload(be, full, slice * 2, wb, slice * 2);
    float xv[n * in];
    int32_t i0[n * k], i1[n * k];
    for (int64_t i = 0; i < n * in; i++) xv[i] = frand(-1, 1);
    for (int64_t i = 0; i < n * k; i++) {
        i0[i] = 0;
        i1[i] = 1;
    }
    lmh_tensor *x = f32_new(2, n, in, 0, xv), *ids0 = i32_new(2, n, k, i0),
               *ids1 = i32_new(2, n, k, i1);
    lmh_tensor *ys[6] = {0};
    for (int rep = 0; rep < 3; rep++) {
        expect(api->upload(be, st, 0, wa, slice * 2) == LMH_OK, "upload A");
        ys[2 * rep] = enq_moe(x, st, ids0, n, k, out);
        expect(api->upload(be, st, 0, wb, slice * 2) == LMH_OK, "upload B");
        ys[2 * rep + 1] = enq_moe(x, st, ids0, n, k, out);
    }
    lmh_tensor *ra = enq_moe(x, full, ids0, n, k, out), *rb = enq_moe(x, full, ids1, n, k, out);
    expect(api->sync(be) == LMH_OK, "sync");
    for (int i = 0; i < 6; i++)
        same_bits(ys[i], i % 2 ? rb : ra, n * k * out, "bf16 stack: op %d of uploads between", i);
    for (int i = 0; i < 6; i++) api->tensor_free(be, ys[i]);
    api->tensor_free(be, ra);
    api->tensor_free(be, rb);
    /* a 2-D f32 weight under one-row matmuls */
    int64_t ne2[2] = {out, in};
    lmh_tensor *w = api->tensor_new(be, LMH_F32, 2, ne2, LMH_TENSOR_WEIGHT);
    float *fa = malloc(slice * 4), *fbv = malloc(slice * 4);
    for (size_t i = 0; i < slice; i++) {
        fa[i] = frand(-1, 1);
        fbv[i] = frand(-1, 1);
    }
    lmh_tensor *x1 = f32_new(2, 1, in, 0, xv);
    lmh_tensor *wa32 = api->tensor_new(be, LMH_F32, 2, ne2, LMH_TENSOR_WEIGHT),
               *wb32 = api->tensor_new(be, LMH_F32, 2, ne2, LMH_TENSOR_WEIGHT);
    api->upload(be, wa32, 0, fa, slice * 4);
    api->upload(be, wb32, 0, fbv, slice * 4);
    api->upload(be, w, 0, fa, slice * 4);
    lmh_tensor *y1 = enq_mm(x1, w, 1, out);
    api->upload(be, w, 0, fbv, slice * 4);
    lmh_tensor *y2 = enq_mm(x1, w, 1, out);
    lmh_tensor *r1 = enq_mm(x1, wa32, 1, out), *r2 = enq_mm(x1, wb32, 1, out);
    expect(api->sync(be) == LMH_OK, "sync");
    same_bits(y1, r1, out, "f32 weight: matmul before the upload");
    same_bits(y2, r2, out, "f32 weight: matmul after the upload");
    lmh_tensor *ts[] = {y1, y2, r1, r2, x1, w, wa32, wb32, x, ids0, ids1, full, st};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) api->tensor_free(be, ts[i]);
    free(fa);
    free(fbv);
    free(wa);
    free(wb);

    /* conv: C channels, K = 2, one row of ones after a zero state: dst[c] = w[c, 1] (+ bias);
     * then the weight (and bias) uploaded anew, whole and in part */
    const int64_t C = 8, K = 2;
    float wv[C * K], bv[C], ones[C], zeros[C];
    for (int64_t i = 0; i < C * K; i++) wv[i] = frand(-1, 1);
    for (int64_t c = 0; c < C; c++) {
        bv[c] = frand(-1, 1);
        ones[c] = 1;
        zeros[c] = 0;
    }
    int64_t nw[2] = {C, K}, nb[1] = {C};
    lmh_tensor *cw = api->tensor_new(be, LMH_F32, 2, nw, LMH_TENSOR_WEIGHT);
    lmh_tensor *cb = api->tensor_new(be, LMH_F32, 1, nb, LMH_TENSOR_WEIGHT);
    lmh_tensor *cx = f32_new(2, 1, C, 0, ones), *cs = f32_new(2, K - 1, C, 0, NULL),
               *cy = f32_new(2, 1, C, 0, NULL);
    api->upload(be, cb, 0, bv, sizeof bv);
    for (int rep = 0; rep < 4; rep++) {
        if (rep == 2) { /* a part of the weight: channels 2 and 3 */
            for (int64_t i = 2 * K; i < 4 * K; i++) wv[i] = frand(-1, 1);
            api->upload(be, cw, 2 * K * 4, wv + 2 * K, 2 * K * 4);
        } else {
            for (int64_t i = 0; i < C * K; i++) wv[i] = frand(-1, 1);
            api->upload(be, cw, 0, wv, sizeof wv);
        }
        if (rep == 3) {
            for (int64_t c = 0; c < C; c++) bv[c] = frand(-1, 1);
            api->upload(be, cb, 0, bv, sizeof bv);
        }
        api->upload(be, cs, 0, zeros, sizeof zeros);
        lmh_op op = {.code = LMH_OP_CONV1D, .dst = cy, .src = {cx, cw, cb, cs}};
        op.p.i[0] = LMH_UNARY_NONE;
        int rc = api->enqueue(be, &op);
        expect(rc == LMH_OK, "conv1d enqueue: %d", rc);
        float *got = get(cy, C);
        double worst = 0;
        for (int64_t c = 0; c < C; c++) {
            double e = fabs((double)got[c] - ((double)wv[c * K + 1] + bv[c]));
            worst = e > worst ? e : worst;
        }
        expect(worst < 1e-5, "conv1d after upload %d: %g off (a stale weight?)", rep, worst);
        free(got);
    }
    lmh_tensor *cts[] = {cw, cb, cx, cs, cy};
    for (size_t i = 0; i < sizeof cts / sizeof *cts; i++) api->tensor_free(be, cts[i]);
}

/* ---- routing ---------------------------------------------------------------------- */

/* Softmax over all E, the best m (ties to the lower id), renormalised over the m. */
static void route_ref(const float *x, int64_t E, int64_t k, int64_t m, int renorm, int32_t *ids,
                      float *w) {
    double mx = -INFINITY, sum = 0;
    for (int64_t e = 0; e < E; e++) mx = x[e] > mx ? x[e] : mx;
    for (int64_t e = 0; e < E; e++) sum += exp((double)x[e] - mx);
    double chosen = 0, p[64];
    for (int64_t s = 0; s < m; s++) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; e++) {
            int taken = 0;
            for (int64_t t = 0; t < s; t++) taken |= ids[t] == e;
            if (!taken && (best < 0 || x[e] > x[best])) best = e;
        }
        ids[s] = (int32_t)best;
        p[s] = exp((double)x[best] - mx) / sum;
        chosen += p[s];
    }
    for (int64_t s = 0; s < k; s++) {
        w[s] = s < m ? (float)(renorm ? p[s] / chosen : p[s]) : 0.0f;
        if (s >= m) ids[s] = ids[0];
    }
}

static int route(lmh_tensor *lg, lmh_tensor *m, int64_t n, int64_t k, int renorm, float *w,
                 int32_t *ids) {
    lmh_tensor *wt = f32_new(2, n, k, 0, NULL), *it = i32_new(2, n, k, NULL);
    lmh_op op = {.code = LMH_OP_MOE_ROUTE, .dst = wt, .src = {lg, it, m}};
    op.p.i[0] = (int32_t)k;
    op.p.i[1] = renorm;
    int rc = api->enqueue(be, &op);
    if (!rc) rc = api->download(be, wt, 0, w, (size_t)(n * k) * 4);
    if (!rc) rc = api->download(be, it, 0, ids, (size_t)(n * k) * 4);
    api->tensor_free(be, wt);
    api->tensor_free(be, it);
    return rc;
}

static void t_route(int64_t E) {
    const int64_t n = 9, k = 4;
    float *lv = malloc((size_t)(n * E) * 4);
    for (int64_t i = 0; i < n * E; i++) lv[i] = frand(-4, 4);
    lv[2 * E + 5 % E] = lv[2 * E + 1]; /* a tie */
    lmh_tensor *lg = f32_new(2, n, E, 0, lv);
    int32_t mk[n], m1[n], m2[n], mmix[n];
    for (int64_t r = 0; r < n; r++) {
        mk[r] = (int32_t)k;
        m1[r] = 1;
        m2[r] = 2;
        /* every value, and some to clamp */
        static const int32_t vals[] = {1, 2, 3, 4, 0, -5, 9, 2, 1};
        mmix[r] = vals[r];
    }
    float w0[n * k], w1[n * k], wr[n * k];
    int32_t i0[n * k], i1[n * k], ir[n * k];
    for (int renorm = 0; renorm < 2; renorm++) {
        /* m = k: the result without src2, bit for bit */
        lmh_tensor *tk = i32_new(1, n, 0, mk);
        int rc = route(lg, NULL, n, k, renorm, w0, i0);
        rc |= route(lg, tk, n, k, renorm, w1, i1);
        expect(rc == LMH_OK && !memcmp(w0, w1, sizeof w0) && !memcmp(i0, i1, sizeof i0),
               "moe_route E=%lld renorm=%d: m = k differs from no src2 (rc %d)", (long long)E,
               renorm, rc);
        api->tensor_free(be, tk);
        const int32_t *ms[3] = {m1, m2, mmix};
        for (int c = 0; c < 3; c++) {
            lmh_tensor *tm = i32_new(1, n, 0, ms[c]);
            rc = route(lg, tm, n, k, renorm, w1, i1);
            expect(rc == LMH_OK, "moe_route src2: %d", rc);
            for (int64_t r = 0; r < n && rc == LMH_OK; r++) {
                int64_t m = ms[c][r] < 1 ? 1 : ms[c][r] > k ? k : ms[c][r];
                route_ref(lv + r * E, E, k, m, renorm, ir + r * k, wr + r * k);
                double worst = 0, chosen = 0;
                int ids_ok = 1, zero_ok = 1;
                for (int64_t s = 0; s < k; s++) {
                    ids_ok &= i1[r * k + s] == ir[r * k + s];
                    double e = fabs((double)w1[r * k + s] - wr[r * k + s]);
                    worst = e > worst ? e : worst;
                    if (s >= m) zero_ok &= w1[r * k + s] == 0.0f && i1[r * k + s] == i1[r * k];
                    chosen += w1[r * k + s];
                }
                expect(ids_ok && zero_ok && worst < 2e-6 && (!renorm || fabs(chosen - 1) < 2e-6),
                       "moe_route E=%lld renorm=%d row %lld (m %d -> %lld): ids %s, columns "
                       "past m %s, weights %g off the reference, sum %g",
                       (long long)E, renorm, (long long)r, ms[c][r], (long long)m,
                       ids_ok ? "ok" : "differ", zero_ok ? "ok" : "wrong", worst, chosen);
                /* the m chosen are the same and weigh as without src2 (renorm 0) */
                if (!renorm)
                    for (int64_t s = 0; s < m; s++)
                        expect(w1[r * k + s] == w0[r * k + s] && i1[r * k + s] == i0[r * k + s],
                               "moe_route E=%lld row %lld: column %lld differs from no src2",
                               (long long)E, (long long)r, (long long)s);
            }
            api->tensor_free(be, tm);
        }
    }
    /* malformed src2: f32, too short, too long */
    lmh_tensor *wt = f32_new(2, n, k, 0, NULL), *it = i32_new(2, n, k, NULL);
    lmh_tensor *bad[3] = {f32_new(1, n, 0, 0, NULL), i32_new(1, n - 1, 0, NULL),
                          i32_new(2, n, 2, NULL)};
    for (int i = 0; i < 3; i++) {
        lmh_op op = {.code = LMH_OP_MOE_ROUTE, .dst = wt, .src = {lg, it, bad[i]}};
        op.p.i[0] = (int32_t)k;
        expect(!api->supports(be, &op) && api->enqueue(be, &op) != LMH_OK,
               "moe_route: malformed src2 %d accepted", i);
        api->tensor_free(be, bad[i]);
    }
    lmh_op ok = {.code = LMH_OP_MOE_ROUTE, .dst = wt, .src = {lg, it, NULL}};
    ok.p.i[0] = (int32_t)k;
    expect(api->supports(be, &ok), "moe_route without src2 refused");
    api->tensor_free(be, wt);
    api->tensor_free(be, it);
    api->tensor_free(be, lg);
    free(lv);
}

/* A quantized tensor's writes refused on a float tensor. */
static void t_misc(void) {
    int64_t ne[2] = {4, 64};
    lmh_tensor *t = api->tensor_new(be, LMH_F32, 2, ne, LMH_TENSOR_WEIGHT);
    uint32_t q[64] = {0};
    uint16_t s[8] = {0};
    expect(api->tensor_quant_write(be, t, 0, 1, q, s, s) == LMH_EINVAL,
           "tensor_quant_write on a float tensor accepted");
    api->tensor_free(be, t);
    /* parts in part: refused */
    lmh_tensor *h = api->tensor_quant(be, LMH_Q4, 64, 2, ne, q, LMH_BF16, NULL, NULL);
    expect(!h, "tensor_quant with packed but no scales accepted");
    if (h) api->tensor_free(be, h);
}

static void run_all(void) {
    static const fmt fmts[] = {{"q4 g64 bf16", 4, 64, LMH_BF16},
                               {"q8 g32 f16", 8, 32, LMH_F16},
                               {"q3 g32 f32", 3, 32, LMH_F32},
                               {"mxfp4", 0, 32, LMH_U8}};
    for (size_t i = 0; i < sizeof fmts / sizeof *fmts; i++) {
        t_stack(&fmts[i], 5, 40, 128);
        t_stack(&fmts[i], 3, 33, 256);
        t_interleaved(&fmts[i], 36, 128);
    }
    t_float_weights();
    t_route(8);
    t_route(70); /* more experts than the Vulkan shader's workgroup */
    t_misc();
    expect(api->sync(be) == LMH_OK, "final sync");
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: test_moe_stream BACKEND_PLUGIN\n");
        return 2;
    }
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    lmh_plugin_entry_fn entry =
        h ? (lmh_plugin_entry_fn)(uintptr_t)dlsym(h, LMH_PLUGIN_ENTRY_NAME) : NULL;
    const lmh_plugin_info *info = entry ? entry() : NULL;
    if (!info || info->kind != LMH_KIND_BACKEND || info->abi_major != LMH_ABI_MAJOR ||
        info->abi_minor < 11) {
        fprintf(stderr, "%s: not a backend plugin of ABI 1.11 on\n", argv[1]);
        return 1;
    }
    char err[256] = "";
    if (info->init && info->init(&g_host, err, sizeof err)) {
        fprintf(stderr, "init: %s\n", err);
        return 1;
    }
    api = info->api;
    if (api->size <
            offsetof(lmh_backend_api, tensor_quant_write) + sizeof api->tensor_quant_write ||
        !api->tensor_quant_write || !api->tensor_quant) {
        fprintf(stderr, "%s: no tensor_quant_write\n", argv[1]);
        return 1;
    }
    /* the CPU backend on each SIMD path; another backend once */
    static const char *cpu_paths[] = {"portable", "avx2", "avx512", "neon"};
    const int cpu = !strcmp(info->name, "cpu");
    int tested = 0;
    for (size_t pi = 0; pi < (cpu ? sizeof cpu_paths / sizeof *cpu_paths : 1); pi++) {
        if (cpu) test_debug_set("simd", cpu_paths[pi]);
        g_path = cpu ? cpu_paths[pi] : info->name;
        lmh_backend_opts o = {.size = sizeof o, .threads = 3};
        be = NULL;
        if (api->create(&g_host, &o, &be, err, sizeof err)) {
            printf("skip %s: %s\n", g_path, err);
            continue;
        }
        tested++;
        run_all();
        api->destroy(be);
    }
    printf("%d backends, %d checks, %d failed\n", tested, g_checks, g_fail);
    if (!tested) return cpu ? 1 : 77;
    return g_fail ? 1 : 0;
}
