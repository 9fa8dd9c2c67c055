#version 450
#extension GL_GOOGLE_include_directive : require
// LMH_OP_SSM_SCAN (Mamba-1, SSD = 0) and LMH_OP_SSD_SCAN (Mamba-2, SSD = 1) row by row:
// the one-step form of decode, and the fallback of any length. A "channel" is a row of
// the state (Mamba-1: one of D; Mamba-2: a (head, channel) of H * P), its N states spread
// over LPC lanes, SPT a lane, kept in registers across the rows (GLOBAL: in the state
// buffer itself, for N past what registers hold); every channel is independent.
// For each row t and channel c (Mamba-2: of head h, group g):
//   d = softplus(dt + dt_bias) (Mamba-2: clamped to [lo, hi]), a = exp(A d), A = -exp(A_log),
//   h[s] = a h[s] + d x B[s],  y = sum_s h[s] C[s] + D x
// (Mamba-1's A per state, Mamba-2's per head). Lanes leave their parts of y in shared
// memory for TB rows, then one barrier and the sums: not a barrier a row.
layout(constant_id = 0) const uint WG = 128;
layout(constant_id = 1) const uint LPC = 16; // lanes a channel: a power of two <= WG
layout(constant_id = 2) const uint SPT = 1;  // states a lane (in registers)
layout(constant_id = 3) const uint SSD = 0;
layout(constant_id = 4) const uint GLOBAL = 0;
layout(constant_id = 5) const uint TB = 16;
layout(local_size_x_id = 0) in;
#include "common.glsl"
#include "unary.glsl"

BUF(0, Y)
RBUF(1, X)
RBUF(2, DT)
RBUF(3, AL)
RBUF(4, B)
RBUF(5, C)
RBUF(6, DD)
RBUF(7, DTB)
BUF(8, ST)

layout(push_constant) uniform PC {
    PC_OFFSETS     // y, x, dt, A_log, B
    uint oC, oD, oT, oS; // C, D, dt_bias, state
    uint n;        // rows
    uint nch;      // channels (D, or H * P)
    uint N;        // states
    uint P;        // Mamba-2: channels a head
    uint H;        // Mamba-2: heads
    uint G;        // Mamba-2: groups of B and C
    uint spt;      // GLOBAL: states a lane
    uint has_d, has_dtb, ta, td, tdtb; // optional D and dt_bias; dtypes of A_log, D, dt_bias
    float lo, hi;  // Mamba-2: d's bounds (has_hi: an upper one)
    uint has_hi;
} pc;

const uint CPW = WG / LPC;
shared float red[TB * WG];

void main() {
    uint lid = gl_LocalInvocationID.x, lane = lid % LPC, cl = lid / LPC;
    uint ch0 = group_index() * CPW, ch = ch0 + cl;
    bool ok = ch < pc.nch;
    uint c = ok ? ch : 0u;
    uint hd = SSD != 0u ? c / pc.P : c; // what dt, dt_bias and D are indexed by
    uint g = SSD != 0u ? hd / (pc.H / pc.G) : 0u;
    uint dtw = SSD != 0u ? pc.H : pc.nch; // dt's row
    float ah = SSD != 0u ? -exp(LOADF(AL, pc.ta, pc.oc + hd)) : 0.0;
    float dtb = pc.has_dtb != 0u ? LOADF(DTB, pc.tdtb, pc.oT + hd) : 0.0;
    float hs[SPT], av[SPT];
    if (GLOBAL == 0u)
        [[unroll]] for (uint k = 0; k < SPT; k++) {
            uint s = lane + k * LPC;
            bool in_ = ok && s < pc.N;
            hs[k] = in_ ? uintBitsToFloat(ST[pc.oS + c * pc.N + s]) : 0.0;
            av[k] = in_ && SSD == 0u ? -exp(LOADF(AL, pc.ta, pc.oc + c * pc.N + s)) : 0.0;
        }
    for (uint t0 = 0; t0 < pc.n; t0 += TB) {
        uint tn = min(TB, pc.n - t0);
        for (uint tt = 0; tt < tn; tt++) {
            uint t = t0 + tt;
            float part = 0.0;
            if (ok) {
                float d = softplus_f(uintBitsToFloat(DT[pc.ob + t * dtw + hd]) + dtb);
                if (SSD != 0u) {
                    d = d < pc.lo ? pc.lo : d;
                    if (pc.has_hi != 0u && d > pc.hi) d = pc.hi;
                }
                float a = exp(ah * d);
                float dx = d * uintBitsToFloat(X[pc.oa + t * pc.nch + ch]);
                uint bo = SSD != 0u ? (t * pc.G + g) * pc.N : t * pc.N;
                if (GLOBAL != 0u) {
                    for (uint k = 0; k < pc.spt; k++) {
                        uint s = lane + k * LPC;
                        if (s >= pc.N) break;
                        uint si = pc.oS + c * pc.N + s;
                        float as = SSD != 0u ? a
                                             : exp(d * -exp(LOADF(AL, pc.ta, pc.oc + c * pc.N + s)));
                        float h = as * uintBitsToFloat(ST[si]) + dx * uintBitsToFloat(B[pc.oe + bo + s]);
                        part += h * uintBitsToFloat(C[pc.oC + bo + s]);
                        ST[si] = floatBitsToUint(h);
                    }
                } else {
                    // (no early exit: the loop unrolls and hs, av stay in registers)
                    [[unroll]] for (uint k = 0; k < SPT; k++) {
                        uint s = lane + k * LPC;
                        if (s < pc.N) {
                            float as = SSD != 0u ? a : exp(d * av[k]);
                            hs[k] = as * hs[k] + dx * uintBitsToFloat(B[pc.oe + bo + s]);
                            part += hs[k] * uintBitsToFloat(C[pc.oC + bo + s]);
                        }
                    }
                }
            }
            red[tt * WG + lid] = part;
        }
        barrier();
        for (uint o = lid; o < tn * CPW; o += WG) {
            uint tt = o / CPW, c2 = o - tt * CPW, ch2 = ch0 + c2;
            if (ch2 >= pc.nch) continue;
            float y = 0.0;
            for (uint l = 0; l < LPC; l++) y += red[tt * WG + c2 * LPC + l];
            uint i = (t0 + tt) * pc.nch + ch2;
            if (pc.has_d != 0u)
                y += LOADF(DD, pc.td, pc.oD + (SSD != 0u ? ch2 / pc.P : ch2)) *
                     uintBitsToFloat(X[pc.oa + i]);
            Y[pc.od + i] = floatBitsToUint(y);
        }
        barrier();
    }
    if (GLOBAL == 0u && ok)
        [[unroll]] for (uint k = 0; k < SPT; k++) {
            uint s = lane + k * LPC;
            if (s < pc.N) ST[pc.oS + c * pc.N + s] = floatBitsToUint(hs[k]);
        }
}
