/* Every op on the Vulkan backend against the CPU backend, on random inputs.
 *
 * usage: test_vk_ops CPU_PLUGIN VULKAN_PLUGIN
 * Loads both plugins through their entry symbols, runs each op with the same operands on
 * both (odd sizes, one row and many, every weight dtype, unaligned views, attention with
 * windows, rings, soft-cap and GQA, split keys, MoE; MLX-quantized weights of every bit width,
 * group size and scale dtype in get_rows, matmul and moe_matmul, and microscaled 4-bit ones
 * (MXFP4)) and compares. It does so twice:
 * with the device's subgroup reductions and push descriptors, and with the shared-memory reductions
 * and descriptor pools (LMHOST_DEBUG vk-no-subgroup,vk-no-push-descriptor); tiled products
 * in matmul_big.comp's tiles of 128 rows the first time, of 64 the second. Pairs of ops
 * the backend fuses into one dispatch are checked the same way (t_fused), and so are the
 * products decode runs with the norm or SwiGLU before them and the residual add after them
 * computed inside (t_fused_products; t_fused_dispatches counts the dispatches).
 *
 * Tolerance: float results agree within 1e-4 x the largest |value| of the CPU result
 * (both accumulate in f32, in different orders; 1e-4 leaves room for sums of a few
 * thousand terms while catching any indexing error, which is O(1)). Conversions to f16
 * and bf16 must match bit for bit (both round to nearest even), and so must MoE
 * routing's expert ids and what ops leave untouched.
 * With LMHOST_TEST_BENCH=N (and LMHOST_TEST_ONLY=bench) it times instead: decode's
 * one-row products on a 7B model's shapes (bf16, MLX 4- and 8-bit, MXFP4), chained and
 * spread, and the scans of up to N rows.
 * Exit 0 pass, 1 fail, 77 skip (no Vulkan device). */
#include "lmhost/lmhost.h"
#include "../test_debug.h"

#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct be {
    const lmh_backend_api *api;
    lmh_backend *b;
} be;

static be g_be[2]; /* 0: cpu, 1: vulkan */
static int g_fail, g_checks;
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static int g_verbose;

static void host_log(int level, const char *fmt, ...) {
    if (level > (g_verbose ? LMH_LOG_DEBUG : LMH_LOG_WARN)) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "log: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

static const lmh_host_api g_host = {
    .size = sizeof(lmh_host_api), .abi_minor = LMH_ABI_MINOR, .log = host_log};

static float frand(float lo, float hi) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return lo + (hi - lo) * (float)((g_rng >> 11) * (1.0 / 9007199254740992.0));
}

static uint16_t to_f16(float f) { /* round to nearest even */
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000, ax = x & 0x7fffffff;
    if (ax >= 0x47800000) return (uint16_t)(sign | (ax > 0x7f800000 ? 0x7e00 : 0x7c00));
    if (ax < 0x38800000) {
        float r;
        memcpy(&r, &ax, 4);
        r += 0.5f;
        uint32_t u;
        memcpy(&u, &r, 4);
        return (uint16_t)(sign | (u - 0x3f000000));
    }
    ax += 0xc8000fffu + ((ax >> 13) & 1);
    return (uint16_t)(sign | (ax >> 13));
}

static uint16_t to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40);
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

/* ---- tensors on both backends ------------------------------------------------------- */

typedef struct tt {
    lmh_tensor *t[2];
} tt;

#define MAXT 64
static tt g_pool[MAXT];
static int g_npool;

static tt *mk_raw(lmh_dtype dt, int ndim, const int64_t *ne, const void *data, uint32_t flags) {
    tt *x = &g_pool[g_npool++];
    size_t bytes = lmh_dtype_size(dt);
    for (int i = 0; i < ndim; i++) bytes *= (size_t)ne[i];
    for (int k = 0; k < 2; k++) {
        x->t[k] = g_be[k].api->tensor_new(g_be[k].b, dt, ndim, ne, flags);
        if (!x->t[k]) {
            fprintf(stderr, "FAIL: tensor_new on backend %d\n", k);
            exit(1);
        }
        if (data && g_be[k].api->upload(g_be[k].b, x->t[k], 0, data, bytes) != LMH_OK) {
            fprintf(stderr, "FAIL: upload on backend %d\n", k);
            exit(1);
        }
    }
    return x;
}

/* Random values in [lo, hi) stored as dtype dt (f32, f16, bf16). */
static tt *mk(lmh_dtype dt, int ndim, int64_t n0, int64_t n1, int64_t n2, float lo, float hi,
              uint32_t flags) {
    int64_t ne[3] = {n0, n1, n2}, n = 1;
    for (int i = 0; i < ndim; i++) n *= ne[i];
    void *buf = malloc((size_t)(n ? n : 1) * 4);
    for (int64_t i = 0; i < n; i++) {
        float v = frand(lo, hi);
        if (dt == LMH_F32)
            ((float *)buf)[i] = v;
        else
            ((uint16_t *)buf)[i] = dt == LMH_F16 ? to_f16(v) : to_bf16(v);
    }
    tt *x = mk_raw(dt, ndim, ne, buf, flags);
    free(buf);
    return x;
}

static tt *mk_i32(int ndim, int64_t n0, int64_t n1, const int32_t *v) {
    int64_t ne[2] = {n0, n1};
    return mk_raw(LMH_I32, ndim, ne, v, 0);
}

static tt *view(tt *base, int64_t off_elems, lmh_dtype dt, int ndim, int64_t n0, int64_t n1,
                int64_t n2) {
    tt *x = &g_pool[g_npool++];
    int64_t ne[3] = {n0, n1, n2};
    for (int k = 0; k < 2; k++)
        x->t[k] = g_be[k].api->tensor_view(g_be[k].b, base->t[k],
                                           (size_t)off_elems * lmh_dtype_size(dt), dt, ndim, ne);
    return x;
}

/* Host buffers lent to tensor_quant, which the CPU backend uses in place: kept until the
 * tensors are freed. */
static void *g_keep[3 * MAXT];
static int g_nkeep;

static void free_all(void) {
    for (int i = g_npool - 1; i >= 0; i--)
        for (int k = 0; k < 2; k++) g_be[k].api->tensor_free(g_be[k].b, g_pool[i].t[k]);
    g_npool = 0;
    for (int i = 0; i < g_nkeep; i++) free(g_keep[i]);
    g_nkeep = 0;
}

static uint32_t rand32(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 32);
}

/* An MLX-quantized weight [n0, n1] or [n0, n1, n2] on both backends: random codes (every
 * bit pattern is a valid stream), scales about 1 / 2^bits and biases in [-0.5, 0.5) so the
 * values stay near [-0.5, 1.5), stored as sdt. */
static tt *mk_quant(int bits, int32_t group, lmh_dtype sdt, int ndim, int64_t n0, int64_t n1,
                    int64_t n2) {
    int64_t ne[3] = {n0, n1, n2}, in = ne[ndim - 1], rows = n0 * (ndim == 3 ? n1 : 1);
    int64_t words = rows * in * bits / 32, ng = rows * (in / group);
    uint32_t *packed = malloc((size_t)words * 4);
    size_t es = lmh_dtype_size(sdt);
    uint8_t *sb[2] = {malloc((size_t)ng * es), malloc((size_t)ng * es)};
    for (int64_t i = 0; i < words; i++) packed[i] = rand32();
    for (int part = 0; part < 2; part++)
        for (int64_t i = 0; i < ng; i++) {
            float v = part ? frand(-0.5f, 0.5f) : frand(0.5f, 1.5f) / (float)(1 << bits);
            if (sdt == LMH_F32)
                memcpy(sb[part] + i * 4, &v, 4);
            else {
                uint16_t h = sdt == LMH_F16 ? to_f16(v) : to_bf16(v);
                memcpy(sb[part] + i * 2, &h, 2);
            }
        }
    g_keep[g_nkeep++] = packed;
    g_keep[g_nkeep++] = sb[0];
    g_keep[g_nkeep++] = sb[1];
    tt *x = &g_pool[g_npool++];
    for (int k = 0; k < 2; k++) {
        const lmh_backend_api *api = g_be[k].api;
        x->t[k] = api->tensor_quant ? api->tensor_quant(g_be[k].b, lmh_quant_dtype(bits), group,
                                                        ndim, ne, packed, sdt, sb[0], sb[1])
                                    : NULL;
        if (!x->t[k]) {
            fprintf(stderr, "FAIL: tensor_quant on backend %d\n", k);
            exit(1);
        }
    }
    return x;
}

/* An attention's sinks (ABI 1.10, LMH_ATTN_SINKS): run() passes them to LMH_OP_ATTENTION
 * while set. */
static tt *g_sinks;

/* A microscaled 4-bit weight (LMH_MXFP4) [n0, n1] or [n0, n1, n2] on both backends: random
 * codes (every nibble is a value) and e8m0 scales around 2^-3 (some subnormal ones where
 * sub is set); the blocks lent at an odd address where `odd` is set (the CPU copies
 * them). */
static tt *mk_mx(int ndim, int64_t n0, int64_t n1, int64_t n2, int sub, int odd) {
    int64_t ne[3] = {n0, n1, n2}, in = ne[ndim - 1], rows = n0 * (ndim == 3 ? n1 : 1);
    int64_t bytes = rows * in / 2, ng = rows * (in / 32);
    uint8_t *blocks = malloc((size_t)bytes + 1), *sc = malloc((size_t)ng);
    for (int64_t i = 0; i < bytes + 1; i++) blocks[i] = (uint8_t)rand32();
    for (int64_t i = 0; i < ng; i++)
        sc[i] = (uint8_t)(sub && i % 7 == 3 ? i % 2 : 120 + rand32() % 6);
    g_keep[g_nkeep++] = blocks;
    g_keep[g_nkeep++] = sc;
    tt *x = &g_pool[g_npool++];
    for (int k = 0; k < 2; k++) {
        const lmh_backend_api *api = g_be[k].api;
        x->t[k] = api->tensor_quant(g_be[k].b, LMH_MXFP4, 32, ndim, ne,
                                    (const uint32_t *)(const void *)(blocks + (odd ? 1 : 0)),
                                    LMH_U8, sc, NULL);
        if (!x->t[k]) {
            fprintf(stderr, "FAIL: tensor_quant (mxfp4) on backend %d\n", k);
            exit(1);
        }
    }
    return x;
}

static int run(const char *what, lmh_op_code code, tt *dst, tt *s0, tt *s1, tt *s2, tt *s3,
               const float *f, const int32_t *iv) {
    for (int k = 0; k < 2; k++) {
        lmh_op op = {.code = code, .dst = dst->t[k]};
        tt *src[4] = {s0, s1, s2, s3};
        for (int i = 0; i < 4; i++) op.src[i] = src[i] ? src[i]->t[k] : NULL;
        if (code == LMH_OP_ATTENTION && g_sinks) op.src_more[0] = g_sinks->t[k];
        for (int i = 0; i < 8; i++) {
            op.p.f[i] = f ? f[i] : 0;
            op.p.i[i] = iv ? iv[i] : 0;
        }
        if (code == LMH_OP_ATTENTION && g_sinks) op.p.i[5] |= LMH_ATTN_SINKS;
        if (!g_be[k].api->supports(g_be[k].b, &op)) {
            fprintf(stderr, "FAIL %s: backend %s does not support it\n", what,
                    k ? "vulkan" : "cpu");
            g_fail++;
            return -1;
        }
        int rc = g_be[k].api->enqueue(g_be[k].b, &op);
        if (rc != LMH_OK) {
            fprintf(stderr, "FAIL %s: enqueue on %s: %d\n", what, k ? "vulkan" : "cpu", rc);
            g_fail++;
            return -1;
        }
    }
    return 0;
}

static void *fetch(tt *x, int k, size_t *bytes) {
    const lmh_tensor *t = x->t[k];
    *bytes = lmh_dtype_size(t->dtype) * (size_t)lmh_nelem(t);
    void *p = malloc(*bytes ? *bytes : 1);
    if (g_be[k].api->download(g_be[k].b, t, 0, p, *bytes) != LMH_OK) {
        fprintf(stderr, "FAIL: download on backend %d\n", k);
        exit(1);
    }
    return p;
}

/* f32 results within tol x max |cpu|; other dtypes bit for bit. Returns the largest
 * difference over max |cpu| (0 for other dtypes). */
static double check(const char *what, tt *x, double tol) {
    size_t n0, n1;
    void *a = fetch(x, 0, &n0), *b = fetch(x, 1, &n1);
    double rel = 0;
    g_checks++;
    if (x->t[0]->dtype != LMH_F32) {
        if (memcmp(a, b, n0)) {
            size_t es = lmh_dtype_size(x->t[0]->dtype), i = 0;
            while (!memcmp((char *)a + i * es, (char *)b + i * es, es)) i++;
            fprintf(stderr, "FAIL %s: element %zu differs (bitwise)\n", what, i);
            g_fail++;
        }
    } else {
        const float *p = a, *q = b;
        size_t n = n0 / 4, worst = 0;
        double mx = 0, md = 0;
        for (size_t i = 0; i < n; i++)
            if (isfinite(p[i])) mx = fmax(mx, fabs(p[i]));
        for (size_t i = 0; i < n; i++) {
            double d = p[i] == q[i] ? 0 : fabs((double)p[i] - q[i]); /* equal infinities too */
            if (!(d <= md)) {
                md = isnan(d) ? INFINITY : d;
                worst = i;
            }
        }
        if (!(md <= tol * (mx > 1e-30 ? mx : 1e-30))) {
            fprintf(stderr, "FAIL %s: max |d| %.3g at %zu (cpu %g, vulkan %g), max |cpu| %.3g\n",
                    what, md, worst, p[worst], q[worst], mx);
            g_fail++;
        }
        rel = md / (mx > 1e-30 ? mx : 1e-30);
    }
    free(a);
    free(b);
    return rel;
}

static float from16(uint16_t h, lmh_dtype dt) {
    if (dt == LMH_BF16) {
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    int e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0    ? ldexpf((float)m, -24)
              : e == 31 ? INFINITY
                        : ldexpf((float)(m | 1024), e - 25);
    return h & 0x8000 ? -v : v;
}

/* A 16-bit result computed from f32 values that may differ in their last bits (a
 * conversion then rounds them apart by an ulp): within tol x max |cpu| as floats. */
static void check16(const char *what, tt *x, double tol) {
    size_t n0, n1;
    uint16_t *a = fetch(x, 0, &n0), *b = fetch(x, 1, &n1);
    lmh_dtype dt = x->t[0]->dtype;
    g_checks++;
    double mx = 0, md = 0;
    size_t worst = 0;
    for (size_t i = 0; i < n0 / 2; i++) mx = fmax(mx, fabs(from16(a[i], dt)));
    for (size_t i = 0; i < n0 / 2; i++) {
        double d = fabs((double)from16(a[i], dt) - from16(b[i], dt));
        if (!(d <= md)) md = d, worst = i;
    }
    if (!(md <= tol * mx)) {
        fprintf(stderr, "FAIL %s: max |d| %.3g at %zu, max |cpu| %.3g\n", what, md, worst, mx);
        g_fail++;
    }
    free(a);
    free(b);
}

#define TOL 1e-4
static const lmh_dtype fdt[3] = {LMH_F32, LMH_F16, LMH_BF16};

/* ---- the ops ------------------------------------------------------------------------ */

static void t_get_rows(void) {
    for (int w = 0; w < 3; w++) {
        for (int di = 0; di < 2; di++) {
            int64_t V = 37, d = di ? 64 : 13;
            tt *tab = mk(fdt[w], 2, V, d, 0, -2, 2, LMH_TENSOR_WEIGHT);
            int32_t ids[7] = {0, 36, 5, -1, 37, 5, 17};
            tt *id = mk_i32(1, 7, 0, ids), *dst = mk(LMH_F32, 2, 7, d, 0, 9, 9, 0);
            char what[64];
            snprintf(what, sizeof what, "get_rows %s d=%lld", lmh_dtype_name(fdt[w]), (long long)d);
            if (!run(what, LMH_OP_GET_ROWS, dst, tab, id, NULL, NULL, NULL, NULL))
                check(what, dst, 0);
            free_all();
        }
    }
}

/* The greedy rule by its definition: the first index of the largest value, NaNs skipped,
 * but a NaN first gives 0 (core/sampler.c). */
static int32_t argmax_ref(const float *x, int64_t n) {
    if (x[0] != x[0]) return 0;
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return (int32_t)best;
}

static void t_argmax(void) {
    static const int64_t widths[] = {1, 3, 4, 1000, 1001, 151936};
    const int rows = 9;
    for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++) {
        int64_t n = widths[wi];
        float *x = malloc((size_t)(rows * n) * sizeof *x);
        for (int64_t i = 0; i < rows * n; i++) x[i] = frand(-4, 4);
        float *r;
        r = x + 1 * n; /* the maximum twice: the first wins */
        r[n / 3] = 9;
        r[n - 1] = 9;
        r = x + 2 * n; /* a NaN first gives 0 */
        r[0] = NAN;
        r[n - 1] = 9;
        r = x + 3 * n; /* NaNs elsewhere never win */
        for (int64_t i = 1; i < n; i += 2) r[i] = NAN;
        r = x + 4 * n; /* all -inf: the first */
        for (int64_t i = 0; i < n; i++) r[i] = -INFINITY;
        r = x + 5 * n; /* +inf twice, -inf first */
        r[0] = -INFINITY;
        r[n / 2] = INFINITY;
        r[n - 1] = INFINITY;
        r = x + 6 * n; /* all equal: 0 */
        for (int64_t i = 0; i < n; i++) r[i] = 1.5f;
        r = x + 7 * n; /* all NaN: 0 */
        for (int64_t i = 0; i < n; i++) r[i] = NAN;
        r = x + 8 * n; /* few values: ties, zeros of both signs, infinities and NaNs mixed */
        static const float few[] = {1, 2, -1, 0, -0.0f, 2, -INFINITY, INFINITY, NAN};
        for (int64_t i = 0; i < n; i++) r[i] = few[rand32() % 9];
        int64_t ne[2] = {rows, n};
        tt *src = mk_raw(LMH_F32, 2, ne, x, 0), *dst = mk_i32(1, rows, 0, NULL);
        char what[64];
        snprintf(what, sizeof what, "argmax n=%lld", (long long)n);
        if (!run(what, LMH_OP_ARGMAX, dst, src, NULL, NULL, NULL, NULL, NULL)) {
            check(what, dst, 0); /* vulkan = cpu, bit for bit */
            size_t bytes;
            int32_t *got = fetch(dst, 0, &bytes);
            g_checks++;
            for (int k = 0; k < rows; k++)
                if (got[k] != argmax_ref(x + k * n, n)) {
                    fprintf(stderr, "FAIL %s: row %d gives %d, the definition %d\n", what, k,
                            got[k], argmax_ref(x + k * n, n));
                    g_fail++;
                }
            free(got);
        }
        free(x);
        free_all();
    }
    /* a view that starts off 16 bytes takes the scalar path */
    float *x = malloc(4 * 1001 * sizeof *x);
    for (int i = 0; i < 4 * 1001; i++) x[i] = frand(-1, 1);
    x[1 + 2 * 1000 + 777] = 5;
    int64_t ne[1] = {4 * 1001};
    tt *base = mk_raw(LMH_F32, 1, ne, x, 0);
    tt *v = view(base, 1, LMH_F32, 2, 4, 1000, 0), *dst = mk_i32(1, 4, 0, NULL);
    if (!run("argmax of an unaligned view", LMH_OP_ARGMAX, dst, v, NULL, NULL, NULL, NULL, NULL)) {
        check("argmax of an unaligned view", dst, 0);
        size_t bytes;
        int32_t *got = fetch(dst, 1, &bytes);
        g_checks++;
        if (got[2] != 777) {
            fprintf(stderr, "FAIL argmax of an unaligned view: row 2 gives %d, not 777\n", got[2]);
            g_fail++;
        }
        free(got);
    }
    free(x);
    free_all();
}

