/* The CPU backend's LMH_OP_ROPE_SWITCH (ABI 1.10) through the plugin's API: a batch holding
 * rows of two sequences, one whose length is past the threshold and one at or below it
 * (both sides of the boundary: a value equal to the threshold takes the short table, one
 * more the long one), full and partial rotation, both pair styles, in place and not, with
 * different cos/sin factors for the two tables. Each row must be, bit for bit, what
 * LMH_OP_ROPE gives it with the table and factor it chose, for 1 and 3 threads, and within
 * f32 rounding of a double-precision model; bad operands are refused by supports() and
 * enqueue. usage: test_cpu_rope_switch CPU_PLUGIN */
#include "lmhost/lmhost.h"

#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const lmh_backend_api *g_api;
static int g_fail, g_checks;

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

static void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    g_fail++;
}

static lmh_tensor *mk(lmh_backend *b, lmh_dtype dt, int nd, int64_t n0, int64_t n1, int64_t n2,
                      const void *data) {
    int64_t ne[3] = {n0, n1, n2};
    lmh_tensor *t = g_api->tensor_new(b, dt, nd, ne, 0);
    if (!t) {
        fprintf(stderr, "tensor_new failed\n");
        exit(1);
    }
    if (data && g_api->upload(b, t, 0, data, (size_t)lmh_nelem(t) * lmh_dtype_size(dt))) {
        fprintf(stderr, "upload failed\n");
        exit(1);
    }
    return t;
}

static void get(lmh_backend *b, const lmh_tensor *t, void *dst) {
    if (g_api->download(b, t, 0, dst, (size_t)lmh_nelem(t) * lmh_dtype_size(t->dtype))) {
        fprintf(stderr, "download failed\n");
        exit(1);
    }
}

static lmh_op rope_op(lmh_op_code code, lmh_tensor *dst, lmh_tensor *x, lmh_tensor *pos,
                      lmh_tensor *s, lmh_tensor *l, lmh_tensor *ends, int32_t rot, int32_t style,
                      int32_t thr, float fs, float fl) {
    lmh_op op = {.code = code, .dst = dst, .src = {x, pos, s, l}};
    lmh_op_set_src(&op, 4, ends);
    op.p.i[0] = rot;
    op.p.i[1] = style;
    op.p.i[2] = thr;
    op.p.f[0] = fs;
    op.p.f[1] = fl;
    return op;
}

static int run(lmh_backend *b, const lmh_op *op, const char *what) {
    if (!g_api->supports(b, op)) {
        fail("%s: not supported", what);
        return -1;
    }
    if (g_api->enqueue(b, op) != LMH_OK || g_api->sync(b) != LMH_OK) {
        fail("%s: enqueue failed", what);
        return -1;
    }
    return 0;
}

#define N     8
#define HEADS 3
#define THR   32

/* rows 0..3: a sequence ending at 41 (long); rows 4..7: one ending at THR (short), its rows
 * at positions up to 31; row ends right at the boundary (THR, THR + 1) are among them */
static const int32_t g_pos[N] = {37, 38, 39, 40, 28, 29, 30, 31};
static const int32_t g_ends[N] = {41, 41, 41, 41, THR, THR, THR, THR};

