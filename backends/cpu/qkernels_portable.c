/* Quantized kernels in portable C, the helpers every path shares, and the choice of table. */
#include "qkernels.h"
#include "kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void cpu_q_pack(const uint32_t *codes, int64_t n, int bits, uint32_t *words) {
    memset(words, 0, (size_t)(n * bits / 32) * sizeof *words);
    for (int64_t j = 0; j < n; j++) {
        int64_t bit = j * bits;
        words[bit / 32] |= codes[j] << (bit % 32);
        if (bit % 32 + bits > 32) words[bit / 32 + 1] |= codes[j] >> (32 - bit % 32);
    }
}

float cpu_q_sb(const cpu_qmat *w, const void *p, int64_t i) {
    switch (w->sb) {
    case 0:
        return ((const float *)p)[i];
    case 1:
        return cpu_f16_to_f32(((const uint16_t *)p)[i]);
    default:
        return cpu_bf16_to_f32(((const uint16_t *)p)[i]);
    }
}

/* A group starts on a word boundary (group * bits is a multiple of 32): stream its words
 * through a 64-bit buffer. */
static void unpack_group(const uint32_t *wp, int32_t group, int bits, float *out) {
    uint64_t buf = 0;
    int have = 0;
    const uint32_t mask = (1u << bits) - 1;
    for (int32_t k = 0; k < group; k++) {
        if (have < bits) {
            buf |= (uint64_t)*wp++ << have;
            have += 32;
        }
        out[k] = (float)((uint32_t)buf & mask);
        buf >>= bits;
        have -= bits;
    }
}

static void dequant_portable(const cpu_qmat *w, int64_t row, int64_t k0, int64_t k1, float *y) {
    const int64_t gw = (int64_t)w->group * w->bits / 32;
    for (int64_t g = k0 / w->group; g < k1 / w->group; g++) {
        float *yp = y + g * w->group - k0;
        unpack_group(w->q + row * w->wpr + g * gw, w->group, w->bits, yp);
        float s = cpu_q_sb(w, w->scales, row * w->gpr + g);
        float b = cpu_q_sb(w, w->biases, row * w->gpr + g);
        for (int32_t k = 0; k < w->group; k++) yp[k] = fmaf(yp[k], s, b);
    }
}

const cpu_qkernels cpu_qkernels_portable = {
    .name = "portable",
    .dequant = dequant_portable,
    .matvec = NULL, /* the row-by-row path of cpu_q_matmul: the f32 kernel's dot products */
};

void cpu_q_matmul(const cpu_kernels *k, const cpu_qkernels *qk, const float *x, int64_t n,
                  const cpu_qmat *w, int64_t o0, int64_t o1, float *y, int64_t ldy, float *buf) {
    const int64_t in = w->in;
    if (n == 1 && qk->matvec) {
        qk->matvec(w, x, o0, o1, y, k->kblock);
        return;
    }
    if (buf) {
        for (int64_t ob = o0; ob < o1; ob += CPU_Q_ROWS) {
            const int64_t oc = o1 - ob < CPU_Q_ROWS ? o1 - ob : CPU_Q_ROWS;
            for (int64_t i = 0; i < oc; i++) qk->dequant(w, ob + i, 0, in, buf + i * in);
            k->matmul_f32(x, n, in, buf, 0, oc, y + ob, ldy);
        }
        return;
    }
    /* No buffer: one row at a time, block by block of k, adding the partial
     * sums in order as matmul_f32 does, which gives the same bits. */
    float part[1024], yo;
    const int64_t kb = k->kblock < 1024 ? k->kblock : 1024;
    for (int64_t r = 0; r < n; r++)
        for (int64_t o = o0; o < o1; o++) {
            for (int64_t k0 = 0; k0 < in; k0 += kb) {
                const int64_t kc = in - k0 < kb ? in - k0 : kb;
                qk->dequant(w, o, k0, k0 + kc, part);
                k->matmul_f32(x + r * in + k0, 1, kc, part, 0, 1, &yo, 1);
                y[r * ldy + o] = k0 > 0 ? y[r * ldy + o] + yo : yo;
            }
        }
}

#if defined(__x86_64__)
extern const cpu_qkernels cpu_qkernels_avx2, cpu_qkernels_avx512;
#elif defined(__aarch64__)
extern const cpu_qkernels cpu_qkernels_neon;
#endif

const cpu_qkernels *cpu_qkernels_for(const char *name) {
    static const cpu_qkernels *const all[] = {
#if defined(__x86_64__)
        &cpu_qkernels_avx2,
        &cpu_qkernels_avx512,
#elif defined(__aarch64__)
        &cpu_qkernels_neon,
#endif
        &cpu_qkernels_portable
    };
    for (size_t i = 0; name && i < sizeof all / sizeof all[0]; i++)
        if (strcmp(all[i]->name, name) == 0) return all[i];
    return &cpu_qkernels_portable;
}