static void expect(int ok, const char *what) {
    g_checks++;
    if (!ok) {
        fprintf(stderr, "FAIL download_start: %s\n", what);
        g_fail++;
    }
}

/* Downloads that do not wait (download_start, download_wait): each copy holds what its
 * tensor held when it was started, though later ops overwrite the tensor before the host
 * waits; tickets are waited for in any order, once each; too many at once are refused. */
static void t_download_start(void) {
    const lmh_backend_api *api = g_be[1].api;
    lmh_backend *vb = g_be[1].b;
    enum { ROWS = 5, N = 3001, STEPS = 3 };
    int64_t ne[2] = {ROWS, N}, nr = ROWS;
    float *x = malloc((size_t)ROWS * N * sizeof *x);
    lmh_tensor *lg = api->tensor_new(vb, LMH_F32, 2, ne, 0);
    lmh_tensor *ids = api->tensor_new(vb, LMH_I32, 1, &nr, 0);
    int32_t want[STEPS][ROWS], got[ROWS];
    uint64_t ticket[STEPS] = {0};
    int rc = !lg || !ids || !x;
    /* three "decode steps" writing the same picks tensor, each copy started, none waited */
    for (int st = 0; st < STEPS && !rc; st++) {
        for (int i = 0; i < ROWS * N; i++) x[i] = frand(-1, 1);
        for (int r = 0; r < ROWS; r++) want[st][r] = argmax_ref(x + (size_t)r * N, N);
        lmh_op op = {.code = LMH_OP_ARGMAX, .dst = ids, .src = {lg}};
        rc = api->upload(vb, lg, 0, x, (size_t)ROWS * N * sizeof *x) || api->enqueue(vb, &op) ||
             api->download_start(vb, ids, 0, sizeof got, &ticket[st]);
    }
    expect(!rc, "three copies started");
    expect(ticket[0] && ticket[1] != ticket[0] && ticket[2] != ticket[1], "distinct tickets");
    static const int order[STEPS] = {1, 2, 0}; /* any order */
    for (int i = 0; i < STEPS && !rc; i++) {
        int st = order[i];
        memset(got, 0xff, sizeof got);
        int w = api->download_wait(vb, ticket[st], got, sizeof got);
        expect(!w && !memcmp(got, want[st], sizeof got), "each copy as it was started");
    }
    expect(api->download_wait(vb, ticket[0], got, sizeof got) == LMH_EINVAL,
           "a ticket waited for twice");
    expect(api->download_wait(vb, 0, got, sizeof got) == LMH_EINVAL, "ticket 0");
    /* a part of a tensor, and a wait for more than was copied */
    uint64_t t1 = 0;
    rc = api->download_start(vb, ids, 2 * sizeof(int32_t), 2 * sizeof(int32_t), &t1);
    expect(!rc && api->download_wait(vb, t1, got, 3 * sizeof(int32_t)) == LMH_EINVAL,
           "a wait for more bytes than the copy");
    rc = api->download_start(vb, ids, 2 * sizeof(int32_t), 2 * sizeof(int32_t), &t1);
    expect(!rc && !api->download_wait(vb, t1, got, 2 * sizeof(int32_t)) &&
               got[0] == want[STEPS - 1][2] && got[1] == want[STEPS - 1][3],
           "two picks from the middle");
    expect(api->download_start(vb, ids, 0, sizeof got + 4, &t1) == LMH_EINVAL,
           "a copy past the tensor's end");
    /* as many as it holds, then LMH_EUNSUPPORTED, and all of them still deliver */
    uint64_t many[64];
    int n = 0;
    while (n < 64 && (rc = api->download_start(vb, ids, 0, sizeof got, &many[n])) == LMH_OK) n++;
    expect(n >= 2 && n < 64 && rc == LMH_EUNSUPPORTED, "a full table refuses");
    for (int i = n - 1; i >= 0; i--) {
        memset(got, 0xff, sizeof got);
        expect(!api->download_wait(vb, many[i], got, sizeof got) &&
                   !memcmp(got, want[STEPS - 1], sizeof got),
               "each of a full table");
    }
    expect(!api->sync(vb), "sync after");
    if (lg) api->tensor_free(vb, lg);
    if (ids) api->tensor_free(vb, ids);
    free(x);
}

static void t_matmul(void) {
    /* Tiled products on matrix cores (the fast precision mode) take f16 operands: each
     * product rounds at 2^-11 relative, so sums of up to 128 agree within about 2e-3. */
    const double mm_tol = strstr(g_be[1].api->describe(g_be[1].b), "matrix cores") ? 3e-3 : TOL;
    /* the last seven: matvec's 4-chunk steps, then matmul_big's 16-byte loads (with a last
     * step of 8 columns) and partial tiles, its products of one tile row split over k (4
     * splits, or in the first pass a matrix-vector product; 8 in the first pass, the last
     * one shorter), and those of few tiles in several tile rows split in two (the last in
     * both passes, the one before it in the second; the second half shorter); then one
     * with enough tiles for matmul_coop's 256-output ones (in the fast precision mode) */
    static const int64_t shapes[][3] = {
        {1, 64, 48},    {1, 37, 19},      {3, 128, 200},    {4, 72, 33},     {2, 24, 9},
        {5, 64, 130},   {70, 96, 65},     {130, 37, 129},   {1, 256, 513},   {9, 8, 1},
        {1, 4104, 33},  {3, 2056, 17},    {200, 264, 260},  {129, 512, 384}, {12, 1024, 100},
        {70, 2064, 70}, {200, 1040, 130}, {1024, 136, 3072}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int w = 0; w < 3; w++)
            for (int bias = 0; bias < 4; bias++) {
                if (bias && s % 3 != (size_t)bias - 1 && bias != 1) continue;
                int64_t rows = shapes[s][0], in = shapes[s][1], out = shapes[s][2];
                tt *x = mk(LMH_F32, 2, rows, in, 0, -1, 1, 0);
                tt *W = mk(fdt[w], 2, out, in, 0, -0.5f, 0.5f, LMH_TENSOR_WEIGHT);
                tt *bt = bias ? mk(fdt[bias - 1], 1, out, 0, 0, -1, 1, LMH_TENSOR_WEIGHT) : NULL;
                tt *y = mk(LMH_F32, 2, rows, out, 0, 0, 0, 0);
                char what[96];
                snprintf(what, sizeof what, "matmul %lldx%lld -> %lld %s bias %d", (long long)rows,
                         (long long)in, (long long)out, lmh_dtype_name(fdt[w]), bias);
                if (!run(what, LMH_OP_MATMUL, y, x, W, bt, NULL, NULL, NULL))
                    check(what, y, rows > 4 ? mm_tol : TOL);
                free_all();
            }
    /* an input view that starts off the binding alignment */
    for (int r = 1; r <= 6; r += 5) {
        tt *xb = mk(LMH_F32, 1, r * 64 + 3, 0, 0, -1, 1, 0);
        tt *x = view(xb, 3, LMH_F32, 2, r, 64, 0);
        tt *W = mk(LMH_BF16, 2, 40, 64, 0, -1, 1, LMH_TENSOR_WEIGHT);
        tt *yb = mk(LMH_F32, 1, r * 40 + 1, 0, 0, 7, 7, 0);
        tt *y = view(yb, 1, LMH_F32, 2, r, 40, 0);
        if (!run("matmul unaligned views", LMH_OP_MATMUL, y, x, W, NULL, NULL, NULL, NULL))
            check("matmul unaligned views (and the element before)", yb, r > 4 ? mm_tol : TOL);
        free_all();
    }
}

static void t_norm(void) {
    static const int64_t dims[] = {64, 37, 1000, 4099}; /* workgroups of 128, 256, 1024 */
    for (int di = 0; di < 4; di++)
        for (int w = 0; w < 4; w++)
            for (int off = 0; off < 2; off++) {
                int64_t d = dims[di];
                tt *x = mk(LMH_F32, 2, 5, d, 0, -3, 3, 0);
                tt *wt = w ? mk(fdt[w - 1], 1, d, 0, 0, -1, 1, LMH_TENSOR_WEIGHT) : NULL;
                tt *y = mk(LMH_F32, 2, 5, d, 0, 0, 0, 0);
                float f[8] = {1e-6f, (float)off};
                char what[64];
                snprintf(what, sizeof what, "rms_norm d=%lld w=%d off=%d", (long long)d, w, off);
                if (!run(what, LMH_OP_RMS_NORM, y, x, wt, NULL, NULL, f, NULL)) check(what, y, TOL);
                if (!run("rms_norm in place", LMH_OP_RMS_NORM, x, x, wt, NULL, NULL, f, NULL))
                    check("rms_norm in place", x, TOL);
                free_all();
            }
}

static void t_eltwise(void) {
    int64_t rows = 7, d = 33;
    for (int w = 0; w < 3; w++)
        for (int bc = 0; bc < 3; bc++)
            for (int code = LMH_OP_ADD; code <= LMH_OP_MUL; code++) {
                tt *a = mk(LMH_F32, 2, rows, d, 0, -2, 2, 0);
                tt *b = bc == 0   ? mk(fdt[w], 2, rows, d, 0, -2, 2, 0)
                        : bc == 1 ? mk(fdt[w], 1, d, 0, 0, -2, 2, 0)
                                  : mk(fdt[w], 1, 1, 0, 0, -2, 2, 0);
                tt *y = mk(LMH_F32, 2, rows, d, 0, 0, 0, 0);
                char what[64];
                snprintf(what, sizeof what, "%s %s broadcast %d", lmh_op_name(code),
                         lmh_dtype_name(fdt[w]), bc);
                if (!run(what, code, y, a, b, NULL, NULL, NULL, NULL)) check(what, y, TOL);
                if (!run(what, code, a, a, b, NULL, NULL, NULL, NULL)) check(what, a, TOL);
                free_all();
            }
    float f[8] = {0.37f};
    tt *a = mk(LMH_F32, 2, 1000, 77, 0, -40, 40, 0), *b = mk(LMH_F32, 2, 1000, 77, 0, -4, 4, 0);
    tt *y = mk(LMH_F32, 2, 1000, 77, 0, 0, 0, 0);
    if (!run("scale", LMH_OP_SCALE, y, a, NULL, NULL, NULL, f, NULL)) check("scale", y, 1e-6);
    f[0] = 30;
    if (!run("softcap", LMH_OP_SOFTCAP, y, a, NULL, NULL, NULL, f, NULL)) check("softcap", y, TOL);
    if (!run("swiglu", LMH_OP_SWIGLU, y, a, b, NULL, NULL, NULL, NULL)) check("swiglu", y, TOL);
    if (!run("geglu", LMH_OP_GEGLU, y, a, b, NULL, NULL, NULL, NULL)) check("geglu", y, TOL);
    tt *g = mk(LMH_F32, 1, 1000, 0, 0, -6, 6, 0);
    if (!run("sigmoid_gate", LMH_OP_SIGMOID_GATE, y, a, g, NULL, NULL, NULL, NULL))
        check("sigmoid_gate", y, TOL);
    tt *h = mk(LMH_F32, 2, 1000, 38, 0, 0, 0, 0);
    if (!run("swiglu fused", LMH_OP_SWIGLU, h, view(a, 0, LMH_F32, 2, 1000, 76, 0), NULL, NULL,
             NULL, NULL, NULL))
        check("swiglu fused", h, TOL);
    if (!run("geglu fused", LMH_OP_GEGLU, h, view(b, 0, LMH_F32, 2, 1000, 76, 0), NULL, NULL, NULL,
             NULL, NULL))
        check("geglu fused", h, TOL);
    /* (ABI 1.10) the clamped SwiGLU of interleaved pairs: gate and up well past the limit */
    float oai[8] = {1.702f, 7.0f};
    if (!run("swiglu_oai", LMH_OP_SWIGLU_OAI, h, view(a, 0, LMH_F32, 2, 1000, 76, 0), NULL, NULL,
             NULL, oai, NULL))
        check("swiglu_oai", h, TOL);
    oai[1] = 0.5f;
    if (!run("swiglu_oai limit 0.5", LMH_OP_SWIGLU_OAI, h, view(b, 0, LMH_F32, 2, 1000, 76, 0),
             NULL, NULL, NULL, oai, NULL))
        check("swiglu_oai limit 0.5", h, TOL);
    tt *t3 = mk(LMH_F32, 3, 5, 7, 9, -1, 1, 0), *t3d = mk(LMH_F32, 3, 7, 5, 9, 0, 0, 0);
    if (!run("transpose", LMH_OP_TRANSPOSE, t3d, t3, NULL, NULL, NULL, NULL, NULL))
        check("transpose", t3d, 0);
    free_all();
}

/* A rope's operands for 6 rows: positions up to 30000, rot / 2 inverse frequencies. */
static void rope_inputs(int32_t rot, tt **pos, tt **inv) {
    static const int32_t p[6] = {0, 1, 7, 100, 4095, 30000};
    float f[512];
    for (int i = 0; i < rot / 2; i++) f[i] = powf(10000.0f, -2.0f * i / rot);
    int64_t ne = rot / 2;
    *pos = mk_i32(1, 6, 0, p);
    *inv = mk_raw(LMH_F32, 1, &ne, f, 0);
}

static void t_rope(void) {
    static const int32_t cfg[][3] = {{64, 64, 0}, {64, 64, 1}, {64, 32, 0}, {80, 40, 1}, {6, 2, 0}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++)
        for (int inplace = 0; inplace < 2; inplace++) {
            int64_t n = 6, heads = 3, hd = cfg[c][0];
            int32_t rot = cfg[c][1];
            tt *x = mk(LMH_F32, 3, n, heads, hd, -2, 2, 0);
            tt *p, *iv;
            rope_inputs(rot, &p, &iv);
            tt *y = inplace ? x : mk(LMH_F32, 3, n, heads, hd, 0, 0, 0);
            float f[8] = {c == 3 ? 1.2f : 1.0f};
            int32_t i8[8] = {rot, cfg[c][2]};
            char what[64];
            snprintf(what, sizeof what, "rope hd=%lld rot=%d style=%d%s", (long long)hd, rot,
                     cfg[c][2], inplace ? " in place" : "");
            if (!run(what, LMH_OP_ROPE, y, x, p, iv, NULL, f, i8)) check(what, y, TOL);
            free_all();
        }
}

/* Pairs the Vulkan backend runs as one dispatch (a residual add and the norm of its sum;
 * a head norm and the rope of its result in place), the cases that must not fuse, and a
 * held op that the next call flushes (a download, an op that is no pair, a refused op). */
static void t_fused(void) {
    static const int64_t dims[] = {64, 37, 1000, 4099};
    for (int di = 0; di < 4; di++)
        for (int w = 0; w < 4; w++)
            for (int inplace = 0; inplace < 2; inplace++) {
                int64_t d = dims[di], rows = di & 1 ? 1 : 5;
                tt *x = mk(LMH_F32, 2, rows, d, 0, -3, 3, 0),
                   *o = mk(LMH_F32, 2, rows, d, 0, -1, 1, 0);
                tt *sum = inplace ? x : mk(LMH_F32, 2, rows, d, 0, 0, 0, 0);
                tt *wt = w ? mk(fdt[w - 1], 1, d, 0, 0, -1, 1, LMH_TENSOR_WEIGHT) : NULL;
                tt *y = mk(LMH_F32, 2, rows, d, 0, 0, 0, 0);
                float f[8] = {1e-6f, (float)(w & 1)};
                char what[96];
                snprintf(what, sizeof what, "add + rms_norm d=%lld rows=%lld w=%d%s", (long long)d,
                         (long long)rows, w, inplace ? " in place" : "");
                if (!run(what, LMH_OP_ADD, sum, x, o, NULL, NULL, NULL, NULL) &&
                    !run(what, LMH_OP_RMS_NORM, y, sum, wt, NULL, NULL, f, NULL)) {
                    check(what, y, TOL);
                    check(what, sum, TOL);
                }
                /* the norm writing over the add's operand: recorded one by one */
                if (!run("add + rms_norm over o", LMH_OP_ADD, sum, x, o, NULL, NULL, NULL, NULL) &&
                    !run("add + rms_norm over o", LMH_OP_RMS_NORM, o, sum, wt, NULL, NULL, f,
                         NULL)) {
                    check("add + rms_norm over o", o, TOL);
                    check("add + rms_norm over o (sum)", sum, TOL);
                }
                /* an add followed by what does not pair with it */
                float sc[8] = {0.5f};
                if (!run("add, scale", LMH_OP_ADD, sum, x, o, NULL, NULL, NULL, NULL) &&
                    !run("add, scale", LMH_OP_SCALE, y, sum, NULL, NULL, NULL, sc, NULL))
                    check("add, scale", y, TOL);
                free_all();
            }
    /* an add held when the next op is refused: still recorded, before the download */
    {
        tt *x = mk(LMH_F32, 2, 3, 40, 0, -3, 3, 0), *o = mk(LMH_F32, 2, 3, 40, 0, -1, 1, 0);
        if (!run("add, refused op", LMH_OP_ADD, x, x, o, NULL, NULL, NULL, NULL)) {
            lmh_op bad = {.code = LMH_OP_COUNT, .dst = x->t[1], .src = {x->t[1]}};
            if (g_be[1].api->enqueue(g_be[1].b, &bad) == LMH_OK) {
                fprintf(stderr, "FAIL an unknown op was accepted\n");
                g_fail++;
            }
            check("add, refused op", x, TOL);
        }
        free_all();
    }
    static const int32_t cfg[][3] = {
        {128, 128, 0}, {64, 64, 1}, {80, 40, 1}, {6, 2, 0}, {256, 64, 0}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++)
        for (int w = 0; w < 2; w++)
            for (int inplace = 0; inplace < 2; inplace++) {
                int64_t n = 6, heads = 3, hd = cfg[c][0];
                int32_t rot = cfg[c][1];
                tt *x = mk(LMH_F32, 3, n, heads, hd, -2, 2, 0);
                tt *wt = w ? mk(LMH_BF16, 1, hd, 0, 0, -1, 1, LMH_TENSOR_WEIGHT) : NULL;
                tt *p, *iv;
                rope_inputs(rot, &p, &iv);
                tt *y = inplace ? x : mk(LMH_F32, 3, n, heads, hd, 0, 0, 0);
                float fn[8] = {1e-6f, (float)w}, fr[8] = {c == 2 ? 1.2f : 1.0f};
                int32_t i8[8] = {rot, cfg[c][2]};
                char what[96];
                snprintf(what, sizeof what, "rms_norm + rope hd=%lld rot=%d style=%d w=%d%s",
                         (long long)hd, rot, cfg[c][2], w, inplace ? " in place" : "");
                if (!run(what, LMH_OP_RMS_NORM, x, x, wt, NULL, NULL, fn, NULL) &&
                    !run(what, LMH_OP_ROPE, y, x, p, iv, NULL, fr, i8)) {
                    check(what, y, TOL);
                    check(what, x, TOL);
                }
                free_all();
            }
    /* the cache append after them: (norm +) rope in place, then a copy of the result into
     * a cache-like tensor at a row offset (f32, f16, bf16; an odd row offset of a 16-bit
     * cache and a copy of part of the result are recorded apart), and what follows reads it */
    static const int32_t rc[][2] = {{128, 128}, {64, 32}, {6, 6}, {7, 6}};
    for (size_t c = 0; c < sizeof rc / sizeof rc[0]; c++)
        for (int norm = 0; norm < 2; norm++)
            for (int cd = 0; cd < 3; cd++)
                for (int at = 0; at < 3; at++) { /* 1, 2: rows; 0: an odd element offset */
                    int64_t n = 6, heads = 2, hd = rc[c][0], rows = 9;
                    int32_t rot = rc[c][1];
                    tt *x = mk(LMH_F32, 3, n, heads, hd, -2, 2, 0);
                    tt *wt = norm ? mk(LMH_BF16, 1, hd, 0, 0, -1, 1, LMH_TENSOR_WEIGHT) : NULL;
                    tt *p, *iv;
                    rope_inputs(rot, &p, &iv);
                    tt *cache = mk(fdt[cd], 1, rows * heads * hd + 1, 0, 0, -1, 1, 0);
                    int64_t off = at ? at * heads * hd : 1, cn = at == 2 ? n - 1 : n;
                    tt *slot = view(cache, off, fdt[cd], 3, cn, heads, hd);
                    tt *src = at == 2 ? view(x, 0, LMH_F32, 3, cn, heads, hd) : x;
                    float fn[8] = {1e-6f, 0}, fr[8] = {1.0f};
                    int32_t i8[8] = {rot, (int32_t)c & 1};
                    char what[112];
                    snprintf(what, sizeof what, "%srope + copy hd=%lld rot=%d %s at %d",
                             norm ? "rms_norm + " : "", (long long)hd, rot, lmh_dtype_name(fdt[cd]),
                             at);
                    if ((!norm || !run(what, LMH_OP_RMS_NORM, x, x, wt, NULL, NULL, fn, NULL)) &&
                        !run(what, LMH_OP_ROPE, x, x, p, iv, NULL, fr, i8) &&
                        !run(what, LMH_OP_COPY, slot, src, NULL, NULL, NULL, NULL, NULL)) {
                        if (cd)
                            check16(what, cache, 1e-2); /* an ulp of bf16: 2^-8 */
                        else
                            check(what, cache, TOL);
                        check(what, x, TOL);
                    }
                    free_all();
                }
}

