/* read_rows and row_bytes (plugin ABI 1.8) of the plain and quantized cache plugins, through
 * their tables, on the CPU backend and, where given and a device is there, on Vulkan.
 *
 * usage: test_cache_rows PLAIN_PLUGIN QUANT_PLUGIN CPU_PLUGIN [VULKAN_PLUGIN]
 *
 * Layers: full attention with 2 K/V heads, keys of 64 and values of 32; a sliding window of 5
 * (a ring) with one head of 128; one without keys and values. Steps of 7, 1, 1, 9, 1, 40, 1
 * and 1 rows are appended; after each, every position a layer holds is read back in one call
 * and again in a range that starts one position in (so that a ring's read wraps at another
 * slot), and compared with what was appended: f32 bit for bit; f16 within its rounding
 * (|x| 2^-11, 2^-24 near zero); q8 and q4 within half a quantization step of the value's
 * group ((max - min) / (2^bits - 1) / 2, plus f32 rounding). Positions not held (before the
 * ring's window, past the length, negative), a bad layer or sequence give LMH_EINVAL; tensors
 * of the wrong shape or dtype LMH_ESHAPE. After a trim to 0 nothing is held; new rows read
 * back. row_bytes must be the format's size of a position (0 for the layer without keys and
 * values), and settings (lmh_cache_config.options) are refused with a message, as these
 * formats take none. Exit 0 pass, 1 fail. */
#include "lmhost/lmhost.h"

#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_fail, g_checks;
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static void host_log(int level, const char *fmt, ...) {
    if (level > LMH_LOG_WARN) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "log: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

static const lmh_host_api g_host = {
    .size = sizeof(lmh_host_api), .abi_minor = LMH_ABI_MINOR, .log = host_log};

static void check(int ok, const char *fmt, ...) {
    g_checks++;
    if (ok) return;
    g_fail++;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

static float frand(float lo, float hi) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return lo + (hi - lo) * (float)((g_rng >> 11) * (1.0 / 9007199254740992.0));
}

static const lmh_plugin_info *load(const char *path) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "FAIL: dlopen %s: %s\n", path, dlerror());
        exit(1);
    }
    const lmh_plugin_info *(*entry)(void) =
        (const lmh_plugin_info *(*)(void))(uintptr_t)dlsym(h, LMH_PLUGIN_ENTRY_NAME);
    const lmh_plugin_info *info = entry ? entry() : NULL;
    char err[256] = "";
    if (!info || (info->init && info->init(&g_host, err, sizeof err))) {
        fprintf(stderr, "FAIL: %s: no usable entry %s\n", path, err);
        exit(1);
    }
    return info;
}

enum { NL = 3, MAXPOS = 128 };

typedef struct fmt {
    const char *name;
    int bits; /* 32, 16, 8, 4 */
} fmt;

static int group_of(int hd) {
    return hd % 64 == 0 ? 64 : hd % 32 == 0 ? 32 : 16;
}

/* The bytes a position of a head of hd values takes in the format. */
static uint64_t head_bytes(const fmt *f, int hd) {
    if (f->bits >= 16) return (uint64_t)hd * (uint64_t)f->bits / 8;
    return ((uint64_t)hd * (uint64_t)f->bits / 32 + 2 * (uint64_t)(hd / group_of(hd))) * 4;
}

/* Whether got is x as the format keeps it: rows of [heads, hd] values, n of them. */
static int close_enough(const fmt *f, const float *x, const float *got, int rows, int hd,
                        double *worst) {
    int ok = 1;
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * hd, *gr = got + (size_t)r * hd;
        int g = group_of(hd);
        for (int g0 = 0; g0 < hd; g0 += g) {
            float mn = xr[g0], mx = xr[g0];
            for (int i = 1; i < g; i++) {
                mn = fminf(mn, xr[g0 + i]);
                mx = fmaxf(mx, xr[g0 + i]);
            }
            double step = (double)(mx - mn) / ((1 << (f->bits < 16 ? f->bits : 1)) - 1);
            for (int i = g0; i < g0 + g; i++) {
                double d = fabs((double)gr[i] - (double)xr[i]), tol;
                if (f->bits == 32)
                    tol = 0;
                else if (f->bits == 16)
                    tol = fabs((double)xr[i]) * ldexp(1, -11) + ldexp(1, -24);
                else
                    tol = 0.5 * step * (1 + 1e-5) + 1e-6 * (fabs(mn) + fabs(mx));
                if (!(d <= tol)) ok = 0;
                if (f->bits != 32 && d / (tol > 0 ? tol : 1) > *worst) *worst = d / tol;
            }
        }
    }
    return ok;
}

