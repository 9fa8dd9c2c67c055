/* The TurboQuant cache's CPU kernels (plugins/cache-turboquant/tq_kernels.h) run directly,
 * without a backend: rows encoded into the stores (from f32 rows and from the f16 ring), then
 * decode attention on the codes (attend + attend_merge) against dequantize-then-attend in
 * double (the decode kernel's rows, the ring's halfs, a plain softmax): equal within 1e-5 of
 * the output's largest value (specs/turboquant.md §11.7), for heads of 64, 128 and 256, 3 and
 * 4 bits, QJL on and off, 1 to 4 queries a K/V head, with and without a soft-cap, cold rows
 * alone and cold and hot rows together. The SIMD path is the one the plugin picks here
 * (AVX2 or NEON), or the portable one under LMHOST_DEBUG=simd=portable; run_neon_qemu.sh runs this
 * on aarch64. */
#include "tq_kernels.h"

#include <stdio.h>
#include <stdlib.h>

static int failures;
static uint64_t rng = 99;
static double uni(void) {
    rng += 0x9E3779B97F4A7C15ull;
    uint64_t z = rng;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

static void run_kernel(void (*fn)(const lmh_kernel_cpu_args *, uint32_t, uint32_t),
                       const uint32_t *p, int np, void *const *data, int nd, uint32_t groups) {
    lmh_kernel_call c = {.n_tensors = (uint32_t)nd, .groups = groups};
    memcpy(c.params, p, (size_t)np * 4);
    lmh_kernel_cpu_args a = {.call = &c};
    for (int i = 0; i < nd; i++) a.data[i] = data[i];
    uint32_t half = groups / 2;
    fn(&a, 0, half);
    fn(&a, half, groups - half);
}

/* One case: kvh K/V heads of d values, G queries each, `rows` positions of which the first
 * c0 are encoded (half of them from the ring, as a migration does) and the rest hot. */
static void one(int d, int bits, int qjl_on, int G, int rows, int c0, float softcap) {
    const int kvh = 2, heads = kvh * G, m = tq_block(d), nb = d / m, qjl = bits == 3;
    const int cw = bits * m / 32, sw = qjl ? m / 32 : 0, kw = cw + sw + 1;
    const int cap = (rows + 1) & ~1, hcap = rows - c0 + 3; /* a ring that wraps */
    float *kx = malloc(sizeof(float) * (size_t)rows * kvh * d);
    float *vx = malloc(sizeof(float) * (size_t)rows * kvh * d);
    uint16_t *hk = calloc((size_t)hcap * kvh * d, 2), *hv = calloc((size_t)hcap * kvh * d, 2);
    uint32_t *ks = calloc((size_t)kvh * nb * cap * kw, 4);
    uint32_t *vs = calloc((size_t)kvh * nb * tq_v_head_words((uint32_t)cw, cap), 4);
    for (int i = 0; i < rows * kvh * d; i++) {
        kx[i] = (float)(uni() * (1 + (i % 7 == 0) * 4)); /* some larger channels */
        vx[i] = (float)uni();
    }
    /* rows [0, c0 / 2) encoded from f32 rows; [c0 / 2, c0) from the ring (positions of the
     * ring at p % hcap, written as halfs); [c0, rows) stay in the ring */
    int direct = c0 / 2;
    for (int p = direct; p < rows; p++)
        for (int i = 0; i < kvh * d; i++) {
            hk[(size_t)(p % hcap) * kvh * d + i] = tq_half(kx[(size_t)p * kvh * d + i]);
            hv[(size_t)(p % hcap) * kvh * d + i] = tq_half(vx[(size_t)p * kvh * d + i]);
        }
    for (int keys = 1; keys >= 0; keys--) {
        uint32_t *st = keys ? ks : vs;
        float *x = keys ? kx : vx;
        uint16_t *ring = keys ? hk : hv;
        /* encode params: items, kvh, hd, m, bits, qjl, keys, source, ring's first
         * position, hcap, first store row, cap */
        uint32_t p1[12] = {(uint32_t)(direct * kvh * nb), (uint32_t)kvh, (uint32_t)d, (uint32_t)m,
                           (uint32_t)bits, (uint32_t)(keys && qjl), (uint32_t)keys, 0, 0, 0, 0,
                           (uint32_t)cap};
        void *d1[2] = {x, st};
        run_kernel(tq_encode_cpu, p1, 12, d1, 2, p1[0]);
        uint32_t p2[12];
        memcpy(p2, p1, sizeof p1);
        p2[0] = (uint32_t)((c0 - direct) * kvh * nb);
        p2[7] = 1;
        p2[8] = (uint32_t)direct;
        p2[9] = (uint32_t)hcap;
        p2[10] = (uint32_t)direct;
        void *d2[2] = {ring, st};
        run_kernel(tq_encode_cpu, p2, 12, d2, 2, p2[0]);
    }
    /* dequantize-then-attend in double */
    float *kd = malloc(sizeof(float) * (size_t)rows * kvh * d), *vd = malloc(sizeof(float) * (size_t)rows * kvh * d);
    for (int keys = 1; keys >= 0; keys--) {
        uint32_t p[10] = {(uint32_t)(c0 * kvh * nb), (uint32_t)kvh, (uint32_t)d, (uint32_t)m,
                          (uint32_t)bits, (uint32_t)(keys && qjl), (uint32_t)keys, 0,
                          (uint32_t)cap, (uint32_t)qjl_on};
        void *dd[2] = {keys ? ks : vs, keys ? kd : vd};
        if (c0) run_kernel(tq_decode_cpu, p, 10, dd, 2, p[0]);
    }
    for (int p = c0; p < rows; p++)
        for (int i = 0; i < kvh * d; i++) {
            kd[(size_t)p * kvh * d + i] = tq_float(hk[(size_t)(p % hcap) * kvh * d + i]);
            vd[(size_t)p * kvh * d + i] = tq_float(hv[(size_t)(p % hcap) * kvh * d + i]);
        }
    float *q = malloc(sizeof(float) * (size_t)heads * d);
    for (int i = 0; i < heads * d; i++) q[i] = (float)uni();
    float scale = 1.0f / sqrtf((float)d);
    double *want = calloc((size_t)heads * d, sizeof(double));
    for (int h = 0; h < heads; h++) {
        int g = h / G;
        double *s = malloc(sizeof(double) * (size_t)rows), mx = -INFINITY, l = 0;
        for (int t = 0; t < rows; t++) {
            double dot = 0;
            for (int i = 0; i < d; i++)
                dot += (double)q[h * d + i] * kd[((size_t)t * kvh + g) * d + i];
            dot *= scale;
            s[t] = softcap > 0 ? softcap * tanh(dot / softcap) : dot;
            if (s[t] > mx) mx = s[t];
        }
        for (int t = 0; t < rows; t++) {
            double w = exp(s[t] - mx);
            l += w;
            for (int i = 0; i < d; i++) want[h * d + i] += w * vd[((size_t)t * kvh + g) * d + i];
        }
        for (int i = 0; i < d; i++) want[h * d + i] /= l;
        free(s);
    }
    /* attention on the codes, in chunks of 64 rows */
    uint32_t chunk = 64, ncc = (uint32_t)(c0 + 63) / 64, nch = ncc + (uint32_t)(rows - c0 + 63) / 64;
    float *part = malloc(sizeof(float) * heads * nch * (d + 2)), *out = malloc(sizeof(float) * heads * d);
    uint32_t p[16] = {(uint32_t)kvh * nch, (uint32_t)heads, (uint32_t)kvh, (uint32_t)d, (uint32_t)d,
                      (uint32_t)bits, (uint32_t)qjl, (uint32_t)c0, (uint32_t)rows, (uint32_t)hcap,
                      (uint32_t)cap, 0, 0, chunk, ncc, (uint32_t)qjl_on};
    memcpy(&p[11], &scale, 4);
    memcpy(&p[12], &softcap, 4);
    void *da[6] = {q, ks, vs, hk, hv, part};
    run_kernel(tq_attend_cpu, p, 16, da, 6, p[0]);
    uint32_t pm[3] = {(uint32_t)heads, nch, (uint32_t)d};
    void *dm[2] = {part, out};
    run_kernel(tq_merge_cpu, pm, 3, dm, 2, (uint32_t)heads);
    double maxd = 0, maxw = 0;
    for (int i = 0; i < heads * d; i++) {
        maxd = fmax(maxd, fabs(out[i] - want[i]));
        maxw = fmax(maxw, fabs(want[i]));
    }
    int ok = maxd <= 1e-5 * maxw;
    if (!ok) failures++;
    printf("%s d=%d tq%d qjl=%s G=%d rows=%d cold=%d softcap=%g: max |codes - dequantized| = "
           "%.2e of %.3g\n",
           ok ? "ok  " : "FAIL", d, bits, qjl_on ? "on" : "off", G, rows, c0, softcap, maxd, maxw);
    free(kx), free(vx), free(hk), free(hv), free(ks), free(vs), free(kd), free(vd);
    free(q), free(want), free(part), free(out);
}

int main(void) {
    (void)tq_move_cpu; /* tested through the plugin (test_cache_tq.c) */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    printf("path: %s\n", tq_avx2() ? "avx2" : "portable");
#elif defined(__aarch64__) && defined(__ARM_NEON)
    printf("path: %s\n", tq_neon() ? "neon" : "portable");
#else
    printf("path: portable\n");
#endif
    for (int d = 64; d <= 256; d *= 2)
        for (int bits = 3; bits <= 4; bits++) {
            one(d, bits, 1, 2, 300, 284, 0.0f); /* §11.7: 284 cold + 16 hot */
            one(d, bits, 1, 1, 200, 200, 0.0f); /* cold alone */
        }
    one(128, 3, 0, 4, 150, 100, 0.0f);
    one(128, 3, 1, 4, 150, 100, 30.0f);
    one(64, 4, 1, 3, 97, 0, 0.0f); /* hot alone */
    printf("%s\n", failures ? "FAILED" : "ok");
    return failures != 0;
}