/* A weight [out, in] for the fused-product tests: f32, f16, bf16 or (kind 3) 4-bit g64. */
static tt *mk_weight(int kind, int64_t out, int64_t in) {
    return kind < 3 ? mk(fdt[kind], 2, out, in, 0, -0.5f, 0.5f, LMH_TENSOR_WEIGHT)
                    : mk_quant(4, 64, LMH_BF16, 2, out, in, 0);
}

/* Frees one tensor on both backends before free_all (which then skips it). */
static void free_one(tt *x) {
    for (int k = 0; k < 2; k++) {
        g_be[k].api->tensor_free(g_be[k].b, x->t[k]);
        x->t[k] = NULL;
    }
}

static void upload_both(tt *x, const float *v) {
    for (int k = 0; k < 2; k++)
        if (g_be[k].api->upload(g_be[k].b, x->t[k], 0, v, (size_t)lmh_nelem(x->t[k]) * 4)) {
            fprintf(stderr, "FAIL: upload on backend %d\n", k);
            exit(1);
        }
}

/* Decode's products with their neighbours fused in (vk_fuse.c): a one-row RMSNorm or SwiGLU
 * computed inside the products that read its result and the residual add done by the
 * product before it, against the CPU backend; and every way a put-off op must still be
 * recorded: its result read by another kind of op or downloaded, its operands overwritten,
 * uploaded into or freed, and its result overwritten unread (dropped). Widths: 37 (scalar
 * loads), 100 (not a multiple of 8), 64 and 256 (vector loads, quantized weights). */
static void t_fused_products(void) {
    static const int64_t ins[] = {64, 37, 100, 256};
    float sc[8] = {0.5f};
    char what[128];
    for (int ii = 0; ii < 4; ii++)
        for (int wk = 0; wk < 4; wk++) {
            int64_t in = ins[ii], mid = 2 * in, out = 19 + in / 3;
            if (wk == 3 && in % 64) continue;
            for (int nw = 0; nw < 3; nw++) { /* norm weight: none, bf16, f32 with offset 1 */
                tt *x = mk(LMH_F32, 2, 1, in, 0, -3, 3, 0);
                tt *wt =
                    nw ? mk(nw == 1 ? LMH_BF16 : LMH_F32, 1, in, 0, 0, -1, 1, LMH_TENSOR_WEIGHT)
                       : NULL;
                tt *hn = mk(LMH_F32, 2, 1, in, 0, 0, 0, 0), *z = mk(LMH_F32, 2, 1, in, 0, 0, 0, 0);
                tt *W1 = mk_weight(wk, out, in), *W2 = mk_weight(wk, 2 * out + 1, in);
                tt *bias = nw == 2 ? mk(LMH_BF16, 1, out, 0, 0, -1, 1, LMH_TENSOR_WEIGHT) : NULL;
                tt *y1 = mk(LMH_F32, 2, 1, out, 0, 0, 0, 0),
                   *y2 = mk(LMH_F32, 2, 1, 2 * out + 1, 0, 0, 0, 0);
                float f[8] = {1e-6f, nw == 2 ? 1.0f : 0.0f};
                snprintf(what, sizeof what, "rms_norm -> 2 products in=%lld w=%d norm w=%d",
                         (long long)in, wk, nw);
                /* two products read the norm (the first also stores it) */
                if (!run(what, LMH_OP_RMS_NORM, hn, x, wt, NULL, NULL, f, NULL) &&
                    !run(what, LMH_OP_MATMUL, y1, hn, W1, bias, NULL, NULL, NULL) &&
                    !run(what, LMH_OP_MATMUL, y2, hn, W2, NULL, NULL, NULL, NULL)) {
                    check(what, y1, TOL);
                    check(what, y2, TOL);
                    check(what, hn, TOL);
                }
                /* read by an op that is no product: recorded before it */
                if (!run("rms_norm -> scale", LMH_OP_RMS_NORM, hn, x, wt, NULL, NULL, f, NULL) &&
                    !run("rms_norm -> scale", LMH_OP_SCALE, z, hn, NULL, NULL, NULL, sc, NULL))
                    check("rms_norm -> scale", z, TOL);
                /* its input uploaded over, then a product: the norm of the old input */
                float *nx = malloc((size_t)in * 4);
                for (int64_t i = 0; i < in; i++) nx[i] = frand(-2, 2);
                if (!run("rms_norm, upload", LMH_OP_RMS_NORM, hn, x, wt, NULL, NULL, f, NULL)) {
                    upload_both(x, nx);
                    if (!run("rms_norm, upload", LMH_OP_MATMUL, y1, hn, W1, NULL, NULL, NULL, NULL))
                        check("rms_norm, upload", y1, TOL);
                }
                free(nx);
                /* its input freed before the product */
                tt *tmp = mk(LMH_F32, 2, 1, in, 0, -3, 3, 0);
                if (!run("rms_norm, free", LMH_OP_RMS_NORM, hn, tmp, wt, NULL, NULL, f, NULL)) {
                    free_one(tmp);
                    if (!run("rms_norm, free", LMH_OP_MATMUL, y1, hn, W1, NULL, NULL, NULL, NULL))
                        check("rms_norm, free", y1, TOL);
                }
                free_all();
            }
            /* a decode MLP twice: gate and up products of h, SwiGLU in place, the down
             * product and the residual add (either operand order) */
            tt *h = mk(LMH_F32, 2, 1, in, 0, -1, 1, 0), *x = mk(LMH_F32, 2, 1, in, 0, -2, 2, 0);
            tt *g = mk(LMH_F32, 2, 1, mid, 0, 0, 0, 0), *u = mk(LMH_F32, 2, 1, mid, 0, 0, 0, 0);
            tt *s = mk(LMH_F32, 2, 1, mid, 0, 0, 0, 0), *o = mk(LMH_F32, 2, 1, in, 0, 0, 0, 0);
            tt *Wg = mk_weight(wk, mid, in), *Wu = mk_weight(wk, mid, in);
            tt *Wd = mk_weight(wk, in, mid);
            for (int rep = 0; rep < 2; rep++) {
                snprintf(what, sizeof what, "mlp + residual in=%lld w=%d rep %d", (long long)in, wk,
                         rep);
                if (!run(what, LMH_OP_MATMUL, g, h, Wg, NULL, NULL, NULL, NULL) &&
                    !run(what, LMH_OP_MATMUL, u, h, Wu, NULL, NULL, NULL, NULL) &&
                    !run(what, LMH_OP_SWIGLU, g, g, u, NULL, NULL, NULL, NULL) &&
                    !run(what, LMH_OP_MATMUL, o, g, Wd, NULL, NULL, NULL, NULL))
                    run(what, LMH_OP_ADD, x, rep ? o : x, rep ? x : o, NULL, NULL, NULL, NULL);
            }
            check(what, x, TOL);
            check(what, o, TOL);
            check(what, g, TOL); /* the SwiGLU recorded for the download */
            /* SwiGLU into another tensor, read by the product and then by a scale */
            snprintf(what, sizeof what, "swiglu -> product, scale in=%lld w=%d", (long long)in, wk);
            if (!run(what, LMH_OP_MATMUL, g, h, Wg, NULL, NULL, NULL, NULL) &&
                !run(what, LMH_OP_SWIGLU, s, g, u, NULL, NULL, NULL, NULL) &&
                !run(what, LMH_OP_MATMUL, o, s, Wd, NULL, NULL, NULL, NULL) &&
                !run(what, LMH_OP_SCALE, s, s, NULL, NULL, NULL, sc, NULL)) {
                check(what, o, TOL);
                check(what, s, TOL);
            }
            /* the up operand overwritten before the product: SwiGLU recorded first */
            snprintf(what, sizeof what, "swiglu, up overwritten in=%lld w=%d", (long long)in, wk);
            if (!run(what, LMH_OP_MATMUL, g, h, Wg, NULL, NULL, NULL, NULL) &&
                !run(what, LMH_OP_SWIGLU, g, g, u, NULL, NULL, NULL, NULL) &&
                !run(what, LMH_OP_MATMUL, u, h, Wg, NULL, NULL, NULL, NULL) &&
                !run(what, LMH_OP_MATMUL, o, g, Wd, NULL, NULL, NULL, NULL))
                check(what, o, TOL);
            /* the gate freed before the product: SwiGLU (into s) recorded first */
            snprintf(what, sizeof what, "swiglu, gate freed in=%lld w=%d", (long long)in, wk);
            tt *g2 = mk(LMH_F32, 2, 1, mid, 0, -2, 2, 0);
            if (!run(what, LMH_OP_SWIGLU, s, g2, u, NULL, NULL, NULL, NULL)) {
                free_one(g2);
                if (!run(what, LMH_OP_MATMUL, o, s, Wd, NULL, NULL, NULL, NULL))
                    check(what, o, TOL);
            }
            /* a product whose residual add reads what the product writes over: not fused */
            snprintf(what, sizeof what, "product + add over its input in=%lld w=%d", (long long)in,
                     wk);
            if (!run(what, LMH_OP_MATMUL, o, h, mk_weight(wk, in, in), NULL, NULL, NULL, NULL) &&
                !run(what, LMH_OP_ADD, h, h, o, NULL, NULL, NULL, NULL))
                check(what, h, TOL);
            free_all();
        }
}

/* Whether the fusion happens at all: two decode layers' MLPs (norm, gate and up products,
 * SwiGLU, down product, residual add) on a Vulkan backend that profiles its dispatches
 * (option profile=1) run as six fused products and nothing else, and a head norm, rope
 * and cache append (and a rope and append) as one rms_norm_rope dispatch each. */
static char g_capture[8192];
static int g_capturing;

static void capture_log(int level, const char *fmt, ...) {
    (void)level;
    if (!g_capturing) return;
    size_t n = strlen(g_capture);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_capture + n, sizeof g_capture - n, fmt, ap);
    va_end(ap);
    n = strlen(g_capture);
    if (n + 1 < sizeof g_capture) strcpy(g_capture + n, "\n");
}

/* The pass's options for the Vulkan backend (lmh_backend_opts.params). */
static const char *g_vk_params;

/* A Vulkan backend with option profile=mode (and the pass's) whose log can be captured; NULL
 * (a failure counted) where it cannot be made. */
static lmh_backend *profiled_backend(const char *mode, const char *what) {
    static const lmh_host_api host = {
        .size = sizeof(lmh_host_api), .abi_minor = LMH_ABI_MINOR, .log = capture_log};
    char params[64];
    snprintf(params, sizeof params, "profile=%s%s%s", mode, g_vk_params ? "," : "",
             g_vk_params ? g_vk_params : "");
    lmh_backend_opts o = {.size = sizeof o, .threads = 1, .params = params};
    lmh_backend *vb = NULL;
    char err[256];
    int rc = g_be[1].api->create(&host, &o, &vb, err, sizeof err);
    if (rc) {
        fprintf(stderr, "FAIL %s: create: %s\n", what, err);
        g_fail++;
        return NULL;
    }
    return vb;
}

/* Two decode layers' MLPs (norm, gate and up products, SwiGLU, down product, residual add)
 * of width MLP_D and MLP_M, enqueued on vb; t: x wt hn g u Wg Wu Wd o, made from buf.
 * Nonzero where something failed. */
enum { MLP_D = 64, MLP_M = 128 };
static int mlp_layers(lmh_backend *vb, lmh_tensor *t[9], const float *buf) {
    const lmh_backend_api *api = g_be[1].api;
    int64_t ne[5][2] = {{1, MLP_D}, {MLP_D, 0}, {1, MLP_M}, {MLP_M, MLP_D}, {MLP_D, MLP_M}};
    static const int shape[9] = {0, 1, 0, 2, 2, 3, 3, 4, 0};
    int rc = 0;
    for (int i = 0; i < 9; i++) {
        t[i] = api->tensor_new(vb, LMH_F32, shape[i] == 1 ? 1 : 2, ne[shape[i]],
                               i == 1 || (i >= 5 && i <= 7) ? LMH_TENSOR_WEIGHT : 0);
        rc |= !t[i] || api->upload(vb, t[i], 0, buf, (size_t)lmh_nelem(t[i]) * 4);
    }
    const lmh_op ops[6] = {
        {.code = LMH_OP_RMS_NORM, .dst = t[2], .src = {t[0], t[1]}, .p.f = {1e-6f}},
        {.code = LMH_OP_MATMUL, .dst = t[3], .src = {t[2], t[5]}},
        {.code = LMH_OP_MATMUL, .dst = t[4], .src = {t[2], t[6]}},
        {.code = LMH_OP_SWIGLU, .dst = t[3], .src = {t[3], t[4]}},
        {.code = LMH_OP_MATMUL, .dst = t[8], .src = {t[3], t[7]}},
        {.code = LMH_OP_ADD, .dst = t[0], .src = {t[0], t[8]}}};
    for (int layer = 0; layer < 2 && !rc; layer++)
        for (int i = 0; i < 6; i++) rc |= g_be[1].api->enqueue(vb, &ops[i]);
    return rc;
}

/* Destroys vb with its log captured in g_capture. Whether there is a profile to check (a
 * check counted): not where rc says the work failed (a failure counted), nor where the
 * device has no timestamps. */
static int destroy_captured(lmh_backend *vb, int rc, const char *what) {
    g_capture[0] = 0;
    g_capturing = 1;
    g_be[1].api->destroy(vb);
    g_capturing = 0;
    if (rc) {
        fprintf(stderr, "FAIL %s: enqueue or sync failed\n", what);
        g_fail++;
        return 0;
    }
    if (!strstr(g_capture, "profile:")) {
        printf("  (%s not checked: the device has no timestamps)\n", what);
        return 0;
    }
    g_checks++;
    return 1;
}

