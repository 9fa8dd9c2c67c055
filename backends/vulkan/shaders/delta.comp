#version 450
#extension GL_GOOGLE_include_directive : require
// LMH_OP_DELTA_RULE row by row: the one-step form of decode, and the fallback of any
// length. State S [Hv, dk, dv]; each column j of a head's S is independent of the others:
//   S[:, j] = exp(g) S[:, j];  u = beta (v[j] - S[:, j] . k);  S[:, j] += u k;  o[j] = S[:, j] . q
// with g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b), q and k optionally
// L2-normalised and q scaled. A workgroup takes CPW columns of one value head, each column
// spread over LPC lanes of SPT rows (in registers across the rows); q and k of the row's
// key head (h / (Hv / Hk)) are shared by the workgroup. Built with USE_SUBGROUP, q's and k's
// norms are subgroup sums (a decode step's barriers were most of its time: H200).
layout(constant_id = 0) const uint WG = 128;
layout(constant_id = 1) const uint LPC = 32; // lanes a column: a power of two <= WG
layout(constant_id = 2) const uint SPT = 4;  // rows of S a lane
layout(constant_id = 3) const uint MAXDK = 128;
layout(local_size_x_id = 0) in;
#define NEED_WG_SUM
#include "common.glsl"
#include "unary.glsl"

BUF(0, O)
RBUF(1, Q)
RBUF(2, K)
RBUF(3, V)
RBUF(4, A)
RBUF(5, BB)
RBUF(6, AL)
RBUF(7, DTB)
BUF(8, ST)

layout(push_constant) uniform PC {
    PC_OFFSETS     // o, q, k, v, a
    uint oB, oA, oT, oS; // b, A_log, dt_bias, state
    uint n, Hk, Hv, dk, dv;
    uint l2;
    float eps, qscale;
    uint has_dtb, ta, tdtb;
    uint cblocks; // column blocks a head
} pc;

const uint CPW = WG / LPC;
shared float qs[MAXDK], ks[MAXDK], red[WG];

// The sum of v over the lanes of this thread's column, to all of them: each lane reads its
// column's LPC parts (broadcasts), two barriers where a tree would take 2 + log2(LPC).
float col_sum(float v, uint lid, uint lane) {
    red[lid] = v;
    barrier();
    float r = 0.0;
    for (uint l = 0; l < LPC; l++) r += red[lid - lane + l];
    barrier();
    return r;
}

void main() {
    uint lid = gl_LocalInvocationID.x, lane = lid % LPC, cl = lid / LPC;
    uint gi = group_index(), h = gi / pc.cblocks, jb = gi - h * pc.cblocks;
    if (h >= pc.Hv) return; // uniform over the workgroup
    uint j = jb * CPW + cl, hk = h / (pc.Hv / pc.Hk);
    bool ok = j < pc.dv;
    float ah = -exp(LOADF(AL, pc.ta, pc.oA + h));
    float dtb = pc.has_dtb != 0u ? LOADF(DTB, pc.tdtb, pc.oT + h) : 0.0;
    float S[SPT];
    [[unroll]] for (uint k = 0; k < SPT; k++) {
        uint i = lane + k * LPC;
        S[k] = ok && i < pc.dk ? uintBitsToFloat(ST[pc.oS + (h * pc.dk + i) * pc.dv + j]) : 0.0;
    }
    for (uint t = 0; t < pc.n; t++) {
        uint qk = (t * pc.Hk + hk) * pc.dk;
        float sq = 0.0, sk = 0.0;
        for (uint i = lid; i < pc.dk; i += WG) {
            float q = uintBitsToFloat(Q[pc.oa + qk + i]), kv = uintBitsToFloat(K[pc.ob + qk + i]);
            qs[i] = q;
            ks[i] = kv;
            sq += q * q;
            sk += kv * kv;
        }
        float fq = pc.qscale, fk = 1.0;
        if (pc.l2 != 0u) { // (wg_sum's barriers also publish qs and ks)
            fq = pc.qscale / sqrt(wg_sum(sq) + pc.eps);
            fk = 1.0 / sqrt(wg_sum(sk) + pc.eps);
        } else {
            barrier();
        }
        uint th = t * pc.Hv + h;
        float gd = ah * softplus_f(uintBitsToFloat(A[pc.oe + th]) + dtb);
        float eg = exp(gd), beta = sigmoid_f(uintBitsToFloat(BB[pc.oB + th]));
        float part = 0.0;
        [[unroll]] for (uint k = 0; k < SPT; k++) {
            uint i = lane + k * LPC;
            if (i < pc.dk) {
                S[k] *= eg;
                part += ks[i] * fk * S[k];
            }
        }
        float mem = col_sum(part, lid, lane);
        float u = ok ? beta * (uintBitsToFloat(V[pc.oc + th * pc.dv + j]) - mem) : 0.0;
        part = 0.0;
        [[unroll]] for (uint k = 0; k < SPT; k++) {
            uint i = lane + k * LPC;
            if (i < pc.dk) {
                S[k] += ks[i] * fk * u;
                part += qs[i] * fq * S[k];
            }
        }
        float o = col_sum(part, lid, lane);
        if (ok && lane == 0u) O[pc.od + th * pc.dv + j] = floatBitsToUint(o);
    }
    if (ok)
        [[unroll]] for (uint k = 0; k < SPT; k++) {
            uint i = lane + k * LPC;
            if (i < pc.dk) ST[pc.oS + (h * pc.dk + i) * pc.dv + j] = floatBitsToUint(S[k]);
        }
}
