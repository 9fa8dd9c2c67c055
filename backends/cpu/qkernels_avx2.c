/* Quantized kernels for AVX2+FMA. Eight codes at a time: their bits lie in `bits` bytes
 * (8 codes * bits / 8), so one 8-byte load broadcast to both halves, a byte shuffle that
 * puts each code's two bytes in its 32-bit lane, a variable shift and a mask unpack them
 * for every bit width with the same four instructions. */
#include "qkernels.h"

#include <immintrin.h>
#include <string.h>

typedef struct unpacker {
    __m256i shuf, shift, mask;
} unpacker;

static unpacker make_unpacker(int bits) {
    int8_t s[32];
    int32_t sh[8];
    for (int i = 0; i < 8; i++) {
        /* lanes 4..7 sit in the upper half, which holds the same 8 bytes (pshufb is per
         * half) */
        int lo = (i * bits) >> 3, at = (i / 4) * 16 + (i % 4) * 4;
        s[at + 0] = (int8_t)lo;
        s[at + 1] = (int8_t)(lo + 1);
        s[at + 2] = -1;
        s[at + 3] = -1;
        sh[i] = (i * bits) & 7;
    }
    unpacker u;
    u.shuf = _mm256_loadu_si256((const __m256i *)s);
    u.shift = _mm256_loadu_si256((const __m256i *)sh);
    u.mask = _mm256_set1_epi32((1 << bits) - 1);
    return u;
}

/* Eight codes from p (reads 8 bytes; the caller pads the tensor's last group). */
static inline __m256 unpack8(const unpacker *u, const uint8_t *p) {
    __m256i v = _mm256_broadcastsi128_si256(_mm_loadl_epi64((const __m128i *)p));
    v = _mm256_shuffle_epi8(v, u->shuf);
    v = _mm256_and_si256(_mm256_srlv_epi32(v, u->shift), u->mask);
    return _mm256_cvtepi32_ps(v);
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

/* The bytes of group g of row o, padded when the 8-byte loads would run past the tensor. */
static inline const uint8_t *group_bytes(const cpu_qmat *w, int64_t o, int64_t g, uint8_t *pad) {
    const int64_t gb = (int64_t)w->group * w->bits / 8;
    const uint8_t *p = (const uint8_t *)(w->q + o * w->wpr) + g * gb;
    const uint8_t *end = (const uint8_t *)(w->q + w->rows * w->wpr);
    if (end - p < gb + 16) { /* the loads of the last groups would run past the data */
        memcpy(pad, p, (size_t)gb);
        memset(pad + gb, 0, 16);
        return pad;
    }
    return p;
}

static inline __attribute__((always_inline)) void
tile(const unpacker *u, const float *x, const float *xsum, int64_t r0, const cpu_qmat *w,
     int64_t o, float *y, int64_t ldy, const int NR) {
    const int64_t in = w->in, gpr = w->gpr;
    const int32_t G = w->group, bits = w->bits;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    float bsum[4] = {0, 0, 0, 0};
    uint8_t pad[160];
    for (int64_t g = 0; g < gpr; g++) {
        const uint8_t *p = group_bytes(w, o, g, pad);
        __m256 d[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                       _mm256_setzero_ps()};
        const float *xg = x + r0 * in + g * G;
        for (int32_t c = 0; c < G; c += 8, p += bits) {
            __m256 q = unpack8(u, p);
            for (int r = 0; r < NR; r++) d[r] = _mm256_fmadd_ps(q, _mm256_loadu_ps(xg + r * in + c), d[r]);
        }
        __m256 s = _mm256_set1_ps(cpu_q_sb(w, w->scales, o * gpr + g));
        float b = cpu_q_sb(w, w->biases, o * gpr + g);
        for (int r = 0; r < NR; r++) {
            acc[r] = _mm256_fmadd_ps(s, d[r], acc[r]);
            bsum[r] += b * xsum[(r0 + r) * gpr + g];
        }
    }
    for (int r = 0; r < NR; r++) y[(r0 + r) * ldy + o] = hsum(acc[r]) + bsum[r];
}

static void matmul_avx2(const float *x, const float *xsum, int64_t n, const cpu_qmat *w,
                        int64_t o0, int64_t o1, float *y, int64_t ldy) {
    const unpacker u = make_unpacker(w->bits);
    /* Blocks of 16 weight rows stay in L1/L2 while every tile of 4 x rows passes. */
    for (int64_t ob = o0; ob < o1; ob += 16) {
        int64_t oe = ob + 16 < o1 ? ob + 16 : o1;
        for (int64_t r0 = 0; r0 < n; r0 += 4) {
            int64_t nr = n - r0;
            for (int64_t o = ob; o < oe; o++) {
                if (nr >= 4) tile(&u, x, xsum, r0, w, o, y, ldy, 4);
                else if (nr == 3) tile(&u, x, xsum, r0, w, o, y, ldy, 3);
                else if (nr == 2) tile(&u, x, xsum, r0, w, o, y, ldy, 2);
                else tile(&u, x, xsum, r0, w, o, y, ldy, 1);
            }
        }
    }
}

static void dequant_row_avx2(const cpu_qmat *w, int64_t row, float *y) {
    const unpacker u = make_unpacker(w->bits);
    uint8_t pad[160];
    for (int64_t g = 0; g < w->gpr; g++) {
        const uint8_t *p = group_bytes(w, row, g, pad);
        __m256 s = _mm256_set1_ps(cpu_q_sb(w, w->scales, row * w->gpr + g));
        __m256 b = _mm256_set1_ps(cpu_q_sb(w, w->biases, row * w->gpr + g));
        for (int32_t c = 0; c < w->group; c += 8, p += w->bits)
            _mm256_storeu_ps(y + g * w->group + c, _mm256_fmadd_ps(unpack8(&u, p), s, b));
    }
}

const cpu_qkernels cpu_qkernels_avx2 = {
    .name = "avx2",
    .matmul = matmul_avx2,
    .dequant_row = dequant_row_avx2,
};