static void t_fused_dispatches(void) {
    const lmh_backend_api *api = g_be[1].api;
    lmh_backend *vb = profiled_backend("2", "fused dispatches"); /* per shader, and grid */
    if (!vb) return;
    enum { D = MLP_D };
    static float buf[MLP_M * MLP_D];
    for (int i = 0; i < MLP_M * MLP_D; i++) buf[i] = frand(-1, 1);
    lmh_tensor *t[9];
    int rc = mlp_layers(vb, t, buf);
    lmh_tensor *wt = t[1];
    /* keys' head norm, rope and cache append (f16), then the rope and append alone: two
     * rms_norm_rope dispatches */
    int64_t kne[3] = {1, 2, D}, cne[3] = {4, 2, D}, one = 1, half = D / 2;
    lmh_tensor *k3 = api->tensor_new(vb, LMH_F32, 3, kne, 0);
    lmh_tensor *cache = api->tensor_new(vb, LMH_F16, 3, cne, 0);
    lmh_tensor *pos = api->tensor_new(vb, LMH_I32, 1, &one, 0);
    lmh_tensor *inv = api->tensor_new(vb, LMH_F32, 1, &half, LMH_TENSOR_WEIGHT);
    lmh_tensor *slot = cache ? api->tensor_view(vb, cache, 2 * 2 * D * 2, LMH_F16, 3, kne) : NULL;
    int32_t p5 = 5;
    if (!k3 || !cache || !pos || !inv || !slot || api->upload(vb, k3, 0, buf, 2 * D * 4) ||
        api->upload(vb, pos, 0, &p5, 4) || api->upload(vb, inv, 0, buf, (size_t)half * 4))
        rc = 1;
    const lmh_op kops[3] = {
        {.code = LMH_OP_RMS_NORM, .dst = k3, .src = {k3, wt}, .p.f = {1e-6f}},
        {.code = LMH_OP_ROPE, .dst = k3, .src = {k3, pos, inv}, .p.i = {D}, .p.f = {1.0f}},
        {.code = LMH_OP_COPY, .dst = slot, .src = {k3}}};
    for (int i = 0; i < 3 && !rc; i++) rc |= api->enqueue(vb, &kops[i]);
    for (int i = 1; i < 3 && !rc; i++) rc |= api->enqueue(vb, &kops[i]);
    /* decode attention over 300 keys, split (lavapipe aims at 8 workgroups): the last
     * split merges the partials, one dispatch */
    enum { NKV = 300 };
    static uint16_t kv0[NKV * D];
    int64_t qne[3] = {1, 2, D}, kvne[3] = {NKV, 1, D};
    lmh_tensor *q = api->tensor_new(vb, LMH_F32, 3, qne, 0);
    lmh_tensor *y = api->tensor_new(vb, LMH_F32, 3, qne, 0);
    lmh_tensor *kc = api->tensor_new(vb, LMH_F16, 3, kvne, 0);
    lmh_tensor *vc = api->tensor_new(vb, LMH_F16, 3, kvne, 0);
    int32_t plast = NKV - 1;
    if (!q || !y || !kc || !vc || api->upload(vb, q, 0, buf, 2 * D * 4) ||
        api->upload(vb, kc, 0, kv0, sizeof kv0) || api->upload(vb, vc, 0, kv0, sizeof kv0) ||
        api->upload(vb, pos, 0, &plast, 4))
        rc = 1;
    lmh_op at = {
        .code = LMH_OP_ATTENTION, .dst = y, .src = {q, kc, vc, pos}, .p.i = {NKV}, .p.f = {0.125f}};
    if (!rc) rc |= api->enqueue(vb, &at);
    api->tensor_free(vb, vc);
    api->tensor_free(vb, kc);
    api->tensor_free(vb, y);
    api->tensor_free(vb, q);
    api->tensor_free(vb, slot);
    api->tensor_free(vb, inv);
    api->tensor_free(vb, pos);
    api->tensor_free(vb, cache);
    api->tensor_free(vb, k3);
    /* freed unread: the last SwiGLU's result (recorded at a sync, which may be followed
     * by a download of anything) is dropped */
    for (int i = 0; i < 9; i++) api->tensor_free(vb, t[i]);
    rc |= api->sync(vb);
    if (!destroy_captured(vb, rc, "fused dispatches")) return;
    int fused = 0, rope = 0, attn = 0, other = 0, by_grid = 0;
    for (const char *l = g_capture; (l = strstr(l, "profile: ")); l++) {
        char name[32];
        unsigned long long n;
        unsigned groups;
        int end = 0;
        if (sscanf(l, "profile: %31s %u workgroups %llu dispatches%n", name, &groups, &n, &end) ==
                3 &&
            end) {
            by_grid += (int)n;
            continue;
        }
        if (sscanf(l, "profile: %31s %llu dispatches%n", name, &n, &end) != 2 || !end) continue;
        if (!strcmp(name, "matvec1_fx"))
            fused += (int)n;
        else if (!strcmp(name, "rms_norm_rope"))
            rope += (int)n;
        else if (!strcmp(name, "attention") || !strcmp(name, "attn_decode"))
            attn += (int)n;
        else
            other += (int)n;
    }
    if (by_grid != fused + rope + attn + other) {
        fprintf(stderr, "FAIL profile per grid: %d dispatches, %d per shader:\n%s", by_grid,
                fused + rope + attn + other, g_capture);
        g_fail++;
    }
    if (fused != 6 || rope != 2 || attn != 1 || other) {
        fprintf(stderr,
                "FAIL fused dispatches: %d fused products, %d norm + rope + append, %d "
                "attention and %d other dispatches (want 6, 2, 1 and 0):\n%s",
                fused, rope, attn, other, g_capture);
        g_fail++;
    }
}

/* profile=3: the time between barriers, by step. Two decode layers' MLPs are two
 * fused steps each (the gate and up products; the down product with SwiGLU and the residual
 * add), so the log names a step of two products and one of one product, each twice (the
 * first pair after the uploads' full barrier), steps of copies, and at most one SwiGLU (the
 * last, whose result the sync makes it record). */
static void t_step_profile(void) {
    lmh_backend *vb = profiled_backend("3", "step profile");
    if (!vb) return;
    static float buf[MLP_M * MLP_D];
    for (int i = 0; i < MLP_M * MLP_D; i++) buf[i] = frand(-1, 1);
    lmh_tensor *t[9];
    int rc = mlp_layers(vb, t, buf);
    rc |= g_be[1].api->sync(vb);
    for (int i = 0; i < 9; i++) g_be[1].api->tensor_free(vb, t[i]);
    if (!destroy_captured(vb, rc, "step profile")) return;
    int pairs = 0, downs = 0, uploads = 0, swiglu = 0, others = 0;
    for (const char *l = g_capture; (l = strstr(l, "profile: step ")); l++) {
        unsigned long long n;
        double us, ms;
        int end = 0;
        char what[256] = "", a[64] = "", b2[64] = "";
        if (sscanf(l, "profile: step %llu x %lf us = %lf ms:%n", &n, &us, &ms, &end) != 3 || !end ||
            !(us >= 0)) {
            others += 100;
            continue;
        }
        sscanf(l + end, "%255[^\n]", what);
        const char *w = what, *full = " after a full barrier:";
        if (!strncmp(w, full, strlen(full))) w += strlen(full); /* the first, after uploads */
        int words = sscanf(w, " %63s %63s", a, b2);
        if (words == 2 && !strncmp(a, "matvec1_fx/", 11) && !strncmp(b2, "matvec1_fx/", 11))
            pairs += (int)n;
        else if (words == 1 && !strncmp(a, "matvec1_fx/", 11))
            downs += (int)n;
        else if (strstr(w, "copies") && !strchr(w, '/'))
            uploads += (int)n;
        else if (words == 1 && !strncmp(a, "eltwise/", 8) && !swiglu)
            swiglu = (int)n; /* the last SwiGLU, recorded at the sync */
        else
            others += (int)n;
    }
    if (pairs != 2 || downs != 2 || uploads < 1 || swiglu > 1 || others) {
        fprintf(stderr,
                "FAIL step profile: %d gate/up steps, %d down steps, %d upload steps, %d "
                "SwiGLU steps, %d others (want 2, 2, at least 1, at most 1, 0):\n%s",
                pairs, downs, uploads, swiglu, others, g_capture);
        g_fail++;
    }
}

static void t_copy(void) {
    for (int s = 0; s < 3; s++)
        for (int d = 0; d < 3; d++) {
            if (s && d && s != d) continue;
            for (int off = 0; off < 2; off++) {
                int64_t n = 101;
                tt *src = mk(fdt[s], 1, n + 2, 0, 0, -70000, 70000, 0);
                tt *dst = mk(fdt[d], 1, n + 4, 0, 0, -1, 1, 0);
                char what[64];
                snprintf(what, sizeof what, "copy %s -> %s at +%d", lmh_dtype_name(fdt[s]),
                         lmh_dtype_name(fdt[d]), off);
                /* odd counts and offsets: 16-bit words shared with untouched neighbours */
                if (!run(what, LMH_OP_COPY, view(dst, off, fdt[d], 1, n, 0, 0),
                         view(src, 1, fdt[s], 1, n, 0, 0), NULL, NULL, NULL, NULL, NULL))
                    check(what, dst, 0);
                free_all();
            }
        }
    /* small values (f16 subnormals) and adjacent copies with no op between them */
    tt *src = mk(LMH_F32, 1, 64, 0, 0, -1e-5f, 1e-5f, 0), *dst = mk(LMH_F16, 1, 64, 0, 0, 0, 0, 0);
    for (int i = 0; i < 8; i++)
        run("copy adjacent", LMH_OP_COPY, view(dst, i * 8, LMH_F16, 1, 8, 0, 0),
            view(src, i * 8, LMH_F32, 1, 8, 0, 0), NULL, NULL, NULL, NULL, NULL);
    check("copy f32 -> f16 subnormals, adjacent views", dst, 0);
    free_all();
    /* several copies enqueued together, as a batch's cache appends are (one dispatch where
     * the device gives shaders addresses), an odd count among them (not one of them) */
    static const lmh_dtype pairs[][2] = {{LMH_F32, LMH_F32},  {LMH_F32, LMH_F16},
                                         {LMH_F32, LMH_BF16}, {LMH_F16, LMH_F16},
                                         {LMH_BF16, LMH_F32}, {LMH_F16, LMH_F32}};
    for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
        lmh_dtype sd = pairs[k][0], dd = pairs[k][1];
        tt *s = mk(sd, 1, 600, 0, 0, -100, 100, 0), *d = mk(dd, 1, 600, 0, 0, 0, 0, 0);
        static const int at[][2] = {{0, 64}, {64, 130}, {200, 2}, {202, 7}, {210, 300}, {510, 90}};
        char what[64];
        snprintf(what, sizeof what, "copies together %s -> %s", lmh_dtype_name(sd),
                 lmh_dtype_name(dd));
        for (int i = 0; i < 6; i++)
            run(what, LMH_OP_COPY, view(d, at[i][0], dd, 1, at[i][1], 0, 0),
                view(s, 599 - at[i][0] - at[i][1] + 1, sd, 1, at[i][1], 0, 0), NULL, NULL, NULL,
                NULL, NULL);
        check(what, d, 0);
        free_all();
    }
}

/* The dispatches a shader took in a captured profile=1 log (0 where none). */
static int profiled_count(const char *shader) {
    char key[64];
    snprintf(key, sizeof key, "profile: %s ", shader);
    const char *at = strstr(g_capture, key);
    int n = 0;
    return at && sscanf(at + strlen(key), " %d dispatches", &n) == 1 ? n : 0;
}

/* Ops held to run as one dispatch (vk_fuse.c's seq_joins): a copy that reads what a held
 * copy writes does not join them. Copies A -> B and X -> Y, then B -> C: one copy_seqs
 * dispatch for the first two, and the third after it as a copy of its own; C is A. */
static void t_seq_deps(void) {
    const char *what = "held copies: a dependent one does not join";
    if (!strstr(g_be[1].api->describe(g_be[1].b), "buffer addresses")) return;
    const lmh_backend_api *api = g_be[1].api;
    /* held from two on (a GPU's default waits for 16) */
    char *saved = test_debug_save();
    test_debug_set("vk-attn-seqs", "2");
    lmh_backend *vb = profiled_backend("1", what);
    test_debug_restore(saved);
    if (!vb) return;
    int64_t n = 64;
    float a[64], c[64];
    for (int i = 0; i < 64; i++) a[i] = frand(-1, 1);
    lmh_tensor *t[5];
    int rc = 0;
    for (int i = 0; i < 5; i++) rc |= !(t[i] = api->tensor_new(vb, LMH_F32, 1, &n, 0));
    if (!rc) rc = api->upload(vb, t[0], 0, a, sizeof a) || api->upload(vb, t[2], 0, a, sizeof a);
    const lmh_op ops[3] = {{.code = LMH_OP_COPY, .dst = t[1], .src = {t[0]}},
                           {.code = LMH_OP_COPY, .dst = t[3], .src = {t[2]}},
                           {.code = LMH_OP_COPY, .dst = t[4], .src = {t[1]}}};
    for (int i = 0; i < 3 && !rc; i++) rc = api->enqueue(vb, &ops[i]);
    if (!rc) rc = api->download(vb, t[4], 0, c, sizeof c);
    g_checks++;
    if (!rc && memcmp(a, c, sizeof a)) {
        fprintf(stderr, "FAIL %s: the last copy read its source before the first wrote it\n", what);
        g_fail++;
    }
    for (int i = 0; i < 5; i++) api->tensor_free(vb, t[i]);
    if (destroy_captured(vb, rc, what) &&
        (profiled_count("copy_seqs") != 1 || profiled_count("copy") != 1)) {
        fprintf(stderr, "FAIL %s: %d copy_seqs and %d copy dispatches (want 1 and 1):\n%s", what,
                profiled_count("copy_seqs"), profiled_count("copy"), g_capture);
        g_fail++;
    }
}

typedef struct attn_cfg {
    int n, heads, kvh, d, dv, cap, n_kv, kv0, window, ring, total;
    float scale, softcap;
    lmh_dtype kdt;
    const char *name;
} attn_cfg;

static void t_attention(void) {
    /* prefill attention on matrix cores (the fast precision mode) takes f16 queries, keys,
     * probabilities and values (attn_coop.comp) */
    const double attn_tol = strstr(g_be[1].api->describe(g_be[1].b), "matrix cores") ? 3e-3 : TOL;
    static const attn_cfg cfgs[] = {
        {9, 4, 2, 64, 64, 9, 9, 0, 0, 0, 0, 0.125f, 0, LMH_F32, "prefill causal"},
        {1, 4, 2, 64, 64, 300, 300, 0, 0, 0, 0, 0.125f, 0, LMH_F16, "decode split-K"},
        {1, 8, 2, 64, 64, 1000, 700, 0, 0, 0, 0, 0.125f, 0, LMH_BF16, "decode split-K, GQA 4"},
        {12, 2, 1, 32, 32, 12, 12, 0, 5, 0, 0, 0.2f, 0, LMH_F32, "prefill window 5"},
        {3, 2, 2, 32, 32, 40, 40, 0, 7, 0, 0, 0.2f, 0, LMH_F16, "decode window"},
        {2, 4, 2, 64, 64, 8, 8, 0, 8, 8, 20, 0.125f, 0, LMH_F32, "ring"},
        {3, 4, 1, 64, 64, 10, 10, 0, 10, 10, 13, 0.125f, 0, LMH_F16, "ring, more keys"},
        {5, 4, 2, 256, 256, 30, 25, 0, 0, 0, 0, 0.0625f, 50, LMH_BF16, "soft-cap head 256"},
        {4, 6, 3, 64, 32, 20, 20, 3, 0, 0, 0, 0.125f, 0, LMH_F32, "dv != d, kv0 = 3"},
        {3, 2, 1, 20, 20, 17, 17, 0, 0, 0, 0, 0.3f, 0, LMH_F16, "head dim 20 (unvectorised)"},
        {2, 2, 1, 64, 64, 4, 0, 0, 0, 0, 0, 0.125f, 0, LMH_F32, "no keys"},
        {70, 2, 1, 64, 64, 70, 70, 0, 0, 0, 0, 0.125f, 30, LMH_F32, "prefill 70 rows"},
        {1, 16, 8, 128, 128, 600, 600, 0, 0, 0, 0, 0.088f, 0, LMH_F16, "decode d 128, 8 kv heads"},
        {2, 4, 4, 512, 512, 40, 40, 0, 0, 0, 0, 0.044f, 0, LMH_BF16, "head dim 512"},
        /* the decode kernel (attn_decode.comp) where the device has subgroup shuffles */
        {1, 16, 8, 128, 128, 900, 900, 0, 0, 0, 0, 0.088f, 0, LMH_F32, "decode d 128 f32"},
        {1, 8, 2, 128, 128, 1500, 1500, 0, 400, 0, 0, 0.088f, 30, LMH_F32,
         "decode window 400, soft-cap"},
        {1, 4, 1, 64, 64, 300, 300, 0, 256, 300, 1234, 0.125f, 0, LMH_BF16, "decode ring"},
        {4, 8, 2, 32, 32, 70, 70, 0, 0, 0, 0, 0.17f, 0, LMH_F16, "4 rows, 16 queries a head"},
        {1, 2, 1, 64, 64, 5, 3, 0, 0, 0, 0, 0.125f, 0, LMH_F32, "decode, 3 keys"},
        /* a GPU's 16 lanes a key: 8 queries a workgroup, their merge in two passes */
        {4, 8, 2, 128, 128, 600, 600, 0, 0, 0, 0, 0.088f, 0, LMH_F32, "4 rows d 128"},
        /* prefill with enough queries for the matrix cores' kernel (attn_coop.comp, where
         * the fast mode turns it on: from 16 workgroups of 128 queries) */
        {256, 8, 2, 128, 128, 256, 256, 0, 0, 0, 0, 0.088f, 0, LMH_F32, "256 rows GQA 4"},
        {200, 16, 8, 64, 64, 200, 200, 0, 50, 0, 0, 0.125f, 30, LMH_BF16,
         "200 rows window 50, soft-cap"},
        {128, 16, 8, 128, 128, 300, 290, 7, 0, 0, 0, 0.088f, 0, LMH_F16, "128 rows after 162"},
        {128, 16, 8, 64, 64, 160, 160, 0, 160, 160, 400, 0.125f, 0, LMH_F16, "128 rows, ring"},
    };
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
        const attn_cfg *a = &cfgs[c];
        tt *q = mk(LMH_F32, 3, a->n, a->heads, a->d, -1, 1, 0);
        tt *K = mk(a->kdt, 3, a->cap, a->kvh, a->d, -1, 1, 0);
        tt *V = mk(a->kdt, 3, a->cap, a->kvh, a->dv, -1, 1, 0);
        int32_t pos[256];
        int last = a->ring ? a->total - 1 : a->kv0 + a->n_kv - 1;
        for (int i = 0; i < a->n; i++) pos[i] = last - (a->n - 1 - i);
        tt *p = mk_i32(1, a->n, 0, pos);
        tt *y = mk(LMH_F32, 3, a->n, a->heads, a->dv, 5, 5, 0);
        float f[8] = {a->scale, a->softcap};
        int32_t iv[8] = {a->n_kv, a->kv0, a->window, a->ring, a->total};
        char what[96];
        snprintf(what, sizeof what, "attention %s (%s)", a->name, lmh_dtype_name(a->kdt));
        if (!run(what, LMH_OP_ATTENTION, y, q, K, V, p, f, iv)) check(what, y, attn_tol);
        /* (ABI 1.10) with per-head sinks, some above every logit: every kernel's way */
        g_sinks = mk(LMH_F32, 1, a->heads, 0, 0, -2, 6, 0);
        snprintf(what, sizeof what, "attention %s (%s), sinks", a->name, lmh_dtype_name(a->kdt));
        if (!run(what, LMH_OP_ATTENTION, y, q, K, V, p, f, iv)) check(what, y, attn_tol);
        g_sinks = NULL;
        free_all();
    }
    /* K/V as views at an odd row offset: unaligned bindings */
    tt *Kb = mk(LMH_F16, 3, 21, 1, 24, -1, 1, 0), *Vb = mk(LMH_F16, 3, 21, 1, 24, -1, 1, 0);
    tt *q = mk(LMH_F32, 3, 2, 2, 24, -1, 1, 0), *y = mk(LMH_F32, 3, 2, 2, 24, 0, 0, 0);
    int32_t pos[2] = {18, 19};
    tt *p = mk_i32(1, 2, 0, pos);
    float f[8] = {0.2f};
    int32_t iv[8] = {20, 0};
    if (!run("attention K/V views", LMH_OP_ATTENTION, y, q, view(Kb, 24, LMH_F16, 3, 20, 1, 24),
             view(Vb, 24, LMH_F16, 3, 20, 1, 24), p, f, iv))
        check("attention K/V views", y, TOL);
    free_all();
}

/* Decode attention of several sequences enqueued one after another, each over its own
 * cache (key counts with and without splits, rings): the Vulkan backend may run them as
 * one dispatch (attn_decode.comp with SEQS). Each result is checked against the CPU, and
 * bit for bit against the same op run alone (a download after it). */