static lmh_tensor *rows_tensor(const lmh_backend_api *be, lmh_backend *b, int n, int heads,
                               int hd) {
    int64_t ne[3] = {n, heads, hd};
    return be->tensor_new(b, LMH_F32, 3, ne, 0);
}

typedef struct ctx {
    const char *name;
    const fmt *f;
    const lmh_cache_api *api;
    const lmh_backend_api *be;
    lmh_backend *b;
    lmh_cache *c;
    lmh_layer_state st[NL];
    float *k[NL], *v[NL]; /* every position's rows as appended: [pos, heads, hd] */
    int pos;
    double worst; /* largest error as a share of its tolerance */
    int rounded;  /* values the format changed (f16: must be some) */
} ctx;

/* Reads positions [first, first + n) of layer l and compares them with what was appended. */
static void read_back(ctx *x, int l, int first, int n) {
    const lmh_layer_state *st = &x->st[l];
    int h = st->n_kv_heads, dk = st->head_dim_k, dv = st->head_dim_v;
    lmh_tensor *kt = rows_tensor(x->be, x->b, n, h, dk), *vt = rows_tensor(x->be, x->b, n, h, dv);
    size_t nk = (size_t)n * h * dk, nv = (size_t)n * h * dv;
    float *gk = malloc(nk * sizeof *gk), *gv = malloc(nv * sizeof *gv);
    int rc = kt && vt && gk && gv ? x->api->read_rows(x->c, 7, l, first, n, kt, vt) : LMH_ENOMEM;
    if (rc == LMH_OK) rc = x->be->download(x->b, kt, 0, gk, nk * sizeof *gk);
    if (rc == LMH_OK) rc = x->be->download(x->b, vt, 0, gv, nv * sizeof *gv);
    check(rc == LMH_OK, "%s %s: layer %d read_rows(%d, %d) at length %d: %d", x->name, x->f->name,
          l, first, n, x->pos, rc);
    if (rc == LMH_OK) {
        const float *wk = x->k[l] + (size_t)first * h * dk, *wv = x->v[l] + (size_t)first * h * dv;
        check(close_enough(x->f, wk, gk, n * h, dk, &x->worst) &&
                  close_enough(x->f, wv, gv, n * h, dv, &x->worst),
              "%s %s: layer %d positions %d..%d differ from those appended", x->name, x->f->name, l,
              first, first + n - 1);
        for (size_t i = 0; i < nk; i++) x->rounded += gk[i] != wk[i];
    }
    if (kt) x->be->tensor_free(x->b, kt);
    if (vt) x->be->tensor_free(x->b, vt);
    free(gk);
    free(gv);
}

/* read_rows must refuse without touching anything: want is the error expected. */
static void refused(ctx *x, uint64_t seq, int l, int first, int n, int want, const char *what) {
    const lmh_layer_state *st = &x->st[l >= 0 && l < NL ? l : 0];
    int rows = n > 0 ? n : 1, h = st->n_kv_heads ? st->n_kv_heads : 1;
    int dk = st->head_dim_k ? st->head_dim_k : 16, dv = st->head_dim_v ? st->head_dim_v : 16;
    lmh_tensor *kt = rows_tensor(x->be, x->b, rows, h, dk),
               *vt = rows_tensor(x->be, x->b, rows, h, dv);
    int rc = x->api->read_rows(x->c, seq, l, first, n, kt, vt);
    check(rc == want, "%s %s: %s (layer %d, %d, %d at length %d) gave %d, not %d", x->name,
          x->f->name, what, l, first, n, x->pos, rc, want);
    x->be->tensor_free(x->b, kt);
    x->be->tensor_free(x->b, vt);
}

