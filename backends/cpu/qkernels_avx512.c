/* Quantized kernels for AVX-512 (F, BW, VL). Sixteen codes at a time: their bits lie in
 * 2 * bits bytes, so one 16-byte load broadcast to the four 128-bit lanes, a byte shuffle
 * that puts each code's two bytes in its 32-bit lane, a variable shift and a mask unpack
 * them for every bit width with the same four instructions. */
#include "qkernels.h"

#include <immintrin.h>
#include <string.h>

typedef struct unpacker {
    __m512i shuf, shift, mask;
} unpacker;

static unpacker make_unpacker(int bits) {
    int8_t s[64];
    int32_t sh[16];
    for (int i = 0; i < 16; i++) {
        /* every 128-bit lane holds the same 16 bytes (pshufb is per lane); for 8 bits the
         * second byte of code 15 wraps to byte 0, which the mask drops */
        int lo = (i * bits) >> 3, at = (i / 4) * 16 + (i % 4) * 4;
        s[at + 0] = (int8_t)lo;
        s[at + 1] = (int8_t)((lo + 1) & 15);
        s[at + 2] = -1;
        s[at + 3] = -1;
        sh[i] = (i * bits) & 7;
    }
    unpacker u;
    u.shuf = _mm512_loadu_si512(s);
    u.shift = _mm512_loadu_si512(sh);
    u.mask = _mm512_set1_epi32((1 << bits) - 1);
    return u;
}

/* Sixteen codes from p (reads 16 bytes; the caller pads the tensor's last group). */
static inline __m512 unpack16(const unpacker *u, const uint8_t *p) {
    __m512i v = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)p));
    v = _mm512_shuffle_epi8(v, u->shuf);
    v = _mm512_and_si512(_mm512_srlv_epi32(v, u->shift), u->mask);
    return _mm512_cvtepi32_ps(v);
}

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
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                     _mm512_setzero_ps()};
    float bsum[4] = {0, 0, 0, 0};
    uint8_t pad[160];
    for (int64_t g = 0; g < gpr; g++) {
        const uint8_t *p = group_bytes(w, o, g, pad);
        __m512 d[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                       _mm512_setzero_ps()};
        const float *xg = x + r0 * in + g * G;
        for (int32_t c = 0; c < G; c += 16, p += 2 * bits) {
            __m512 q = unpack16(u, p);
            for (int r = 0; r < NR; r++)
                d[r] = _mm512_fmadd_ps(q, _mm512_loadu_ps(xg + r * in + c), d[r]);
        }
        __m512 s = _mm512_set1_ps(cpu_q_sb(w, w->scales, o * gpr + g));
        float b = cpu_q_sb(w, w->biases, o * gpr + g);
        for (int r = 0; r < NR; r++) {
            acc[r] = _mm512_fmadd_ps(s, d[r], acc[r]);
            bsum[r] += b * xsum[(r0 + r) * gpr + g];
        }
    }
    for (int r = 0; r < NR; r++) y[(r0 + r) * ldy + o] = _mm512_reduce_add_ps(acc[r]) + bsum[r];
}

static void matmul_avx512(const float *x, const float *xsum, int64_t n, const cpu_qmat *w,
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

static void dequant_row_avx512(const cpu_qmat *w, int64_t row, float *y) {
    const unpacker u = make_unpacker(w->bits);
    uint8_t pad[160];
    for (int64_t g = 0; g < w->gpr; g++) {
        const uint8_t *p = group_bytes(w, row, g, pad);
        __m512 s = _mm512_set1_ps(cpu_q_sb(w, w->scales, row * w->gpr + g));
        __m512 b = _mm512_set1_ps(cpu_q_sb(w, w->biases, row * w->gpr + g));
        for (int32_t c = 0; c < w->group; c += 16, p += 2 * w->bits)
            _mm512_storeu_ps(y + g * w->group + c, _mm512_fmadd_ps(unpack16(&u, p), s, b));
    }
}

const cpu_qkernels cpu_qkernels_avx512 = {
    .name = "avx512",
    .matmul = matmul_avx512,
    .dequant_row = dequant_row_avx512,
};