static void t_attention_seqs(void) {
    enum { NS = 5, H = 8, KVH = 2, D = 64 };
    static const int groups[2][NS][3] = {
        /* n_kv (rows held), ring, total */
        {{300, 0, 0}, {17, 0, 0}, {1000, 0, 0}, {64, 0, 0}, {3, 0, 0}},
        {{300, 300, 1234}, {40, 0, 0}, {260, 260, 270}, {256, 256, 999}, {200, 0, 0}}};
    for (int g = 0; g < 2; g++) {
        int window = g ? 256 : 0;
        /* the second group with sinks (ABI 1.10), the same for all: still one dispatch */
        g_sinks = g ? mk(LMH_F32, 1, H, 0, 0, -1, 3, 0) : NULL;
        tt *q = mk(LMH_F32, 3, NS, H, D, -1, 1, 0);
        tt *yb = mk(LMH_F32, 3, NS, H, D, 5, 5, 0), *ys[NS], *K[NS], *V[NS];
        int32_t pos[NS];
        for (int j = 0; j < NS; j++) {
            const int *c = groups[g][j];
            int rows = c[1] ? c[1] : c[0];
            K[j] = mk(g ? LMH_F32 : LMH_F16, 3, rows, KVH, D, -1, 1, 0);
            V[j] = mk(g ? LMH_F32 : LMH_F16, 3, rows, KVH, D, -1, 1, 0);
            pos[j] = c[1] ? c[2] - 1 : c[0] - 1;
            ys[j] = mk(LMH_F32, 3, 1, H, D, 5, 5, 0);
        }
        tt *p = mk_i32(1, NS, 0, pos);
        char what[96];
        for (int pass = 0; pass < 2; pass++)
            for (int j = 0; j < NS; j++) {
                const int *c = groups[g][j];
                float f[8] = {0.125f};
                int32_t iv[8] = {c[0], 0, window, c[1], c[1] ? c[2] : 0};
                snprintf(what, sizeof what, "attention of %d sequences, %s: sequence %d%s", NS,
                         g ? "window 256, rings" : "no window", j, pass ? "" : " alone");
                /* pass 0: each alone, its result downloaded before the next; pass 1: all
                 * enqueued together, into rows of one tensor */
                tt *y = pass ? view(yb, (int64_t)j * H * D, LMH_F32, 3, 1, H, D) : ys[j];
                if (run(what, LMH_OP_ATTENTION, y, view(q, (int64_t)j * H * D, LMH_F32, 3, 1, H, D),
                        K[j], V[j], view(p, j, LMH_I32, 1, 1, 0, 0), f, iv))
                    continue;
                if (!pass) check(what, y, TOL);
            }
        snprintf(what, sizeof what, "attention of %d sequences together, %s", NS,
                 g ? "window 256, rings" : "no window");
        check(what, yb, TOL);
        size_t nb, n1;
        float *all = fetch(yb, 1, &nb);
        for (int j = 0; j < NS; j++) {
            float *one = fetch(ys[j], 1, &n1);
            g_checks++;
            if (memcmp(one, all + (size_t)j * H * D, n1)) {
                fprintf(stderr, "FAIL %s: sequence %d differs from its result alone\n", what, j);
                g_fail++;
            }
            free(one);
        }
        free(all);
        g_sinks = NULL;
        free_all();
    }
}

static void t_moe(void) {
    for (int renorm = 0; renorm < 2; renorm++) {
        static const int cfg[][3] = {{5, 8, 2}, {3, 60, 4}, {40, 16, 8}};
        for (int c = 0; c < 3; c++) {
            int n = cfg[c][0], E = cfg[c][1], k = cfg[c][2];
            tt *lg = mk(LMH_F32, 2, n, E, 0, -3, 3, 0);
            tt *w = mk(LMH_F32, 2, n, k, 0, 0, 0, 0), *ids = mk_i32(2, n, k, NULL);
            int32_t iv[8] = {k, renorm};
            char what[64];
            snprintf(what, sizeof what, "moe_route n=%d E=%d k=%d renorm=%d", n, E, k, renorm);
            if (!run(what, LMH_OP_MOE_ROUTE, w, lg, ids, NULL, NULL, NULL, iv)) {
                check(what, w, 1e-5);
                check(what, ids, 0);
            }
            free_all();
        }
    }
    static const int mm[][5] = {/* n, k, E, in, out */
                                {1, 2, 8, 64, 48}, {1, 4, 6, 37, 21},  {3, 2, 4, 64, 40},
                                {9, 2, 4, 64, 70}, {33, 3, 5, 48, 33}, {70, 2, 8, 40, 130}};
    for (size_t c = 0; c < sizeof mm / sizeof mm[0]; c++)
        for (int w = 0; w < 3; w++)
            for (int per_slot = 0; per_slot < 2; per_slot++) {
                int n = mm[c][0], k = mm[c][1], E = mm[c][2], in = mm[c][3], out = mm[c][4];
                tt *x = per_slot ? mk(LMH_F32, 3, n, k, in, -1, 1, 0)
                                 : mk(LMH_F32, 2, n, in, 0, -1, 1, 0);
                tt *W = mk(fdt[w], 3, E, out, in, -0.5f, 0.5f, LMH_TENSOR_WEIGHT);
                int32_t ids[512];
                for (int i = 0; i < n * k; i++) ids[i] = (int32_t)(frand(0, 1) * E) % E;
                if (c == 2) ids[1] = -1, ids[4] = E; /* out of range: rows of zeros */
                tt *id = mk_i32(2, n, k, ids);
                tt *y = mk(LMH_F32, 3, n, k, out, 3, 3, 0);
                char what[96];
                snprintf(what, sizeof what, "moe_matmul n=%d k=%d E=%d %dx%d %s%s", n, k, E, in,
                         out, lmh_dtype_name(fdt[w]), per_slot ? " per slot" : "");
                if (!run(what, LMH_OP_MOE_MATMUL, y, x, W, id, NULL, NULL, NULL))
                    check(what, y, TOL);
                free_all();
            }
    tt *y = mk(LMH_F32, 3, 6, 3, 50, -1, 1, 0), *wt = mk(LMH_F32, 2, 6, 3, 0, 0, 1, 0);
    tt *o = mk(LMH_F32, 2, 6, 50, 0, 0, 0, 0);
    if (!run("moe_combine", LMH_OP_MOE_COMBINE, o, y, wt, NULL, NULL, NULL, NULL))
        check("moe_combine", o, TOL);
    free_all();
}

/* MLX-quantized weights: every bit width x group size, the scale dtypes in turn; matvec
 * (1..4 rows, vectorised and not), tiled matmul (odd row and column counts, bias), the
 * gathered rows of a quantized table, and expert matmuls over a quantized stack. */
static void t_quant(void) {
    /* products of 128 rows or more run on matrix cores in the fast mode (qmatmul_coop: the
     * codes dequantized to f16), as the float ones do */
    const double mm_tol = strstr(g_be[1].api->describe(g_be[1].b), "matrix cores") ? 3e-3 : TOL;
    static const int bitss[] = {2, 3, 4, 5, 6, 8};
    static const int32_t groups[] = {32, 64, 128};
    int combo = 0;
    for (int bi = 0; bi < 6; bi++)
        for (int gi = 0; gi < 3; gi++, combo++) {
            int bits = bitss[bi];
            int32_t group = groups[gi];
            lmh_dtype sdt = fdt[combo % 3];
            char what[128];
            /* get_rows */
            {
                int64_t V = 37, d = 256;
                tt *tab = mk_quant(bits, group, sdt, 2, V, d, 0);
                int32_t ids[7] = {0, 36, 5, -1, 37, 5, 17};
                tt *id = mk_i32(1, 7, 0, ids), *dst = mk(LMH_F32, 2, 7, d, 0, 9, 9, 0);
                snprintf(what, sizeof what, "get_rows q%d g%d %s", bits, group,
                         lmh_dtype_name(sdt));
                if (!run(what, LMH_OP_GET_ROWS, dst, tab, id, NULL, NULL, NULL, NULL))
                    check(what, dst, 1e-6);
                free_all();
            }
            /* matmul: matrix-vector and tiled */
            static const int64_t shapes[][3] = {{1, 128, 37},     {2, 384, 20},    {4, 256, 65},
                                                {3, 128, 130},    {5, 256, 33},    {19, 128, 40},
                                                {70, 128, 70},    {130, 384, 129}, {70, 1024, 40},
                                                {256, 1024, 300}, {1, 3072, 21}};
            for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
                int64_t rows = shapes[sh][0], in = shapes[sh][1], out = shapes[sh][2];
                if (in % group) continue;
                if (rows >= 256 && group != 64) continue; /* (every width once: lavapipe's time) */
                int bias = (int)(sh + (size_t)combo) % 3 == 0;
                tt *x = mk(LMH_F32, 2, rows, in, 0, -1, 1, 0);
                tt *W = mk_quant(bits, group, sdt, 2, out, in, 0);
                tt *bt = bias ? mk(fdt[sh % 3], 1, out, 0, 0, -1, 1, LMH_TENSOR_WEIGHT) : NULL;
                tt *y = mk(LMH_F32, 2, rows, out, 0, 0, 0, 0);
                snprintf(what, sizeof what, "matmul %lldx%lld -> %lld q%d g%d %s%s",
                         (long long)rows, (long long)in, (long long)out, bits, group,
                         lmh_dtype_name(sdt), bias ? " bias" : "");
                if (!run(what, LMH_OP_MATMUL, y, x, W, bt, NULL, NULL, NULL))
                    check(what, y, rows >= 128 ? mm_tol : TOL);
                free_all();
            }
            /* expert matmuls: a few rows (matrix-vector items) and many (tiled items) */
            static const int mm[][5] = {/* n, k, E, in, out */
                                        {1, 2, 8, 128, 48},
                                        {3, 2, 4, 256, 40},
                                        {33, 3, 5, 128, 33}};
            for (size_t c = 0; c < sizeof mm / sizeof mm[0]; c++) {
                int n = mm[c][0], k = mm[c][1], E = mm[c][2], in = mm[c][3], out = mm[c][4];
                int per_slot = (int)(c + (size_t)combo) % 2;
                tt *x = per_slot ? mk(LMH_F32, 3, n, k, in, -1, 1, 0)
                                 : mk(LMH_F32, 2, n, in, 0, -1, 1, 0);
                tt *W = mk_quant(bits, group, sdt, 3, E, out, in);
                int32_t ids[512];
                for (int i = 0; i < n * k; i++) ids[i] = (int32_t)(frand(0, 1) * E) % E;
                if (c == 2) ids[1] = -1, ids[4] = E;
                tt *id = mk_i32(2, n, k, ids);
                tt *y = mk(LMH_F32, 3, n, k, out, 3, 3, 0);
                snprintf(what, sizeof what, "moe_matmul n=%d k=%d E=%d %dx%d q%d g%d %s%s", n, k, E,
                         in, out, bits, group, lmh_dtype_name(sdt), per_slot ? " per slot" : "");
                if (!run(what, LMH_OP_MOE_MATMUL, y, x, W, id, NULL, NULL, NULL))
                    check(what, y, TOL);
                free_all();
            }
        }
    /* an input view off the binding alignment (scalar loads of x), an output view */
    for (int r = 1; r <= 6; r += 5) {
        tt *xb = mk(LMH_F32, 1, r * 128 + 3, 0, 0, -1, 1, 0);
        tt *x = view(xb, 3, LMH_F32, 2, r, 128, 0);
        tt *W = mk_quant(5, 64, LMH_BF16, 2, 40, 128, 0);
        tt *yb = mk(LMH_F32, 1, r * 40 + 1, 0, 0, 7, 7, 0);
        tt *y = view(yb, 1, LMH_F32, 2, r, 40, 0);
        if (!run("quantized matmul unaligned views", LMH_OP_MATMUL, y, x, W, NULL, NULL, NULL,
                 NULL))
            check("quantized matmul unaligned views (and the element before)", yb, TOL);
        free_all();
    }
    /* weight bytes read: codes, scales and biases of the rows used, as the CPU counts */
    lmh_backend_mem m0[2], m1[2];
    for (int k = 0; k < 2; k++) g_be[k].api->memory(g_be[k].b, &m0[k]);
    tt *x = mk(LMH_F32, 2, 2, 128, 0, -1, 1, 0), *W = mk_quant(4, 64, LMH_F16, 2, 48, 128, 0);
    tt *y = mk(LMH_F32, 2, 2, 48, 0, 0, 0, 0);
    run("quantized matmul count", LMH_OP_MATMUL, y, x, W, NULL, NULL, NULL, NULL);
    tt *tab = mk_quant(3, 32, LMH_F32, 2, 10, 128, 0);
    int32_t rid[3] = {1, 7, 7};
    tt *id3 = mk_i32(1, 3, 0, rid), *g = mk(LMH_F32, 2, 3, 128, 0, 0, 0, 0);
    run("quantized get_rows count", LMH_OP_GET_ROWS, g, tab, id3, NULL, NULL, NULL, NULL);
    tt *xe = mk(LMH_F32, 2, 3, 128, 0, -1, 1, 0), *We = mk_quant(8, 128, LMH_BF16, 3, 6, 40, 128);
    int32_t ids[6] = {1, 4, 4, 2, 1, 5};
    tt *id = mk_i32(2, 3, 2, ids), *ye = mk(LMH_F32, 3, 3, 2, 40, 0, 0, 0);
    run("quantized moe count", LMH_OP_MOE_MATMUL, ye, xe, We, id, NULL, NULL, NULL);
    for (int k = 0; k < 2; k++) {
        g_be[k].api->sync(g_be[k].b);
        g_be[k].api->memory(g_be[k].b, &m1[k]);
    }
    uint64_t r0 = m1[0].weight_bytes_read - m0[0].weight_bytes_read;
    uint64_t r1 = m1[1].weight_bytes_read - m0[1].weight_bytes_read;
    uint64_t want = 48 * (64 + 2 * 2 * 2) + 3 * (48 + 2 * 4 * 4) + 4 * 40 * (128 + 2 * 1 * 2);
    g_checks++;
    if (r0 != r1 || r1 != want) {
        fprintf(stderr, "FAIL: quantized weight bytes read: cpu %llu, vulkan %llu, want %llu\n",
                (unsigned long long)r0, (unsigned long long)r1, (unsigned long long)want);
        g_fail++;
    }
    free_all();
}

/* Microscaled 4-bit weights (LMH_MXFP4) against the CPU's (tests/cpu/test_mxfp4.c checks
 * those against a naive dequantization): gathered rows, matvec (1..4 rows) and tiled
 * matmul (odd row and column counts, bias, the rows of the matrix-core and big tiles),
 * expert matmuls over a stack, misaligned blocks, bad arguments refused and the weight
 * bytes read. */
static void t_mxfp4(void) {
    const double mm_tol = strstr(g_be[1].api->describe(g_be[1].b), "matrix cores") ? 3e-3 : TOL;
    char what[128];
    {
        tt *tab = mk_mx(2, 37, 256, 0, 1, 0);
        int32_t ids[7] = {0, 36, 5, -1, 37, 5, 17};
        tt *id = mk_i32(1, 7, 0, ids), *dst = mk(LMH_F32, 2, 7, 256, 0, 9, 9, 0);
        if (!run("get_rows mxfp4", LMH_OP_GET_ROWS, dst, tab, id, NULL, NULL, NULL, NULL))
            check("get_rows mxfp4", dst, 1e-6);
        free_all();
    }
    static const int64_t shapes[][3] = {{1, 128, 37},   {2, 384, 20},    {4, 256, 65},
                                        {3, 2880, 130}, {5, 256, 33},    {19, 128, 40},
                                        {70, 96, 70},   {130, 384, 129}, {256, 1024, 300}};
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
        int64_t rows = shapes[sh][0], in = shapes[sh][1], out = shapes[sh][2];
        int bias = sh % 3 == 1;
        tt *x = mk(LMH_F32, 2, rows, in, 0, -1, 1, 0);
        tt *W = mk_mx(2, out, in, 0, sh % 2 == 0, sh % 4 == 3);
        tt *bt = bias ? mk(fdt[sh % 3], 1, out, 0, 0, -1, 1, LMH_TENSOR_WEIGHT) : NULL;
        tt *y = mk(LMH_F32, 2, rows, out, 0, 0, 0, 0);
        snprintf(what, sizeof what, "matmul %lldx%lld -> %lld mxfp4%s", (long long)rows,
                 (long long)in, (long long)out, bias ? " bias" : "");
        if (!run(what, LMH_OP_MATMUL, y, x, W, bt, NULL, NULL, NULL))
            check(what, y, rows >= 128 ? mm_tol : TOL);
        free_all();
    }
    static const int mm[][5] = {/* n, k, E, in, out */
                                {1, 4, 8, 128, 48},
                                {3, 2, 4, 256, 40},
                                {33, 3, 5, 96, 33},
                                {70, 4, 6, 128, 72}};
    for (size_t c = 0; c < sizeof mm / sizeof mm[0]; c++) {
        int n = mm[c][0], k = mm[c][1], E = mm[c][2], in = mm[c][3], out = mm[c][4];
        int per_slot = (int)c % 2;
        tt *x = per_slot ? mk(LMH_F32, 3, n, k, in, -1, 1, 0) : mk(LMH_F32, 2, n, in, 0, -1, 1, 0);
        tt *W = mk_mx(3, E, out, in, (int)c % 2, 0);
        int32_t ids[512];
        for (int i = 0; i < n * k; i++) ids[i] = (int32_t)(frand(0, 1) * E) % E;
        if (c == 2) ids[1] = -1, ids[4] = E;
        tt *id = mk_i32(2, n, k, ids);
        tt *y = mk(LMH_F32, 3, n, k, out, 3, 3, 0);
        snprintf(what, sizeof what, "moe_matmul n=%d k=%d E=%d %dx%d mxfp4%s", n, k, E, in, out,
                 per_slot ? " per slot" : "");
        if (!run(what, LMH_OP_MOE_MATMUL, y, x, W, id, NULL, NULL, NULL)) check(what, y, TOL);
        free_all();
    }
    /* refused: a group other than 32, biases, scales not u8, a row not of whole blocks */
    static uint8_t blk[64 * 16], scs[64];
    static const int64_t ne_ok[2] = {4, 64}, ne_bad[2] = {4, 48};
    for (int k = 0; k < 2; k++) {
        const lmh_backend_api *api = g_be[k].api;
        lmh_tensor *bad[4] = {api->tensor_quant(g_be[k].b, LMH_MXFP4, 64, 2, ne_ok,
                                                (const uint32_t *)blk, LMH_U8, scs, NULL),
                              api->tensor_quant(g_be[k].b, LMH_MXFP4, 32, 2, ne_ok,
                                                (const uint32_t *)blk, LMH_U8, scs, scs),
                              api->tensor_quant(g_be[k].b, LMH_MXFP4, 32, 2, ne_ok,
                                                (const uint32_t *)blk, LMH_F16, scs, NULL),
                              api->tensor_quant(g_be[k].b, LMH_MXFP4, 32, 2, ne_bad,
                                                (const uint32_t *)blk, LMH_U8, scs, NULL)};
        for (int i = 0; i < 4; i++) {
            g_checks++;
            if (bad[i]) {
                fprintf(stderr, "FAIL: %s took bad mxfp4 arguments (case %d)\n",
                        k ? "vulkan" : "cpu", i);
                g_fail++;
                api->tensor_free(g_be[k].b, bad[i]);
            }
        }
    }
    /* weight bytes read: blocks and scales of the rows used, as the CPU counts */
    lmh_backend_mem m0[2], m1[2];
    for (int k = 0; k < 2; k++) g_be[k].api->memory(g_be[k].b, &m0[k]);
    tt *x = mk(LMH_F32, 2, 2, 128, 0, -1, 1, 0), *W = mk_mx(2, 48, 128, 0, 0, 0);
    tt *y = mk(LMH_F32, 2, 2, 48, 0, 0, 0, 0);
    run("mxfp4 matmul count", LMH_OP_MATMUL, y, x, W, NULL, NULL, NULL, NULL);
    tt *xe = mk(LMH_F32, 2, 3, 128, 0, -1, 1, 0), *We = mk_mx(3, 6, 40, 128, 0, 0);
    int32_t ids[6] = {1, 4, 4, 2, 1, 5};
    tt *id = mk_i32(2, 3, 2, ids), *ye = mk(LMH_F32, 3, 3, 2, 40, 0, 0, 0);
    run("mxfp4 moe count", LMH_OP_MOE_MATMUL, ye, xe, We, id, NULL, NULL, NULL);
    for (int k = 0; k < 2; k++) {
        g_be[k].api->sync(g_be[k].b);
        g_be[k].api->memory(g_be[k].b, &m1[k]);
    }
    uint64_t r0 = m1[0].weight_bytes_read - m0[0].weight_bytes_read;
    uint64_t r1 = m1[1].weight_bytes_read - m0[1].weight_bytes_read;
    uint64_t want = 48 * (64 + 4) + 4 * 40 * (64 + 4);
    g_checks++;
    if (r0 != r1 || r1 != want) {
        fprintf(stderr, "FAIL: mxfp4 weight bytes read: cpu %llu, vulkan %llu, want %llu\n",
                (unsigned long long)r0, (unsigned long long)r1, (unsigned long long)want);
        g_fail++;
    }
    free_all();
}