static void append(ctx *x, int n) {
    for (int l = 0; l < NL; l++) {
        const lmh_layer_state *st = &x->st[l];
        if (st->kind != LMH_STATE_KV) continue;
        int h = st->n_kv_heads, dk = st->head_dim_k, dv = st->head_dim_v;
        float *k = x->k[l] + (size_t)x->pos * h * dk, *v = x->v[l] + (size_t)x->pos * h * dv;
        /* groups of differing range, as real keys have */
        for (int i = 0; i < n * h * dk; i++) k[i] = frand(-1.5f, 1.5f) + (float)(i % 7) * 0.3f;
        for (int i = 0; i < n * h * dv; i++) v[i] = frand(-2.0f, 1.0f);
        int64_t kne[3] = {n, h, dk}, vne[3] = {n, h, dv};
        lmh_tensor *kt = x->be->tensor_new(x->b, LMH_F32, 3, kne, 0);
        lmh_tensor *vt = x->be->tensor_new(x->b, LMH_F32, 3, vne, 0);
        int rc = kt && vt ? LMH_OK : LMH_ENOMEM;
        if (rc == LMH_OK) rc = x->be->upload(x->b, kt, 0, k, (size_t)n * h * dk * sizeof *k);
        if (rc == LMH_OK) rc = x->be->upload(x->b, vt, 0, v, (size_t)n * h * dv * sizeof *v);
        if (rc == LMH_OK) rc = x->api->append(x->c, 7, l, kt, vt);
        check(rc == LMH_OK, "%s %s: append %d rows to layer %d: %d", x->name, x->f->name, n, l, rc);
        if (kt) x->be->tensor_free(x->b, kt);
        if (vt) x->be->tensor_free(x->b, vt);
    }
    x->pos += n;
}

/* Every position held read back, whole and from one in; then the refusals at this length. */
static void read_all(ctx *x) {
    for (int l = 0; l < NL; l++) {
        if (x->st[l].kind != LMH_STATE_KV) {
            refused(x, 7, l, 0, 1, LMH_EINVAL, "a layer without keys and values");
            continue;
        }
        int held = x->api->layer_rows(x->c, 7, l), lo = x->pos - held;
        check(held > 0 && held <= x->pos, "%s %s: layer %d holds %d rows at length %d", x->name,
              x->f->name, l, held, x->pos);
        if (held <= 0) continue;
        read_back(x, l, lo, held);
        if (held > 2) read_back(x, l, lo + 1, held - 2);
        read_back(x, l, x->pos - 1, 1);
        if (lo > 0) refused(x, 7, l, lo - 1, 2, LMH_EINVAL, "a position the ring dropped");
        refused(x, 7, l, x->pos - 1, 2, LMH_EINVAL, "a position past the length");
        refused(x, 7, l, -1, 1, LMH_EINVAL, "a negative position");
        refused(x, 7, l, lo, -1, LMH_EINVAL, "a negative count");
    }
    refused(x, 8, 0, 0, 1, LMH_EINVAL, "an unknown sequence");
    refused(x, 7, NL, 0, 1, LMH_EINVAL, "a layer past the last");
    refused(x, 7, -1, 0, 1, LMH_EINVAL, "a negative layer");
    /* tensors of the wrong shape or dtype */
    const lmh_layer_state *st = &x->st[0];
    lmh_tensor *kt = rows_tensor(x->be, x->b, 1, st->n_kv_heads, st->head_dim_k);
    lmh_tensor *vt = rows_tensor(x->be, x->b, 1, st->n_kv_heads, st->head_dim_v);
    int64_t ne[3] = {1, st->n_kv_heads, st->head_dim_k};
    lmh_tensor *k16 = x->be->tensor_new(x->b, LMH_F16, 3, ne, 0);
    int rc = x->api->read_rows(x->c, 7, 0, 0, 1, vt, vt);
    check(rc == LMH_ESHAPE, "%s %s: keys of the values' shape gave %d", x->name, x->f->name, rc);
    rc = x->api->read_rows(x->c, 7, 0, x->pos - 2, 2, kt, vt);
    check(rc == LMH_ESHAPE, "%s %s: 2 rows into tensors of 1 gave %d", x->name, x->f->name, rc);
    rc = k16 ? x->api->read_rows(x->c, 7, 0, 0, 1, k16, vt) : LMH_ESHAPE;
    check(rc == LMH_ESHAPE, "%s %s: f16 keys gave %d", x->name, x->f->name, rc);
    x->be->tensor_free(x->b, kt);
    x->be->tensor_free(x->b, vt);
    if (k16) x->be->tensor_free(x->b, k16);
}