static void one_case(lmh_backend *bk[2], int64_t hd, int32_t rot, int32_t style, int inplace,
                     const int32_t *ends) {
    const int32_t half = rot / 2;
    const float fs = 1.25f, fl = 0.75f;
    float *xv = malloc((size_t)(N * HEADS * hd) * sizeof *xv), inv[2][512];
    for (int64_t i = 0; i < N * HEADS * hd; i++) xv[i] = (float)sin(0.37 * (double)i + 0.1) * 2;
    for (int32_t i = 0; i < half; i++) {
        inv[0][i] = (float)(1.0 / ((1.0 + 0.05 * i) * pow(10000.0, 2.0 * i / rot)));
        inv[1][i] = (float)(1.0 / ((1.0 + 0.9 * i) * pow(10000.0, 2.0 * i / rot)));
    }
    char what[160];
    snprintf(what, sizeof what, "hd=%lld rot=%d style=%d%s ends %d/%d", (long long)hd, rot, style,
             inplace ? " in place" : "", ends[0], ends[N - 1]);
    float *got[2], *ref = malloc((size_t)(N * HEADS * hd) * sizeof *ref);
    for (int k = 0; k < 2; k++) {
        lmh_backend *b = bk[k];
        lmh_tensor *x = mk(b, LMH_F32, 3, N, HEADS, hd, xv),
                   *pos = mk(b, LMH_I32, 1, N, 0, 0, g_pos), *e = mk(b, LMH_I32, 1, N, 0, 0, ends),
                   *s = mk(b, LMH_F32, 1, half, 0, 0, inv[0]),
                   *l = mk(b, LMH_F32, 1, half, 0, 0, inv[1]);
        lmh_tensor *y = inplace ? x : mk(b, LMH_F32, 3, N, HEADS, hd, NULL);
        lmh_op op = rope_op(LMH_OP_ROPE_SWITCH, y, x, pos, s, l, e, rot, style, THR, fs, fl);
        got[k] = malloc((size_t)(N * HEADS * hd) * sizeof *got[k]);
        if (!run(b, &op, what)) get(b, y, got[k]);
        /* each table alone through LMH_OP_ROPE: the rows that chose it must match it */
        for (int t = 0; t < 2 && k == 0; t++) {
            lmh_tensor *x2 = mk(b, LMH_F32, 3, N, HEADS, hd, xv);
            lmh_tensor *y2 = inplace ? x2 : mk(b, LMH_F32, 3, N, HEADS, hd, NULL);
            lmh_op r = rope_op(LMH_OP_ROPE, y2, x2, pos, t ? l : s, NULL, NULL, rot, style, 0,
                               t ? fl : fs, 0);
            if (!run(b, &r, what)) get(b, y2, ref);
            for (int r0 = 0; r0 < N; r0++) {
                if ((ends[r0] > THR) != t) continue;
                g_checks++;
                const size_t row = (size_t)(HEADS * hd);
                if (memcmp(ref + r0 * row, got[0] + r0 * row, row * sizeof *ref))
                    fail("%s: row %d (end %d) differs from rope with the %s table", what, r0,
                         ends[r0], t ? "long" : "short");
            }
            if (!inplace) g_api->tensor_free(b, y2);
            g_api->tensor_free(b, x2);
        }
        if (!inplace) g_api->tensor_free(b, y);
        lmh_tensor *all[5] = {x, pos, e, s, l};
        for (int i = 4; i >= 0; i--) g_api->tensor_free(b, all[i]);
    }
    g_checks++;
    if (memcmp(got[0], got[1], (size_t)(N * HEADS * hd) * sizeof(float)))
        fail("%s: 1 and 3 threads differ", what);
    /* against a double-precision model (the f32 angle, as the reference implementations) */
    double md = 0;
    for (int r = 0; r < N; r++)
        for (int h = 0; h < HEADS; h++) {
            const int lg = ends[r] > THR;
            const float *xs = xv + (r * HEADS + h) * hd, *ys = got[0] + (r * HEADS + h) * hd;
            for (int32_t i = 0; i < half; i++) {
                int32_t a = style == LMH_ROPE_HALF ? i : 2 * i;
                int32_t c = style == LMH_ROPE_HALF ? i + half : 2 * i + 1;
                double ang = (double)((float)g_pos[r] * inv[lg][i]), f = lg ? fl : fs;
                double ya = (xs[a] * cos(ang) - xs[c] * sin(ang)) * f;
                double yc = (xs[c] * cos(ang) + xs[a] * sin(ang)) * f;
                md = fmax(md, fmax(fabs(ya - ys[a]), fabs(yc - ys[c])));
            }
            for (int64_t i = rot; i < hd; i++) md = fmax(md, fabs((double)xs[i] - ys[i]));
        }
    g_checks++;
    if (!(md < 1e-5)) fail("%s: max |d| %.3g against the double-precision model", what, md);
    free(got[0]);
    free(got[1]);
    free(ref);
    free(xv);
}

static void expect_refused(lmh_backend *b, const lmh_op *op, const char *what) {
    g_checks++;
    if (g_api->supports(b, op) || g_api->enqueue(b, op) == LMH_OK) fail("accepts %s", what);
}