/* Memory behaviour: a freed tensor's memory is not reused before the ops that read it
 * ran; uploads larger than a staging buffer; weight bytes read counted as on the CPU. */
static void t_memory(void) {
    for (int i = 0; i < 20; i++) {
        tt *a = mk(LMH_F32, 1, 5000, 0, 0, -1, 1, 0), *y = mk(LMH_F32, 1, 5000, 0, 0, 0, 0, 0);
        float f[8] = {2};
        run("scale before free", LMH_OP_SCALE, y, a, NULL, NULL, NULL, f, NULL);
        for (int k = 0; k < 2; k++) {
            g_be[k].api->tensor_free(g_be[k].b, a->t[k]);
            a->t[k] = NULL;
        }
        mk(LMH_F32, 1, 5000, 0, 0, 100, 200, 0); /* may take the freed memory */
        check("freed input still read", y, 1e-7);
        free_all();
    }
    size_t n = (size_t)9 << 20; /* 36 MiB: several staging buffers */
    int64_t ne = (int64_t)n;
    float *big = malloc(n * 4), *back = malloc(n * 4);
    for (size_t i = 0; i < n; i++) big[i] = (float)i;
    lmh_tensor *t = g_be[1].api->tensor_new(g_be[1].b, LMH_F32, 1, &ne, 0);
    g_checks++;
    if (!t || g_be[1].api->upload(g_be[1].b, t, 0, big, n * 4) ||
        g_be[1].api->download(g_be[1].b, t, 0, back, n * 4) || memcmp(big, back, n * 4)) {
        fprintf(stderr, "FAIL: 36 MiB upload/download round trip\n");
        g_fail++;
    }
    if (t) g_be[1].api->tensor_free(g_be[1].b, t);
    free(big);
    free(back);

    /* the bandwidth probe: a rate, and its buffers given back */
    lmh_backend_mem before, after;
    double bps = 0;
    g_be[1].api->memory(g_be[1].b, &before);
    int brc = g_be[1].api->read_bandwidth(g_be[1].b, &bps);
    g_be[1].api->memory(g_be[1].b, &after);
    g_checks++;
    if (brc || !(bps > 1e6 && bps < 1e14) || after.other != before.other ||
        after.weights != before.weights) {
        fprintf(stderr, "FAIL: read_bandwidth: rc %d, %.3g bytes/s, other bytes %llu -> %llu\n",
                brc, bps, (unsigned long long)before.other, (unsigned long long)after.other);
        g_fail++;
    }

    lmh_backend_mem m0[2], m1[2];
    for (int k = 0; k < 2; k++) g_be[k].api->memory(g_be[k].b, &m0[k]);
    tt *x = mk(LMH_F32, 2, 2, 64, 0, -1, 1, 0),
       *W = mk(LMH_BF16, 2, 48, 64, 0, -1, 1, LMH_TENSOR_WEIGHT);
    tt *y = mk(LMH_F32, 2, 2, 48, 0, 0, 0, 0);
    run("matmul count", LMH_OP_MATMUL, y, x, W, NULL, NULL, NULL, NULL);
    tt *xe = mk(LMH_F32, 2, 3, 64, 0, -1, 1, 0);
    tt *We = mk(LMH_F16, 3, 6, 40, 64, -1, 1, LMH_TENSOR_WEIGHT);
    int32_t ids[6] = {1, 4, 4, 2, 1, 5};
    tt *id = mk_i32(2, 3, 2, ids), *ye = mk(LMH_F32, 3, 3, 2, 40, 0, 0, 0);
    run("moe count", LMH_OP_MOE_MATMUL, ye, xe, We, id, NULL, NULL, NULL);
    for (int k = 0; k < 2; k++) {
        g_be[k].api->sync(g_be[k].b);
        g_be[k].api->memory(g_be[k].b, &m1[k]);
    }
    uint64_t r0 = m1[0].weight_bytes_read - m0[0].weight_bytes_read;
    uint64_t r1 = m1[1].weight_bytes_read - m0[1].weight_bytes_read;
    g_checks++;
    if (r0 != r1 || r1 != 48 * 64 * 2 + 4 * 40 * 64 * 2) {
        fprintf(stderr, "FAIL: weight bytes read: cpu %llu, vulkan %llu\n", (unsigned long long)r0,
                (unsigned long long)r1);
        g_fail++;
    }
    if (m1[1].weights - m0[1].weights != m1[0].weights - m0[0].weights) {
        fprintf(stderr, "FAIL: weight bytes held differ\n");
        g_fail++;
    }
    free_all();
}

/* ---- ABI 1.7: columns, activations and the recurrent ops ------------------------------ */

/* An op of up to 8 operands on both backends. */
typedef struct opd {
    lmh_op_code code;
    tt *dst, *src[8];
    float f[8];
    int32_t i[8];
} opd;

static lmh_op op_on(const opd *o, int k) {
    lmh_op op = {.code = o->code, .dst = o->dst->t[k]};
    for (int i = 0; i < 8; i++) lmh_op_set_src(&op, i, o->src[i] ? o->src[i]->t[k] : NULL);
    memcpy(op.p.f, o->f, sizeof o->f);
    memcpy(op.p.i, o->i, sizeof o->i);
    return op;
}

static int run_op(const char *what, const opd *o) {
    for (int k = 0; k < 2; k++) {
        lmh_op op = op_on(o, k);
        if (!g_be[k].api->supports(g_be[k].b, &op)) {
            fprintf(stderr, "FAIL %s: backend %s does not support it\n", what,
                    k ? "vulkan" : "cpu");
            g_fail++;
            return -1;
        }
        int rc = g_be[k].api->enqueue(g_be[k].b, &op);
        if (rc != LMH_OK) {
            fprintf(stderr, "FAIL %s: enqueue on %s: %d\n", what, k ? "vulkan" : "cpu", rc);
            g_fail++;
            return -1;
        }
    }
    return 0;
}

/* Both backends refuse the op: supports() says no, and enqueue fails (nothing run). */
static void expect_refused(const char *what, const opd *o) {
    g_checks++;
    for (int k = 0; k < 2; k++) {
        lmh_op op = op_on(o, k);
        int sup = g_be[k].api->supports(g_be[k].b, &op);
        int rc = sup ? LMH_OK : g_be[k].api->enqueue(g_be[k].b, &op);
        if (sup || rc == LMH_OK) {
            fprintf(stderr, "FAIL %s: %s accepts it\n", what, k ? "vulkan" : "cpu");
            g_fail++;
            return;
        }
    }
}

/* The worst error over max |cpu| per op (printed at the end of each pass) */
static double g_worst[LMH_OP_COUNT];

static void check_op(const char *what, lmh_op_code code, tt *x, double tol) {
    double r = check(what, x, tol);
    if (r > g_worst[code]) g_worst[code] = r;
}

/* The Vulkan backend made again, with the pass's options and the environment as it is now
 * (settings read at create: LMHOST_DEBUG vk-scan-chunk). No tensor may be alive. */
static void vk_reopen(void) {
    lmh_backend_opts o = {.size = sizeof o, .threads = 2, .params = g_vk_params};
    char err[256] = "";
    g_be[1].api->destroy(g_be[1].b);
    if (g_be[1].api->create(&g_host, &o, &g_be[1].b, err, sizeof err)) {
        fprintf(stderr, "FAIL: vulkan backend again: %s\n", err);
        exit(1);
    }
}

/* LMH_OP_ROPE_SWITCH (ABI 1.10): rows of two sequences, one past the threshold and one at
 * it, and rows right at the boundary both ways; each Vulkan row is, bit for bit, Vulkan's
 * LMH_OP_ROPE with the table and factor it chose, and within TOL of the CPU's. */
static void t_rope_switch(void) {
    enum { THR = 32 };
    static const int32_t ends[2][6] = {{41, 41, 41, THR, THR, THR},
                                       {THR + 1, THR, 0, THR + 1, THR - 1, 1000}};
    static const int32_t cfg[][3] = {{64, 64, 0}, {64, 32, 1}, {80, 40, 0}, {6, 2, 1}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++)
        for (int inplace = 0; inplace < 2; inplace++)
            for (int es = 0; es < 2; es++) {
                int64_t n = 6, heads = 3, hd = cfg[c][0];
                int32_t rot = cfg[c][1];
                float x0[6 * 3 * 80], lf[512];
                for (int64_t i = 0; i < n * heads * hd; i++) x0[i] = frand(-2, 2);
                for (int i = 0; i < rot / 2; i++)
                    lf[i] = powf(10000.0f, -2.0f * i / rot) / (1.0f + 0.9f * (float)i);
                int64_t xne[3] = {n, heads, hd}, lne = rot / 2;
                tt *p, *sh, *lg = mk_raw(LMH_F32, 1, &lne, lf, 0), *e = mk_i32(1, n, 0, ends[es]);
                rope_inputs(rot, &p, &sh);
                tt *x = mk_raw(LMH_F32, 3, xne, x0, 0);
                tt *y = inplace ? x : mk(LMH_F32, 3, n, heads, hd, 0, 0, 0);
                char what[96];
                snprintf(what, sizeof what, "rope_switch hd=%lld rot=%d style=%d%s ends %d",
                         (long long)hd, rot, cfg[c][2], inplace ? " in place" : "", es);
                opd o = {.code = LMH_OP_ROPE_SWITCH,
                         .dst = y,
                         .src = {x, p, sh, lg, e},
                         .f = {1.25f, 0.75f},
                         .i = {rot, cfg[c][2], THR}};
                if (run_op(what, &o)) {
                    free_all();
                    continue;
                }
                check_op(what, LMH_OP_ROPE_SWITCH, y, TOL);
                size_t bytes;
                float *got = fetch(y, 1, &bytes);
                for (int t = 0; t < 2; t++) { /* each table alone, on Vulkan */
                    tt *x2 = mk_raw(LMH_F32, 3, xne, x0, 0);
                    float f[8] = {t ? 0.75f : 1.25f};
                    int32_t i8[8] = {rot, cfg[c][2]};
                    if (run(what, LMH_OP_ROPE, x2, x2, p, t ? lg : sh, NULL, f, i8)) continue;
                    float *ref = fetch(x2, 1, &bytes);
                    const size_t row = (size_t)(heads * hd);
                    for (int r = 0; r < n; r++) {
                        if ((ends[es][r] > THR) != t) continue;
                        g_checks++;
                        if (memcmp(got + r * row, ref + r * row, row * sizeof *ref)) {
                            fprintf(stderr,
                                    "FAIL %s: row %d differs from Vulkan's rope with the "
                                    "%s table\n",
                                    what, r, t ? "long" : "short");
                            g_fail++;
                        }
                    }
                    free(ref);
                }
                free(got);
                /* refusals: no row values, f32 ones, a short long table, a negative threshold */
                tt *fe = mk(LMH_F32, 1, n, 0, 0, 0, 0, 0);
                opd bad = o;
                bad.src[4] = NULL;
                expect_refused("rope_switch without row values", &bad);
                bad.src[4] = fe;
                expect_refused("rope_switch with f32 row values", &bad);
                bad = o;
                bad.i[2] = -1;
                expect_refused("rope_switch with a negative threshold", &bad);
                bad = o;
                bad.src[3] = NULL;
                expect_refused("rope_switch without a long table", &bad);
                free_all();
            }
}

static void t_cols_unary(void) {
    /* range and gather, whole tensors and views of parts (Gated DeltaNet's splits) */
    for (int rows = 1; rows <= 9; rows += 8) {
        tt *a = mk(LMH_F32, 2, rows, 50, 0, -3, 3, 0), *y = mk(LMH_F32, 2, rows, 20, 0, 9, 9, 0);
        opd o = {.code = LMH_OP_COLS, .dst = y, .src = {a}, .i = {13}};
        if (!run_op("cols range", &o)) check_op("cols range", LMH_OP_COLS, y, 0);
        o.i[0] = 30; /* the last columns */
        if (!run_op("cols range, last columns", &o)) check_op("cols last", LMH_OP_COLS, y, 0);
        int32_t idx[20];
        for (int i = 0; i < 20; i++) idx[i] = (int32_t)((i * 37 + 11) % 50);
        idx[3] = 0;
        idx[4] = 49;
        tt *id = mk_i32(1, 20, 0, idx);
        opd g = {.code = LMH_OP_COLS, .dst = y, .src = {a, id}};
        if (!run_op("cols gather", &g)) check_op("cols gather", LMH_OP_COLS, y, 0);
        /* [rows, 5 parts x 10] seen as [rows * 5, 10]: columns 2..5 of each part */
        tt *y2 = mk(LMH_F32, 2, rows, 20, 0, 9, 9, 0);
        opd p = {.code = LMH_OP_COLS,
                 .dst = view(y2, 0, LMH_F32, 2, rows * 5, 4, 0),
                 .src = {view(a, 0, LMH_F32, 2, rows * 5, 10, 0)},
                 .i = {2}};
        if (!run_op("cols of parts", &p)) check_op("cols of parts", LMH_OP_COLS, y2, 0);
        /* the CPU's refusals: past the row, indices out of range, wrong sizes */
        o.i[0] = 31;
        expect_refused("cols past the row", &o);
        o.i[0] = -1;
        expect_refused("cols from -1", &o);
        int32_t bad[20];
        memcpy(bad, idx, sizeof bad);
        bad[7] = 50;
        tt *idb = mk_i32(1, 20, 0, bad);
        opd gb = {.code = LMH_OP_COLS, .dst = y, .src = {a, idb}};
        expect_refused("cols gather index 50 of 50", &gb);
        bad[7] = -1;
        for (int k = 0; k < 2; k++) g_be[k].api->upload(g_be[k].b, idb->t[k], 0, bad, sizeof bad);
        expect_refused("cols gather index -1", &gb);
        /* made valid by an upload: the backend reads the indices again */
        for (int k = 0; k < 2; k++) g_be[k].api->upload(g_be[k].b, idb->t[k], 0, idx, sizeof idx);
        if (!run_op("cols gather, indices uploaded again", &gb))
            check_op("cols gather again", LMH_OP_COLS, y, 0);
        tt *id19 = mk_i32(1, 19, 0, idx);
        opd gs = {.code = LMH_OP_COLS, .dst = y, .src = {a, id19}};
        expect_refused("cols gather of 19 indices for 20 columns", &gs);
        tt *y3 = mk(LMH_F32, 2, rows + 1, 20, 0, 0, 0, 0);
        opd wr = {.code = LMH_OP_COLS, .dst = y3, .src = {a}, .i = {0}};
        expect_refused("cols with another row count", &wr);
        free_all();
    }
    /* every activation, past softplus's threshold and far below it */
    for (int fn = 0; fn < LMH_UNARY_COUNT; fn++) {
        tt *a = mk(LMH_F32, 2, 40, 77, 0, -30, 30, 0), *y = mk(LMH_F32, 2, 40, 77, 0, 0, 0, 0);
        tt *s = mk(LMH_F32, 1, 300, 0, 0, -105, -85, 0), *ys = mk(LMH_F32, 1, 300, 0, 0, 0, 0, 0);
        char what[64];
        snprintf(what, sizeof what, "unary %d", fn);
        opd o = {.code = LMH_OP_UNARY, .dst = y, .src = {a}, .i = {fn}};
        if (!run_op(what, &o)) check_op(what, LMH_OP_UNARY, y, TOL);
        opd o2 = {.code = LMH_OP_UNARY, .dst = ys, .src = {s}, .i = {fn}};
        if (!run_op(what, &o2)) check_op(what, LMH_OP_UNARY, ys, TOL);
        opd o3 = {.code = LMH_OP_UNARY, .dst = a, .src = {a}, .i = {fn}}; /* in place */
        if (!run_op(what, &o3)) check_op(what, LMH_OP_UNARY, a, TOL);
        free_all();
    }
    tt *a = mk(LMH_F32, 1, 10, 0, 0, -1, 1, 0), *y = mk(LMH_F32, 1, 10, 0, 0, 0, 0, 0);
    opd u = {.code = LMH_OP_UNARY, .dst = y, .src = {a}, .i = {LMH_UNARY_COUNT}};
    expect_refused("unary of an unknown function", &u);
    u.i[0] = -1;
    expect_refused("unary -1", &u);
    tt *y9 = mk(LMH_F32, 1, 9, 0, 0, 0, 0, 0);
    opd u9 = {.code = LMH_OP_UNARY, .dst = y9, .src = {a}, .i = {1}};
    expect_refused("unary of another size", &u9);
    /* the gate elementwise (ABI 1.7), and per row beside it */
    tt *x = mk(LMH_F32, 2, 33, 70, 0, -4, 4, 0), *g = mk(LMH_F32, 2, 33, 70, 0, -8, 8, 0);
    tt *gr = mk(LMH_F32, 1, 33, 0, 0, -8, 8, 0), *yg = mk(LMH_F32, 2, 33, 70, 0, 0, 0, 0);
    opd sg = {.code = LMH_OP_SIGMOID_GATE, .dst = yg, .src = {x, g}};
    if (!run_op("sigmoid_gate elementwise", &sg))
        check_op("sigmoid_gate elementwise", LMH_OP_SIGMOID_GATE, yg, TOL);
    opd sr = {.code = LMH_OP_SIGMOID_GATE, .dst = yg, .src = {x, gr}};
    if (!run_op("sigmoid_gate per row", &sr))
        check_op("sigmoid_gate per row", LMH_OP_SIGMOID_GATE, yg, TOL);
    opd si = {.code = LMH_OP_SIGMOID_GATE, .dst = x, .src = {x, g}};
    if (!run_op("sigmoid_gate elementwise in place", &si))
        check_op("sigmoid_gate in place", LMH_OP_SIGMOID_GATE, x, TOL);
    tt *gb = mk(LMH_F32, 1, 34, 0, 0, 0, 0, 0);
    opd sb = {.code = LMH_OP_SIGMOID_GATE, .dst = yg, .src = {x, gb}};
    expect_refused("sigmoid_gate of 34 gates for 33 rows", &sb);
    free_all();
}