static void run_format(const char *name, const lmh_cache_api *api, const fmt *f,
                       const lmh_backend_api *be, lmh_backend *b) {
    ctx x = {.name = name, .f = f, .api = api, .be = be, .b = b};
    x.st[0] = (lmh_layer_state){LMH_STATE_KV, 2, 64, 32, 0};
    x.st[1] = (lmh_layer_state){LMH_STATE_KV, 1, 128, 128, 5};
    x.st[2] = (lmh_layer_state){LMH_STATE_NONE, 0, 0, 0, 0};
    char err[256] = "";
    /* settings: none taken */
    lmh_cache_config cfg = {sizeof cfg, f->name, NL, x.st, 0, NULL, "hot=0", LMH_CACHE_SETTLED};
    int rc = api->create(&g_host, be, b, &cfg, &x.c, err, sizeof err);
    check(rc != LMH_OK && strstr(err, "hot=0"), "%s %s: settings 'hot=0' accepted (%d: %s)", name,
          f->name, rc, err);
    if (rc == LMH_OK) api->destroy(x.c);
    x.c = NULL;
    cfg.options = NULL;
    if (api->create(&g_host, be, b, &cfg, &x.c, err, sizeof err) != LMH_OK) {
        check(0, "%s %s: create: %s", name, f->name, err);
        return;
    }
    for (int l = 0; l < NL; l++) {
        uint64_t kb = 1, vb = 1, wk = 0, wv = 0;
        api->row_bytes(x.c, l, &kb, &vb);
        if (x.st[l].kind == LMH_STATE_KV) {
            wk = x.st[l].n_kv_heads * head_bytes(f, x.st[l].head_dim_k);
            wv = x.st[l].n_kv_heads * head_bytes(f, x.st[l].head_dim_v);
        }
        check(kb == wk && vb == wv,
              "%s %s: row_bytes of layer %d: %llu and %llu, not %llu and %llu", name, f->name, l,
              (unsigned long long)kb, (unsigned long long)vb, (unsigned long long)wk,
              (unsigned long long)wv);
        x.k[l] = calloc((size_t)MAXPOS * 256, sizeof(float));
        x.v[l] = calloc((size_t)MAXPOS * 256, sizeof(float));
    }
    api->seq_add(x.c, 7);
    refused(&x, 7, 0, 0, 1, LMH_EINVAL, "an empty sequence");
    const int steps[] = {7, 1, 1, 9, 1, 40, 1, 1};
    for (size_t i = 0; i < sizeof steps / sizeof *steps; i++) {
        append(&x, steps[i]);
        read_all(&x);
    }
    /* after a trim to 0 nothing is held, and new rows read back */
    check(api->seq_trim(x.c, 7, 0) == LMH_OK, "%s %s: trim to 0", name, f->name);
    x.pos = 0;
    refused(&x, 7, 0, 0, 1, LMH_EINVAL, "a position trimmed away");
    append(&x, 3);
    read_all(&x);
    if (f->bits == 16)
        check(x.rounded > 0, "%s f16: every value read back as appended: not stored as f16", name);
    printf("%s %s: worst error %.3f of its tolerance\n", name, f->name, x.worst);
    api->seq_remove(x.c, 7);
    api->destroy(x.c);
    for (int l = 0; l < NL; l++) {
        free(x.k[l]);
        free(x.v[l]);
    }
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: test_cache_rows PLAIN_PLUGIN QUANT_PLUGIN CPU_PLUGIN "
                        "[VULKAN_PLUGIN]\n");
        return 2;
    }
    const lmh_cache_api *plain = load(argv[1])->api, *quant = load(argv[2])->api;
    static const fmt fmts[] = {{"f32", 32}, {"f16", 16}, {"q8", 8}, {"q4", 4}};
    for (int i = 3; i < argc; i++) {
        const lmh_backend_api *be = load(argv[i])->api;
        lmh_backend_opts o = {.size = sizeof o, .threads = 2};
        lmh_backend *b = NULL;
        char err[256] = "";
        if (be->create(&g_host, &o, &b, err, sizeof err) != LMH_OK) {
            printf("skip %s: %s\n", argv[i], err); /* no Vulkan device here */
            continue;
        }
        const char *name = i == 3 ? "cpu" : "vulkan";
        for (int f = 0; f < 4; f++)
            run_format(name, fmts[f].bits >= 16 ? plain : quant, &fmts[f], be, b);
        be->destroy(b);
    }
    printf("%d checks, %d failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
