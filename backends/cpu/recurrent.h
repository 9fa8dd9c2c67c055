/* The CPU backend's recurrent (state space) ops over plain arrays, one sequence's rows at
 * a time (ops.h: CONV1D, SSM_SCAN, SSD_SCAN, DELTA_RULE). Each walks the rows in order and
 * updates the state as the one-step form does, with the vector loops of the SIMD table:
 * on a CPU that is also the cheapest form for a long chunk (the state of a head stays in
 * cache across the rows, and it does the fewest multiply-adds), and it keeps a row's
 * result the same bits however the rows are split into steps. Each function does the part
 * [i0, i1) of its op's independent work, so the backend spreads it over its threads.
 * Weights come as f32 (the backend converts the small vectors once an op). */
#ifndef LMHOST_CPU_RECURRENT_H
#define LMHOST_CPU_RECURRENT_H

#include "kernels.h"

#include <stdint.h>

/* y = act(causal depthwise convolution), channels [c0, c1) of C; x, y [n, C]; w [C, K];
 * bias [C] or NULL; state [K - 1, C] in/out. act: LMH_UNARY_* (ops.h). */
void cpu_conv1d(const float *x, int64_t n, int64_t C, int64_t K, const float *w, const float *bias,
                float *state, float *y, int act, int64_t c0, int64_t c1);

/* Mamba-1 selective scan, channels [c0, c1) of D: x, dt, y [n, D]; A (= -exp(A_log), f32)
 * [D, N]; B, C [n, N]; Dskip, dt_bias [D] or NULL; state [D, N] in/out. */
void cpu_ssm_scan(const cpu_kernels *k, const float *x, const float *dt, int64_t n, int64_t D,
                  int64_t N, const float *A, const float *B, const float *C, const float *Dskip,
                  const float *dt_bias, float *state, float *y, int64_t c0, int64_t c1);

/* Mamba-2 scan, rows [r0, r1) of the H * P (head, channel) rows of the state [H, P, N]:
 * x, y [n, H * P]; dt [n, H]; A (= -exp(A_log)) [H]; B, C [n, G * N]; Dskip, dt_bias [H]
 * or NULL; d is clamped to [lo, hi]. */
void cpu_ssd_scan(const cpu_kernels *k, const float *x, const float *dt, int64_t n, int64_t H,
                  int64_t P, int64_t G, int64_t N, const float *A, const float *B, const float *C,
                  const float *Dskip, const float *dt_bias, float lo, float hi, float *state,
                  float *y, int64_t r0, int64_t r1);

/* Gated delta rule, parts [i0, i1) of Hv heads x ceil(dv / DELTA_COLS) column blocks:
 * q, k [n, Hk, dk]; v, o [n, Hv, dv]; a, b [n, Hv]; A (= -exp(A_log)), dt_bias [Hv] (bias
 * may be NULL); state [Hv, dk, dv]. l2: normalise q and k (eps); qscale multiplies q. */
#define DELTA_COLS 64
void cpu_delta_rule(const cpu_kernels *k, const float *q, const float *kk, const float *v,
                    const float *a, const float *b, int64_t n, int64_t Hk, int64_t Hv, int64_t dk,
                    int64_t dv, const float *A, const float *dt_bias, int l2, float eps,
                    float qscale, float *state, float *o, int64_t i0, int64_t i1);

/* f(x) of LMH_OP_UNARY (ops.h). */
float cpu_unary(int fn, float x);

#endif