/* the recurrent ops' weight dtypes: f32, bf16, f16 in turn */
static lmh_dtype wdt(int i) {
    return fdt[(i % 3 + 3) % 3 == 1 ? 2 : (i % 3 + 3) % 3 == 2 ? 1 : 0];
}

static void t_conv1d(void) {
    static const int rows[] = {1, 2, 7, 17, 100};
    int v = 0;
    for (int K = 2; K <= 4; K++)
        for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++)
            for (int bias = 0; bias < 2; bias++, v++) {
                int64_t C = 37 + 64 * (v % 2), n = rows[r];
                lmh_dtype dt = wdt(v);
                tt *x = mk(LMH_F32, 2, n, C, 0, -2, 2, 0), *y = mk(LMH_F32, 2, n, C, 0, 9, 9, 0);
                /* Hugging Face's [C, 1, K] every other case */
                tt *w = v % 2 ? mk(dt, 3, C, 1, K, -1, 1, LMH_TENSOR_WEIGHT)
                              : mk(dt, 2, C, K, 0, -1, 1, LMH_TENSOR_WEIGHT);
                tt *bs = bias ? mk(wdt(v + 1), 1, C, 0, 0, -1, 1, LMH_TENSOR_WEIGHT) : NULL;
                tt *st = mk(LMH_F32, 2, K - 1, C, 0, -2, 2, 0);
                int act = v % 3 == 0   ? LMH_UNARY_NONE
                          : v % 3 == 1 ? LMH_UNARY_SILU
                                       : LMH_UNARY_RELU2;
                opd o = {.code = LMH_OP_CONV1D, .dst = y, .src = {x, w, bs, st}, .i = {act}};
                char what[96];
                for (int rep = 0; rep < 2; rep++) { /* twice: the state carried over */
                    snprintf(what, sizeof what, "conv1d K=%d n=%lld C=%lld %s bias=%d act=%d #%d",
                             K, (long long)n, (long long)C, lmh_dtype_name(dt), bias, act, rep);
                    if (run_op(what, &o)) break;
                    check_op(what, LMH_OP_CONV1D, y, TOL);
                    strcat(what, " state");
                    check_op(what, LMH_OP_CONV1D, st, 0);
                }
                free_all();
            }
    /* refusals */
    tt *x = mk(LMH_F32, 2, 5, 8, 0, -1, 1, 0), *y = mk(LMH_F32, 2, 5, 8, 0, 0, 0, 0);
    tt *w = mk(LMH_F32, 2, 8, 4, 0, -1, 1, 0), *st = mk(LMH_F32, 2, 3, 8, 0, 0, 0, 0);
    opd ok = {.code = LMH_OP_CONV1D, .dst = y, .src = {x, w, NULL, st}, .i = {1}};
    if (!run_op("conv1d", &ok)) check_op("conv1d", LMH_OP_CONV1D, y, TOL);
    opd o = ok;
    o.dst = x;
    expect_refused("conv1d in place", &o);
    o = ok;
    o.src[3] = mk(LMH_F32, 2, 2, 8, 0, 0, 0, 0);
    expect_refused("conv1d state of K - 2 rows", &o);
    o = ok;
    o.src[1] = mk(LMH_F32, 2, 8, 1, 0, 0, 0, 0);
    expect_refused("conv1d K = 1", &o);
    o = ok;
    o.src[1] = mk(LMH_F32, 2, 8, 65, 0, 0, 0, 0);
    o.src[3] = mk(LMH_F32, 2, 64, 8, 0, 0, 0, 0);
    expect_refused("conv1d K = 65", &o);
    o = ok;
    o.src[2] = mk(LMH_F32, 1, 9, 0, 0, 0, 0, 0);
    expect_refused("conv1d bias of 9 for 8 channels", &o);
    o = ok;
    o.i[0] = LMH_UNARY_COUNT;
    expect_refused("conv1d unknown activation", &o);
    o = ok;
    o.src[3] = mk(LMH_F16, 2, 3, 8, 0, 0, 0, 0);
    expect_refused("conv1d f16 state", &o);
    o = ok;
    o.src[1] = NULL;
    expect_refused("conv1d without weight", &o);
    free_all();
}

/* Mamba-1 (ssd = 0) or Mamba-2 scan cases. */
typedef struct scan_cfg {
    int n, D, N; /* Mamba-1: channels, states */
    int H, P, G; /* Mamba-2 */
    int has_d, has_dtb, dt_i;
    float lo, hi;
} scan_cfg;

static void scan_case(int ssd, const scan_cfg *c, const char *mode) {
    int64_t n = c->n, nch = ssd ? (int64_t)c->H * c->P : c->D,
            GN = ssd ? (int64_t)c->G * c->N : c->N;
    int64_t nw = ssd ? c->H : c->D; /* dt's row, D's and dt_bias's size */
    lmh_dtype dt = wdt(c->dt_i);
    tt *x = mk(LMH_F32, 2, n, nch, 0, -1, 1, 0), *y = mk(LMH_F32, 2, n, nch, 0, 9, 9, 0);
    tt *dtt = mk(LMH_F32, 2, n, nw, 0, -4, 1, 0);
    tt *Al = ssd ? mk(dt, 1, c->H, 0, 0, -1, 1.5f, LMH_TENSOR_WEIGHT)
                 : mk(dt, 2, c->D, c->N, 0, -1, 1.5f, LMH_TENSOR_WEIGHT);
    tt *B = mk(LMH_F32, 2, n, GN, 0, -1, 1, 0), *C = mk(LMH_F32, 2, n, GN, 0, -1, 1, 0);
    tt *D = c->has_d ? mk(wdt(c->dt_i + 1), 1, nw, 0, 0, -1, 1, LMH_TENSOR_WEIGHT) : NULL;
    tt *dtb = c->has_dtb ? mk(wdt(c->dt_i + 2), 1, nw, 0, 0, -1, 1, LMH_TENSOR_WEIGHT) : NULL;
    tt *st =
        ssd ? mk(LMH_F32, 3, c->H, c->P, c->N, -1, 1, 0) : mk(LMH_F32, 2, c->D, c->N, 0, -1, 1, 0);
    opd o = {.code = ssd ? LMH_OP_SSD_SCAN : LMH_OP_SSM_SCAN,
             .dst = y,
             .src = {x, dtt, Al, B, C, D, dtb, st}};
    if (ssd) {
        o.i[0] = c->H;
        o.i[1] = c->G;
        o.f[0] = c->lo;
        o.f[1] = c->hi;
    }
    char what[160];
    for (int rep = 0; rep < 2; rep++) {
        if (ssd)
            snprintf(what, sizeof what,
                     "ssd_scan n=%d H=%d P=%d G=%d N=%d %s D=%d dtb=%d clamp=[%g,%g] (%s) #%d",
                     c->n, c->H, c->P, c->G, c->N, lmh_dtype_name(dt), c->has_d, c->has_dtb, c->lo,
                     c->hi, mode, rep);
        else
            snprintf(what, sizeof what, "ssm_scan n=%d D=%d N=%d %s D=%d dtb=%d (%s) #%d", c->n,
                     c->D, c->N, lmh_dtype_name(dt), c->has_d, c->has_dtb, mode, rep);
        if (run_op(what, &o)) break;
        check_op(what, o.code, y, TOL);
        strcat(what, " state");
        check_op(what, o.code, st, TOL);
    }
    free_all();
}

static void scan_refusals(void) {
    tt *x = mk(LMH_F32, 2, 3, 8, 0, -1, 1, 0), *y = mk(LMH_F32, 2, 3, 8, 0, 0, 0, 0);
    tt *dt = mk(LMH_F32, 2, 3, 8, 0, -1, 1, 0), *Al = mk(LMH_F32, 2, 8, 4, 0, -1, 1, 0);
    tt *B = mk(LMH_F32, 2, 3, 4, 0, -1, 1, 0), *C = mk(LMH_F32, 2, 3, 4, 0, -1, 1, 0);
    tt *st = mk(LMH_F32, 2, 8, 4, 0, 0, 0, 0);
    opd ok = {.code = LMH_OP_SSM_SCAN, .dst = y, .src = {x, dt, Al, B, C, NULL, NULL, st}};
    if (!run_op("ssm_scan small", &ok)) check_op("ssm_scan small", LMH_OP_SSM_SCAN, y, TOL);
    opd o = ok;
    o.dst = x;
    expect_refused("ssm_scan y over x", &o);
    o = ok;
    o.src[7] = NULL;
    expect_refused("ssm_scan without state", &o);
    o = ok;
    o.src[7] = mk(LMH_F32, 2, 8, 5, 0, 0, 0, 0);
    expect_refused("ssm_scan state of 8 x 5", &o);
    o = ok;
    o.src[5] = mk(LMH_F32, 1, 7, 0, 0, 0, 0, 0);
    expect_refused("ssm_scan D of 7", &o);
    o = ok;
    o.src[4] = mk(LMH_F32, 2, 3, 5, 0, 0, 0, 0);
    expect_refused("ssm_scan C of another size", &o);
    o = ok;
    o.src[1] = mk(LMH_BF16, 2, 3, 8, 0, 0, 0, 0);
    expect_refused("ssm_scan bf16 dt", &o);
    o = ok;
    o.src[6] = mk(LMH_I32, 1, 8, 0, 0, 0, 0, 0);
    expect_refused("ssm_scan i32 dt_bias", &o);
    free_all();
    /* Mamba-2: H = 4 heads of 2, G = 2 groups of N = 3 */
    x = mk(LMH_F32, 2, 3, 8, 0, -1, 1, 0);
    y = mk(LMH_F32, 2, 3, 8, 0, 0, 0, 0);
    dt = mk(LMH_F32, 2, 3, 4, 0, -1, 1, 0);
    Al = mk(LMH_F32, 1, 4, 0, 0, -1, 1, 0);
    B = mk(LMH_F32, 2, 3, 6, 0, -1, 1, 0);
    C = mk(LMH_F32, 2, 3, 6, 0, -1, 1, 0);
    st = mk(LMH_F32, 3, 4, 2, 3, 0, 0, 0);
    opd s2 = {.code = LMH_OP_SSD_SCAN,
              .dst = y,
              .src = {x, dt, Al, B, C, NULL, NULL, st},
              .f = {0, 0},
              .i = {4, 2}};
    if (!run_op("ssd_scan small", &s2)) check_op("ssd_scan small", LMH_OP_SSD_SCAN, y, TOL);
    o = s2;
    o.i[1] = 3;
    expect_refused("ssd_scan 3 groups of 4 heads", &o);
    o = s2;
    o.i[0] = 0;
    expect_refused("ssd_scan no heads", &o);
    o = s2;
    o.i[0] = 3;
    o.i[1] = 1;
    expect_refused("ssd_scan 3 heads of 8 channels", &o);
    o = s2;
    o.f[0] = -1;
    expect_refused("ssd_scan lower bound -1", &o);
    o = s2;
    o.f[0] = NAN;
    expect_refused("ssd_scan lower bound NaN", &o);
    o = s2;
    o.dst = x;
    expect_refused("ssd_scan y over x", &o);
    o = s2;
    o.src[2] = mk(LMH_F32, 1, 5, 0, 0, 0, 0, 0);
    expect_refused("ssd_scan A_log of 5", &o);
    o = s2;
    o.src[7] = mk(LMH_F32, 3, 4, 2, 4, 0, 0, 0);
    expect_refused("ssd_scan state of another size", &o);
    o = s2;
    o.src[3] = mk(LMH_F32, 2, 2, 9, 0, 0, 0, 0);
    expect_refused("ssd_scan B of other rows", &o);
    free_all();
}

/* Mamba-1 and Mamba-2 in each form: SSD_SCAN row by row, chunked (from 1 row), and chunked
 * from 64 rows in passes of 2 chunks; Mamba-1 row by row always. */
static void t_scans(int modes) {
    static const char *const mode_env[3] = {"0", "1", "64:2"};
    for (int m = 0; m < modes; m++) {
        if (modes > 1) {
            test_debug_set("vk-scan-chunk", mode_env[m]);
            vk_reopen();
        }
        const char *mode = modes > 1 ? mode_env[m] : "default";
        static const int rows[] = {1, 7, 100, 130};
        int v = 0;
        for (size_t r = 0; r < 4; r++) {
            /* Mamba-1: 16 states (16 lanes), 5, 70 (32 lanes of 3), 1100 (states in memory) */
            static const int Ns[] = {16, 5, 70};
            if (m == 0)
                for (int k = 0; k < 3; k++, v++) {
                    scan_cfg c = {.n = rows[r],
                                  .D = 37 + 40 * k,
                                  .N = Ns[k],
                                  .has_d = v % 2,
                                  .has_dtb = v % 3 != 0,
                                  .dt_i = v};
                    scan_case(0, &c, mode);
                }
            /* Mamba-2: groups, clamps, odd sizes */
            scan_cfg c1 = {.n = rows[r],
                           .H = 4,
                           .P = 8,
                           .G = 2,
                           .N = 16,
                           .has_d = 1,
                           .has_dtb = 1,
                           .dt_i = v,
                           .lo = 0,
                           .hi = 0};
            scan_case(1, &c1, mode);
            scan_cfg c2 = {.n = rows[r],
                           .H = 6,
                           .P = 5,
                           .G = 3,
                           .N = 7,
                           .has_d = v % 2,
                           .has_dtb = 0,
                           .dt_i = v + 1,
                           .lo = 0.05f,
                           .hi = 0.4f};
            scan_case(1, &c2, mode);
            scan_cfg c3 = {.n = rows[r],
                           .H = 3,
                           .P = 16,
                           .G = 1,
                           .N = 40,
                           .has_d = 0,
                           .has_dtb = 1,
                           .dt_i = v + 2,
                           .lo = 0.1f,
                           .hi = -1};
            scan_case(1, &c3, mode);
            /* heads of more than 64 channels: the chunked form's blocks of 64 */
            scan_cfg c4 = {.n = rows[r],
                           .H = 2,
                           .P = 70,
                           .G = 1,
                           .N = 20,
                           .has_d = 1,
                           .has_dtb = 1,
                           .dt_i = v,
                           .lo = 0,
                           .hi = 0};
            scan_case(1, &c4, mode);
            v++;
        }
        if (m == 0) {
            scan_cfg big = {.n = 3, .D = 3, .N = 1100, .has_d = 1, .has_dtb = 1, .dt_i = 1};
            scan_case(0, &big, mode);
            scan_cfg big2 = {.n = 2, .H = 2, .P = 2, .G = 1, .N = 1500, .has_d = 1, .has_dtb = 1};
            scan_case(1, &big2, mode);
        }
    }
    if (modes > 1) {
        test_debug_unset("vk-scan-chunk");
        vk_reopen();
    }
    scan_refusals();
}

/* the first pass takes the three forms, the second the default */
static int g_pass;

static void t_scans_all(void) {
    t_scans(g_pass ? 1 : 3);
}

typedef struct delta_cfg {
    int n, Hk, Hv, dk, dv, l2, has_dtb, dt_i;
} delta_cfg;

static void delta_case(const delta_cfg *c, const char *mode) {
    int64_t n = c->n;
    /* without the L2 norm, k small enough that the rule stays stable (|k|^2 beta < 2) */
    float kr = c->l2 ? 1.0f : 1.2f / sqrtf((float)c->dk);
    tt *q = mk(LMH_F32, 3, n, c->Hk, c->dk, -1, 1, 0),
       *k = mk(LMH_F32, 3, n, c->Hk, c->dk, -kr, kr, 0);
    tt *v = mk(LMH_F32, 3, n, c->Hv, c->dv, -1, 1, 0),
       *o = mk(LMH_F32, 3, n, c->Hv, c->dv, 9, 9, 0);
    tt *a = mk(LMH_F32, 2, n, c->Hv, 0, -3, 2, 0), *b = mk(LMH_F32, 2, n, c->Hv, 0, -3, 3, 0);
    tt *Al = mk(wdt(c->dt_i), 1, c->Hv, 0, 0, -1.5f, 1, LMH_TENSOR_WEIGHT);
    tt *dtb = c->has_dtb ? mk(wdt(c->dt_i + 1), 1, c->Hv, 0, 0, -1, 1, LMH_TENSOR_WEIGHT) : NULL;
    tt *st = mk(LMH_F32, 3, c->Hv, c->dk, c->dv, -0.5f, 0.5f, 0);
    opd op = {.code = LMH_OP_DELTA_RULE,
              .dst = o,
              .src = {q, k, v, a, b, Al, dtb, st},
              .f = {1.0f / sqrtf((float)c->dk), 1e-6f},
              .i = {c->l2}};
    char what[160];
    for (int rep = 0; rep < 2; rep++) {
        snprintf(what, sizeof what,
                 "delta_rule n=%d Hk=%d Hv=%d dk=%d dv=%d l2=%d %s dtb=%d (%s) #%d", c->n, c->Hk,
                 c->Hv, c->dk, c->dv, c->l2, lmh_dtype_name(wdt(c->dt_i)), c->has_dtb, mode, rep);
        if (run_op(what, &op)) break;
        check_op(what, LMH_OP_DELTA_RULE, o, TOL);
        strcat(what, " state");
        check_op(what, LMH_OP_DELTA_RULE, st, TOL);
    }
    free_all();
}

