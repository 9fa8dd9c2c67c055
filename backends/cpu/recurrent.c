/* The recurrent ops' loops (recurrent.h). */
#include "recurrent.h"
#include "lmhost/ops.h"

#include <math.h>
#include <string.h>

static inline float softplus(float v) {
    return v > 20.0f ? v : log1pf(expf(v)); /* torch's threshold */
}

static inline float sigmoid(float v) {
    return 1.0f / (1.0f + expf(-v));
}

float cpu_unary(int fn, float v) {
    switch (fn) {
    case LMH_UNARY_SILU:
        return v / (1.0f + expf(-v));
    case LMH_UNARY_RELU:
        return v > 0.0f ? v : 0.0f;
    case LMH_UNARY_RELU2:
        return v > 0.0f ? v * v : 0.0f;
    case LMH_UNARY_SIGMOID:
        return sigmoid(v);
    case LMH_UNARY_SOFTPLUS:
        return softplus(v);
    case LMH_UNARY_GELU_TANH: {
        const float c = 0.7978845608028654f; /* sqrt(2/pi) */
        return 0.5f * v * (1.0f + tanhf(c * (v + 0.044715f * v * v * v)));
    }
    default:
        return v;
    }
}

#define CONV_BLOCK 64 /* channels a pass: a row's block stays in one cache line run */

void cpu_conv1d(const float *x, int64_t n, int64_t C, int64_t K, const float *w, const float *bias,
                float *state, float *y, int act, int64_t c0, int64_t c1) {
    const int64_t S = K - 1; /* rows of state */
    float keep[CONV_BLOCK * 64];
    for (int64_t cb = c0; cb < c1; cb += CONV_BLOCK) {
        const int64_t ce = cb + CONV_BLOCK < c1 ? cb + CONV_BLOCK : c1;
        /* xx(i, c): the state's rows, then x's */
#define XX(i, c) ((i) < S ? state[(i)*C + (c)] : x[((i)-S) * C + (c)])
        for (int64_t t = 0; t < n; t++)
            for (int64_t c = cb; c < ce; c++) {
                float acc = bias ? bias[c] : 0.0f;
                for (int64_t j = 0; j < K; j++) acc += w[c * K + j] * XX(t + j, c);
                y[t * C + c] = cpu_unary(act, acc);
            }
        /* the window after x: the last S rows of (state, x), read before any is written */
        for (int64_t i = 0; i < S; i++)
            for (int64_t c = cb; c < ce; c++) keep[i * CONV_BLOCK + (c - cb)] = XX(n + i, c);
        for (int64_t i = 0; i < S; i++)
            memcpy(state + i * C + cb, keep + i * CONV_BLOCK, (size_t)(ce - cb) * sizeof(float));
#undef XX
    }
}

void cpu_ssm_scan(const cpu_kernels *k, const float *x, const float *dt, int64_t n, int64_t D,
                  int64_t N, const float *A, const float *B, const float *C, const float *Dskip,
                  const float *dt_bias, float *state, float *y, int64_t c0, int64_t c1) {
    for (int64_t t = 0; t < n; t++) {
        const float *Bt = B + t * N, *Ct = C + t * N;
        for (int64_t c = c0; c < c1; c++) {
            const float xv = x[t * D + c];
            const float d = softplus(dt[t * D + c] + (dt_bias ? dt_bias[c] : 0.0f));
            const float dx = d * xv;
            float *h = state + c * N;
            const float *a = A + c * N;
            for (int64_t s = 0; s < N; s++) h[s] = expf(d * a[s]) * h[s] + dx * Bt[s];
            y[t * D + c] = k->dot_f32(h, Ct, N) + (Dskip ? Dskip[c] * xv : 0.0f);
        }
    }
}

