/* Quantized kernels in portable C, the helpers every path shares, and the choice of table. */
#include "qkernels.h"
#include "kernels.h"

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

void cpu_q_group_sums(const float *x, int64_t n, int64_t in, int32_t group, float *xsum) {
    int64_t gpr = in / group;
    for (int64_t r = 0; r < n; r++)
        for (int64_t g = 0; g < gpr; g++) {
            const float *p = x + r * in + g * group;
            float s = 0;
            for (int32_t k = 0; k < group; k++) s += p[k];
            xsum[r * gpr + g] = s;
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

#define TILE 4

static void matmul_portable(const float *x, const float *xsum, int64_t n, const cpu_qmat *w,
                            int64_t o0, int64_t o1, float *y, int64_t ldy) {
    const int64_t in = w->in, gpr = w->gpr, gw = (int64_t)w->group * w->bits / 32;
    float q[128];
    for (int64_t r0 = 0; r0 < n; r0 += TILE) {
        int64_t nr = n - r0 < TILE ? n - r0 : TILE;
        for (int64_t o = o0; o < o1; o++) {
            const uint32_t *row = w->q + o * w->wpr;
            double acc[TILE] = {0};
            for (int64_t g = 0; g < gpr; g++) {
                unpack_group(row + g * gw, w->group, w->bits, q); /* once per tile */
                float s = cpu_q_sb(w, w->scales, o * gpr + g);
                float b = cpu_q_sb(w, w->biases, o * gpr + g);
                for (int64_t r = 0; r < nr; r++) {
                    const float *xp = x + (r0 + r) * in + g * w->group;
                    float d = 0;
                    for (int32_t k = 0; k < w->group; k++) d += xp[k] * q[k];
                    acc[r] += (double)(s * d + b * xsum[(r0 + r) * gpr + g]);
                }
            }
            for (int64_t r = 0; r < nr; r++) y[(r0 + r) * ldy + o] = (float)acc[r];
        }
    }
}

static void dequant_row_portable(const cpu_qmat *w, int64_t row, float *y) {
    const int64_t gw = (int64_t)w->group * w->bits / 32;
    for (int64_t g = 0; g < w->gpr; g++) {
        float *yp = y + g * w->group;
        unpack_group(w->q + row * w->wpr + g * gw, w->group, w->bits, yp);
        float s = cpu_q_sb(w, w->scales, row * w->gpr + g);
        float b = cpu_q_sb(w, w->biases, row * w->gpr + g);
        for (int32_t k = 0; k < w->group; k++) yp[k] = s * yp[k] + b;
    }
}

const cpu_qkernels cpu_qkernels_portable = {
    .name = "portable",
    .matmul = matmul_portable,
    .dequant_row = dequant_row_portable,
};

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