static void delta_refusals(void) {
    tt *q = mk(LMH_F32, 3, 3, 2, 8, -1, 1, 0), *k = mk(LMH_F32, 3, 3, 2, 8, -1, 1, 0);
    tt *v = mk(LMH_F32, 3, 3, 4, 5, -1, 1, 0), *o = mk(LMH_F32, 3, 3, 4, 5, 0, 0, 0);
    tt *a = mk(LMH_F32, 2, 3, 4, 0, -1, 1, 0), *b = mk(LMH_F32, 2, 3, 4, 0, -1, 1, 0);
    tt *Al = mk(LMH_F32, 1, 4, 0, 0, -1, 1, 0), *st = mk(LMH_F32, 3, 4, 8, 5, 0, 0, 0);
    opd ok = {.code = LMH_OP_DELTA_RULE,
              .dst = o,
              .src = {q, k, v, a, b, Al, NULL, st},
              .f = {0.3f, 1e-6f},
              .i = {1}};
    if (!run_op("delta_rule small", &ok)) check_op("delta_rule small", LMH_OP_DELTA_RULE, o, TOL);
    opd x = ok;
    x.dst = v;
    expect_refused("delta_rule o over v", &x);
    x = ok;
    x.src[5] = NULL;
    expect_refused("delta_rule without A_log", &x);
    x = ok;
    x.src[2] = mk(LMH_F32, 3, 3, 3, 5, 0, 0, 0);
    x.dst = mk(LMH_F32, 3, 3, 3, 5, 0, 0, 0);
    x.src[3] = mk(LMH_F32, 2, 3, 3, 0, 0, 0, 0);
    x.src[4] = mk(LMH_F32, 2, 3, 3, 0, 0, 0, 0);
    x.src[5] = mk(LMH_F32, 1, 3, 0, 0, 0, 0, 0);
    x.src[7] = mk(LMH_F32, 3, 3, 8, 5, 0, 0, 0);
    expect_refused("delta_rule 3 value heads of 2 key heads", &x);
    x = ok;
    x.src[7] = mk(LMH_F32, 3, 4, 8, 4, 0, 0, 0);
    expect_refused("delta_rule state of another size", &x);
    x = ok;
    x.src[6] = mk(LMH_F32, 1, 5, 0, 0, 0, 0, 0);
    expect_refused("delta_rule dt_bias of 5", &x);
    x = ok;
    x.src[1] = mk(LMH_F32, 3, 3, 2, 7, 0, 0, 0);
    expect_refused("delta_rule k of another size", &x);
    x = ok;
    x.src[0] = mk(LMH_F32, 2, 3, 16, 0, 0, 0, 0);
    expect_refused("delta_rule 2-d q", &x);
    x = ok;
    x.src[4] = mk(LMH_F16, 2, 3, 4, 0, 0, 0, 0);
    expect_refused("delta_rule f16 b", &x);
    free_all();
    /* dk 1025: past the CPU's bound (1024 accepted) */
    q = mk(LMH_F32, 3, 1, 1, 1025, 0, 0, 0);
    k = mk(LMH_F32, 3, 1, 1, 1025, 0, 0, 0);
    v = mk(LMH_F32, 3, 1, 1, 2, 0, 0, 0);
    o = mk(LMH_F32, 3, 1, 1, 2, 0, 0, 0);
    a = mk(LMH_F32, 2, 1, 1, 0, 0, 0, 0);
    b = mk(LMH_F32, 2, 1, 1, 0, 0, 0, 0);
    Al = mk(LMH_F32, 1, 1, 0, 0, 0, 0, 0);
    st = mk(LMH_F32, 3, 1, 1025, 2, 0, 0, 0);
    opd big = {.code = LMH_OP_DELTA_RULE,
               .dst = o,
               .src = {q, k, v, a, b, Al, NULL, st},
               .f = {0.03f, 1e-6f},
               .i = {1}};
    expect_refused("delta_rule dk = 1025", &big);
    free_all();
}

static void t_delta(int modes) {
    static const char *const mode_env[3] = {"0", "1", "64:2"};
    for (int m = 0; m < modes; m++) {
        if (modes > 1) {
            test_debug_set("vk-scan-chunk", mode_env[m]);
            vk_reopen();
        }
        const char *mode = modes > 1 ? mode_env[m] : "default";
        static const int rows[] = {1, 7, 100, 130};
        for (int r = 0; r < 4; r++) {
            /* GQA-style: 2 value heads a key head; odd sizes; Qwen3-Next's 128 x 128 heads */
            delta_cfg c1 = {rows[r], 2, 4, 16, 12, 1, 1, r};
            delta_case(&c1, mode);
            delta_cfg c2 = {rows[r], 1, 3, 24, 40, 0, r % 2, r + 1};
            delta_case(&c2, mode);
            if (rows[r] >= 100 || m == 0) {
                delta_cfg c3 = {rows[r], 1, 2, 128, 128, 1, 1, r + 2};
                delta_case(&c3, mode);
            }
        }
        /* many lanes a column, and the chunked form's tiles in part: dk 200 */
        delta_cfg c4 = {m == 1 ? 70 : 5, 1, 1, 200, 9, 1, 1, 0};
        delta_case(&c4, mode);
        if (m == 0) { /* the largest keys, 1024 (row by row: the chunked form takes 256) */
            delta_cfg c5 = {3, 1, 2, 1024, 3, 1, 0, 1};
            delta_case(&c5, mode);
        }
    }
    if (modes > 1) {
        test_debug_unset("vk-scan-chunk");
        vk_reopen();
    }
    delta_refusals();
}

static void t_delta_all(void) {
    t_delta(g_pass ? 1 : 3);
}

/* LMHOST_TEST_BENCH=N: the recurrent ops at real models' sizes, for 1 to 4096 rows up to N, each
 * form (row by row and chunked) timed on the Vulkan device and checked against the CPU; off by
 * default (slow on lavapipe). */
static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* best of 3 runs of `reps` ops enqueued back to back (Vulkan only), in us an op */
static double time_vk(const opd *o, int reps) {
    lmh_op op = op_on(o, 1);
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        g_be[1].api->sync(g_be[1].b);
        double t0 = now_s();
        for (int i = 0; i < reps; i++) g_be[1].api->enqueue(g_be[1].b, &op);
        g_be[1].api->sync(g_be[1].b);
        double t = (now_s() - t0) / reps * 1e6;
        if (t < best) best = t;
    }
    return best;
}

/* Decode's products (one row of x) on the shapes of a 7B model: the time a product takes in
 * a chain, each waiting for the one before (a barrier between, as in a model's layer), and
 * spread over 8 outputs that do not depend on each other (the kernel's own rate), with the
 * rate W's bytes are read at. */
static void bench_matvec(void) {
    static const int64_t shapes[][2] = {{4096, 4096}, {11008, 4096}, {4096, 11008}, {14336, 4096}};
    static const char *const kinds[] = {"bf16", "q4g64", "q8g64", "mxfp4"};
    for (int k = 0; k < 4; k++)
        for (int sh = 0; sh < 4; sh++) {
            int64_t out = shapes[sh][0], in = shapes[sh][1];
            char what[128];
            g_rng = 777;
            double wbytes = k == 0   ? 2.0 * (double)(out * in)
                            : k == 3 ? (double)(out * in) * (0.5 + 1.0 / 32)
                                     : (double)(out * in) * ((k == 1 ? 4 : 8) / 8.0 + 4.0 / 64);
            tt *W = k == 0   ? mk(LMH_BF16, 2, out, in, 0, -1, 1, LMH_TENSOR_WEIGHT)
                    : k == 3 ? mk_mx(2, out, in, 0, 0, 0)
                             : mk_quant(k == 1 ? 4 : 8, 64, LMH_BF16, 2, out, in, 0);
            tt *x = mk(LMH_F32, 2, 1, in, 0, -1, 1, 0), *y[8];
            for (int j = 0; j < 8; j++) y[j] = mk(LMH_F32, 2, 1, out, 0, 0, 0, 0);
            opd o = {.code = LMH_OP_MATMUL, .dst = y[0], .src = {x, W}};
            snprintf(what, sizeof what, "bench matvec %s %lldx%lld", kinds[k], (long long)out,
                     (long long)in);
            if (!run_op(what, &o)) {
                check_op(what, LMH_OP_MATMUL, y[0], TOL);
                double chain = time_vk(&o, 200), spread = 1e30;
                lmh_op ops[8];
                for (int j = 0; j < 8; j++) {
                    opd oj = o;
                    oj.dst = y[j];
                    ops[j] = op_on(&oj, 1);
                }
                for (int r = 0; r < 3; r++) {
                    g_be[1].api->sync(g_be[1].b);
                    double t0 = now_s();
                    for (int i = 0; i < 200; i++) g_be[1].api->enqueue(g_be[1].b, &ops[i % 8]);
                    g_be[1].api->sync(g_be[1].b);
                    double t = (now_s() - t0) / 200 * 1e6;
                    if (t < spread) spread = t;
                }
                printf("    %-36s %8.2f us chained (%5.0f GB/s), %8.2f us spread (%5.0f GB/s)\n",
                       what, chain, wbytes / chain * 1e-3, spread, wbytes / spread * 1e-3);
            }
            free_all();
        }
}

static void t_bench(void) {
    const char *most = getenv("LMHOST_TEST_BENCH"); /* =N: up to N rows */
    if (!most) return;
    bench_matvec();
    static const char *const forms[2] = {"0", "64"};
    static const int rows[5] = {1, 64, 128, 512, 4096};
    for (int f = 0; f < 2; f++) {
        test_debug_set("vk-scan-chunk", forms[f]);
        vk_reopen();
        for (int r = 0; r < 5; r++) {
            int n = rows[r], reps = n == 1 ? 200 : n <= 512 ? 10 : 3;
            if (n > atoi(most)) break;
            char what[128];
            /* Qwen3-Next's gated delta rule: 16 key heads, 32 value heads of 128 */
            g_rng = 12345;
            tt *q = mk(LMH_F32, 3, n, 16, 128, -1, 1, 0), *k = mk(LMH_F32, 3, n, 16, 128, -1, 1, 0);
            tt *v = mk(LMH_F32, 3, n, 32, 128, -1, 1, 0), *o = mk(LMH_F32, 3, n, 32, 128, 0, 0, 0);
            tt *a = mk(LMH_F32, 2, n, 32, 0, -3, 2, 0), *b = mk(LMH_F32, 2, n, 32, 0, -3, 3, 0);
            tt *Al = mk(LMH_BF16, 1, 32, 0, 0, -1.5f, 1, LMH_TENSOR_WEIGHT);
            tt *dtb = mk(LMH_BF16, 1, 32, 0, 0, -1, 1, LMH_TENSOR_WEIGHT);
            tt *st = mk(LMH_F32, 3, 32, 128, 128, -0.5f, 0.5f, 0);
            opd d = {.code = LMH_OP_DELTA_RULE,
                     .dst = o,
                     .src = {q, k, v, a, b, Al, dtb, st},
                     .f = {1.0f / sqrtf(128.0f), 1e-6f},
                     .i = {1}};
            snprintf(what, sizeof what, "bench delta_rule n=%d (chunked from %s)", n, forms[f]);
            if (!run_op(what, &d)) {
                check_op(what, LMH_OP_DELTA_RULE, o, TOL);
                printf("    %-44s %10.1f us\n", what, time_vk(&d, reps));
            }
            free_all();
            /* Mamba-2 2.7B's scan: 80 heads of 64, one group of 128 states */
            g_rng = 54321;
            tt *x = mk(LMH_F32, 2, n, 80 * 64, 0, -1, 1, 0),
               *y = mk(LMH_F32, 2, n, 80 * 64, 0, 0, 0, 0);
            tt *dt = mk(LMH_F32, 2, n, 80, 0, -4, 1, 0),
               *A2 = mk(LMH_F32, 1, 80, 0, 0, -1, 1.5f, 0);
            tt *B = mk(LMH_F32, 2, n, 128, 0, -1, 1, 0), *C = mk(LMH_F32, 2, n, 128, 0, -1, 1, 0);
            tt *D = mk(LMH_F32, 1, 80, 0, 0, -1, 1, 0), *db = mk(LMH_F32, 1, 80, 0, 0, -1, 1, 0);
            tt *s2 = mk(LMH_F32, 3, 80, 64, 128, -1, 1, 0);
            opd s = {.code = LMH_OP_SSD_SCAN,
                     .dst = y,
                     .src = {x, dt, A2, B, C, D, db, s2},
                     .f = {0, 0},
                     .i = {80, 1}};
            snprintf(what, sizeof what, "bench ssd_scan n=%d (chunked from %s)", n, forms[f]);
            if (!run_op(what, &s)) {
                check_op(what, LMH_OP_SSD_SCAN, y, TOL);
                printf("    %-44s %10.1f us\n", what, time_vk(&s, reps));
            }
            free_all();
            if (f) continue; /* the rest have one form */
            /* Mamba-1 2.8B's scan: 5120 channels of 16 states; Qwen3-Next's convolution */
            g_rng = 999;
            tt *x1 = mk(LMH_F32, 2, n, 5120, 0, -1, 1, 0),
               *y1 = mk(LMH_F32, 2, n, 5120, 0, 0, 0, 0);
            tt *dt1 = mk(LMH_F32, 2, n, 5120, 0, -4, 1, 0);
            tt *A1 = mk(LMH_F32, 2, 5120, 16, 0, -1, 1.5f, 0);
            tt *B1 = mk(LMH_F32, 2, n, 16, 0, -1, 1, 0), *C1 = mk(LMH_F32, 2, n, 16, 0, -1, 1, 0);
            tt *s1 = mk(LMH_F32, 2, 5120, 16, 0, -1, 1, 0);
            opd m1 = {
                .code = LMH_OP_SSM_SCAN, .dst = y1, .src = {x1, dt1, A1, B1, C1, NULL, NULL, s1}};
            snprintf(what, sizeof what, "bench ssm_scan n=%d", n);
            if (!run_op(what, &m1)) {
                check_op(what, LMH_OP_SSM_SCAN, y1, TOL);
                printf("    %-44s %10.1f us\n", what, time_vk(&m1, reps));
            }
            free_all();
            tt *xc = mk(LMH_F32, 2, n, 8192, 0, -1, 1, 0),
               *yc = mk(LMH_F32, 2, n, 8192, 0, 0, 0, 0);
            tt *wc = mk(LMH_BF16, 2, 8192, 4, 0, -1, 1, LMH_TENSOR_WEIGHT);
            tt *sc = mk(LMH_F32, 2, 3, 8192, 0, -1, 1, 0);
            opd cv = {.code = LMH_OP_CONV1D, .dst = yc, .src = {xc, wc, NULL, sc}, .i = {1}};
            snprintf(what, sizeof what, "bench conv1d n=%d", n);
            if (!run_op(what, &cv)) {
                check_op(what, LMH_OP_CONV1D, yc, TOL);
                printf("    %-44s %10.1f us\n", what, time_vk(&cv, reps));
            }
            free_all();
        }
    }
    test_debug_unset("vk-scan-chunk");
    vk_reopen();
}

static const lmh_backend_api *load(const char *path) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "cannot load %s: %s\n", path, dlerror());
        exit(1);
    }
    lmh_plugin_entry_fn entry = (lmh_plugin_entry_fn)(uintptr_t)dlsym(h, LMH_PLUGIN_ENTRY_NAME);
    const lmh_plugin_info *info = entry ? entry() : NULL;
    if (!info || info->abi_major != LMH_ABI_MAJOR || info->kind != LMH_KIND_BACKEND) {
        fprintf(stderr, "%s: not a backend plugin of this ABI\n", path);
        exit(1);
    }
    char err[256] = "";
    if (info->init && info->init(&g_host, err, sizeof err)) {
        fprintf(stderr, "%s: init failed: %s\n", path, err);
        exit(1);
    }
    return info->api;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: test_vk_ops CPU_PLUGIN VULKAN_PLUGIN\n");
        return 2;
    }
    g_verbose = getenv("LMHOST_LOG") && atoi(getenv("LMHOST_LOG")) >= 3;
    if (!lmh_debug_get("vk-fuse-products", NULL, 0)) /* a GPU's fusion on lavapipe too */
        test_debug_set("vk-fuse-products", "1");
    g_be[0].api = load(argv[1]);
    g_be[1].api = load(argv[2]);
    lmh_backend_opts o = {.size = sizeof o, .threads = 2};
    char err[512] = "";
    if (g_be[0].api->create(&g_host, &o, &g_be[0].b, err, sizeof err)) {
        fprintf(stderr, "cpu backend: %s\n", err);
        return 1;
    }
    for (int pass = 0; pass < 2; pass++) {
        if (pass) {
            test_debug_set("vk-no-subgroup", "");
            test_debug_set("vk-no-push-descriptor", "");
            /* attention's loads several at a time, as on a GPU (lavapipe's own is one) */
            test_debug_set("vk-attn-unroll", "4x8");
            test_debug_unset("vk-attn-wgs");
            test_debug_unset("vk-attn-decode");
            test_debug_unset("vk-attn-seq-wgs");
            test_debug_unset("vk-matvec-rows");
            /* every tiled product in matmul_big.comp's 64-row tiles (matmul.comp's tiles are
             * what the conformance runs on lavapipe take) */
            test_debug_set("vk-matmul-big", "4");
        } else {
            /* a GPU's split counts (up to attn_decode's 64) and key loads, 3 at a time */
            test_debug_set("vk-attn-wgs", "512");
            test_debug_set("vk-attn-decode", "3");
            /* several sequences' decode attention in one dispatch: t_attention_seqs's first
             * group one split a workgroup, its second two (the last of an odd count one) */
            test_debug_set("vk-attn-seq-wgs", "64");
            /* products of up to 64 rows as matrix-vector ones (matvec8; a GPU's up to 16),
             * and every tiled one in matmul_big.comp's 128-row tiles */
            test_debug_set("vk-matvec-rows", "64");
            test_debug_set("vk-matmul-big", "8");
        }
        /* the second pass's waits poll their fence first (a GPU's default), for up to 1 ms */
        g_vk_params = pass ? "spin=1000" : NULL;
        lmh_backend_opts vo = {.size = sizeof vo, .threads = 2, .params = g_vk_params};
        if (g_be[1].api->create(&g_host, &vo, &g_be[1].b, err, sizeof err)) {
            printf("SKIP: no Vulkan device: %s\n", err);
            return 77;
        }
        printf("%s\n", g_be[1].api->describe(g_be[1].b));
        int f0 = g_fail;
        g_pass = pass;
        static const struct {
            const char *name;
            void (*fn)(void);
        } parts[] = {{"get_rows", t_get_rows},
                     {"matmul", t_matmul},
                     {"rms_norm", t_norm},
                     {"elementwise", t_eltwise},
                     {"rope", t_rope},
                     {"rope_switch", t_rope_switch},
                     {"copy", t_copy},
                     {"argmax", t_argmax},
                     {"downloads that do not wait", t_download_start},
                     {"attention", t_attention},
                     {"attention of sequences", t_attention_seqs},
                     {"held ops' dependencies", t_seq_deps},
                     {"moe", t_moe},
                     {"quantized", t_quant},
                     {"mxfp4", t_mxfp4},
                     {"fused pairs", t_fused},
                     {"fused products", t_fused_products},
                     {"fused count", t_fused_dispatches},
                     {"step profile", t_step_profile},
                     {"memory", t_memory},
                     {"cols, unary", t_cols_unary},
                     {"conv1d", t_conv1d},
                     {"scans", t_scans_all},
                     {"delta rule", t_delta_all},
                     {"bench", t_bench}};
        /* LMHOST_TEST_ONLY=word: the parts whose name has it (a quicker run while working on
         * one op) */
        const char *only = getenv("LMHOST_TEST_ONLY");
        for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
            if (only && !strstr(parts[i].name, only)) continue;
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            parts[i].fn();
            clock_gettime(CLOCK_MONOTONIC, &t1);
            printf("  %-12s %6.2f s\n", parts[i].name,
                   (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9);
        }
        printf("  %d failures\n", g_fail - f0);
        for (int c = LMH_OP_COLS; c < LMH_OP_COUNT; c++)
            if (strcmp(lmh_op_name(c), "?"))
                printf("  %-12s worst |d| / max |cpu| %.2g\n", lmh_op_name(c), g_worst[c]);
        printf("  %-12s worst |d| / max |cpu| %.2g\n", "sigmoid_gate",
               g_worst[LMH_OP_SIGMOID_GATE]);
        memset(g_worst, 0, sizeof g_worst);
        g_be[1].api->destroy(g_be[1].b);
    }
    g_be[0].api->destroy(g_be[0].b);
    printf("%d checks, %d failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