void cpu_ssd_scan(const cpu_kernels *k, const float *x, const float *dt, int64_t n, int64_t H,
                  int64_t P, int64_t G, int64_t N, const float *A, const float *B, const float *C,
                  const float *Dskip, const float *dt_bias, float lo, float hi, float *state,
                  float *y, int64_t r0, int64_t r1) {
    const int64_t HP = H * P, per_group = H / G;
    for (int64_t t = 0; t < n; t++) {
        int64_t h_prev = -1;
        float d = 0, a = 0;
        for (int64_t r = r0; r < r1; r++) {
            const int64_t h = r / P, g = h / per_group;
            if (h != h_prev) { /* once a head and row */
                d = softplus(dt[t * H + h] + (dt_bias ? dt_bias[h] : 0.0f));
                d = d < lo ? lo : d > hi ? hi : d;
                a = expf(A[h] * d);
                h_prev = h;
            }
            const float xv = x[t * HP + r];
            const float *Bt = B + (t * G + g) * N, *Ct = C + (t * G + g) * N;
            float *s = state + r * N;
            k->axpby_f32(s, a, d * xv, Bt, N);
            y[t * HP + r] = k->dot_f32(s, Ct, N) + (Dskip ? Dskip[h] * xv : 0.0f);
        }
    }
}

/* x / sqrt(sum x^2 + eps) into out (d values). */
static void l2norm(const float *x, int64_t d, float eps, float scale, float *out) {
    double ss = 0;
    for (int64_t i = 0; i < d; i++) ss += (double)x[i] * x[i];
    const float s = scale / sqrtf((float)ss + eps);
    for (int64_t i = 0; i < d; i++) out[i] = x[i] * s;
}

void cpu_delta_rule(const cpu_kernels *k, const float *q, const float *kk, const float *v,
                    const float *a, const float *b, int64_t n, int64_t Hk, int64_t Hv, int64_t dk,
                    int64_t dv, const float *A, const float *dt_bias, int l2, float eps,
                    float qscale, float *state, float *o, int64_t i0, int64_t i1) {
    const int64_t blocks = (dv + DELTA_COLS - 1) / DELTA_COLS, rep = Hv / Hk;
    float qn[1024], kn[1024], mem[DELTA_COLS], out[DELTA_COLS];
    for (int64_t it = i0; it < i1; it++) {
        const int64_t h = it / blocks, j0 = (it % blocks) * DELTA_COLS;
        const int64_t w = dv - j0 < DELTA_COLS ? dv - j0 : DELTA_COLS, hk = h / rep;
        float *S = state + h * dk * dv + j0; /* row i of the block: S + i * dv */
        for (int64_t t = 0; t < n; t++) {
            const float *qt = q + (t * Hk + hk) * dk, *kt = kk + (t * Hk + hk) * dk;
            const float *vt = v + (t * Hv + h) * dv + j0;
            if (l2) {
                l2norm(qt, dk, eps, qscale, qn);
                l2norm(kt, dk, eps, 1.0f, kn);
            } else {
                for (int64_t i = 0; i < dk; i++) {
                    qn[i] = qt[i] * qscale;
                    kn[i] = kt[i];
                }
            }
            const float g = A[h] * softplus(a[t * Hv + h] + (dt_bias ? dt_bias[h] : 0.0f));
            const float eg = expf(g), beta = sigmoid(b[t * Hv + h]);
            /* what the decayed state recalls for k: (eg S)^T k, the decay applied once to
             * the sum rather than to each row, so that S is read twice a row, not three times */
            memset(mem, 0, sizeof mem);
            for (int64_t i = 0; i < dk; i++) k->axpy_f32(mem, kn[i], S + i * dv, w);
            for (int64_t j = 0; j < w; j++) mem[j] = beta * (vt[j] - eg * mem[j]);
            /* decay and write the correction along k, then read the new state with q */
            memset(out, 0, sizeof out);
            for (int64_t i = 0; i < dk; i++) {
                float *Si = S + i * dv;
                k->axpby_f32(Si, eg, kn[i], mem, w);
                k->axpy_f32(out, qn[i], Si, w);
            }
            memcpy(o + (t * Hv + h) * dv + j0, out, (size_t)w * sizeof(float));
        }
    }
}