static void refusals(lmh_backend *b) {
    float f[8] = {0};
    int32_t iv[N] = {0};
    lmh_tensor *x = mk(b, LMH_F32, 3, N, HEADS, 16, NULL), *pos = mk(b, LMH_I32, 1, N, 0, 0, iv),
               *e = mk(b, LMH_I32, 1, N, 0, 0, iv), *s = mk(b, LMH_F32, 1, 8, 0, 0, f),
               *l = mk(b, LMH_F32, 1, 8, 0, 0, f), *fe = mk(b, LMH_F32, 1, N, 0, 0, NULL),
               *e7 = mk(b, LMH_I32, 1, N - 1, 0, 0, iv), *l4 = mk(b, LMH_F32, 1, 4, 0, 0, f);
    lmh_op ok = rope_op(LMH_OP_ROPE_SWITCH, x, x, pos, s, l, e, 16, LMH_ROPE_HALF, THR, 1, 1);
    g_checks++;
    if (!g_api->supports(b, &ok)) fail("refuses a good rope_switch");
    lmh_op op = ok;
    lmh_op_set_src(&op, 4, NULL);
    expect_refused(b, &op, "no row values (src4)");
    op = ok;
    lmh_op_set_src(&op, 4, fe);
    expect_refused(b, &op, "f32 row values");
    op = ok;
    lmh_op_set_src(&op, 4, e7);
    expect_refused(b, &op, "row values for fewer rows");
    op = ok;
    op.src[3] = NULL;
    expect_refused(b, &op, "no long table");
    op = ok;
    op.src[3] = l4;
    expect_refused(b, &op, "a long table shorter than rot / 2");
    op = ok;
    op.p.i[2] = -1;
    expect_refused(b, &op, "a negative threshold");
    op = ok;
    op.p.i[1] = 2;
    expect_refused(b, &op, "an unknown pair style");
    lmh_tensor *all[8] = {x, pos, e, s, l, fe, e7, l4};
    for (int i = 7; i >= 0; i--) g_api->tensor_free(b, all[i]);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: test_cpu_rope_switch CPU_PLUGIN\n");
        return 2;
    }
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "cannot load %s: %s\n", argv[1], dlerror());
        return 1;
    }
    lmh_plugin_entry_fn entry = (lmh_plugin_entry_fn)(uintptr_t)dlsym(h, LMH_PLUGIN_ENTRY_NAME);
    const lmh_plugin_info *info = entry ? entry() : NULL;
    if (!info || info->kind != LMH_KIND_BACKEND || info->abi_major != LMH_ABI_MAJOR) {
        fprintf(stderr, "%s: not a backend plugin of this ABI\n", argv[1]);
        return 1;
    }
    char err[256] = "";
    if (info->init && info->init(&g_host, err, sizeof err)) {
        fprintf(stderr, "init: %s\n", err);
        return 1;
    }
    g_api = info->api;
    lmh_backend *bk[2];
    for (int k = 0; k < 2; k++) {
        lmh_backend_opts o = {.size = sizeof o, .threads = k ? 3 : 1};
        if (g_api->create(&g_host, &o, &bk[k], err, sizeof err)) {
            fprintf(stderr, "create: %s\n", err);
            return 1;
        }
    }
    /* the rows' sequence lengths: the two sequences of g_ends, then rows right at the
     * boundary both ways, then all rows past it and all at it */
    static const int32_t edge[N] = {THR + 1, THR, THR + 1, THR, 0, 1, THR + 100, THR - 1};
    static const int32_t all_long[N] = {33, 33, 33, 33, 33, 33, 33, 33};
    const int32_t *ends_sets[4] = {g_ends, edge, all_long, NULL};
    int32_t at_thr[N];
    for (int i = 0; i < N; i++) at_thr[i] = THR;
    ends_sets[3] = at_thr;
    static const int32_t shapes[][2] = {{16, 16}, {16, 8}, {64, 64}, {96, 32}, {6, 2}};
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++)
        for (int style = 0; style < 2; style++)
            for (int inplace = 0; inplace < 2; inplace++)
                for (int es = 0; es < 4; es++)
                    one_case(bk, shapes[c][0], shapes[c][1], style, inplace, ends_sets[es]);
    refusals(bk[0]);
    /* a code past this ABI's (a backend refuses what it does not know) */
    lmh_tensor *x = mk(bk[0], LMH_F32, 3, 1, 1, 2, NULL);
    lmh_op unknown = {.code = LMH_OP_COUNT, .dst = x, .src = {x}};
    expect_refused(bk[0], &unknown, "an op code past LMH_OP_COUNT");
    g_api->tensor_free(bk[0], x);
    for (int k = 0; k < 2; k++) g_api->destroy(bk[k]);
    printf("%d checks, %d failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
