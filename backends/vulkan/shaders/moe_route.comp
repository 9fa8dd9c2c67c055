#version 450
#extension GL_GOOGLE_include_directive : require
// MoE routing, a workgroup per row: softmax over the experts, top k by repeated selection
// (ties to the lower id, like torch.topk), optionally renormalised over the chosen k. With
// has_m (ABI 1.11) row r takes only its best m = M[r] (clamped to 1..k): the columns past m
// repeat column 0's expert at weight 0, and renormalisation is over the m. The
// threads share each pass over the experts and reduce in shared memory: one thread a row took
// 88 us a decode step for 64 experts, top 6, on an H200.
layout(constant_id = 0) const uint WG = 64;
layout(local_size_x_id = 0) in;
#include "common.glsl"

#define MAXK 32
#define NONE 0xffffffffu

BUF(0, D)   // f32 [n, k] weights
RBUF(1, A)  // f32 [n, E] router logits
BUF(2, IDS) // i32 [n, k] chosen experts (written)
RBUF(3, M)  // i32 [n] experts each row uses (has_m only)

layout(push_constant) uniform PC {
    PC_OFFSETS
    uint n;
    uint E;
    uint k;
    uint renorm;
    uint has_m;
} pc;

shared float sv[WG];
shared uint si[WG];
shared uint sel[MAXK];
shared float selv[MAXK];

// the tree over sv: max (op 0) or sum (op 1); every thread gets the result
float reduce(float x, uint op) {
    uint t = gl_LocalInvocationID.x;
    sv[t] = x;
    barrier();
    for (uint h = WG / 2; h > 0; h >>= 1) {
        if (t < h) sv[t] = op == 0u ? max(sv[t], sv[t + h]) : sv[t] + sv[t + h];
        barrier();
    }
    float r = sv[0];
    barrier();
    return r;
}

void main() {
    const uint r = group_index(), t = gl_LocalInvocationID.x;
    if (r >= pc.n) return; // the whole workgroup: r is the same for all its threads
    const uint use = pc.has_m != 0u ? uint(clamp(int(M[pc.oc + r]), 1, int(pc.k))) : pc.k;
    const uint xb = pc.oa + r * pc.E;
    float m = -3.0e38;
    for (uint e = t; e < pc.E; e += WG) m = max(m, uintBitsToFloat(A[xb + e]));
    const float mx = reduce(m, 0u);
    float s = 0.0;
    for (uint e = t; e < pc.E; e += WG) s += exp(uintBitsToFloat(A[xb + e]) - mx);
    const float sum = reduce(s, 1u);
    for (uint q = 0; q < use; q++) {
        // each thread's best untaken expert (its own in increasing order: ties keep the
        // lower id), then the best of those
        float bv = 0.0;
        uint bi = NONE;
        for (uint e = t; e < pc.E; e += WG) {
            bool taken = false;
            for (uint p = 0; p < q; p++) taken = taken || sel[p] == e;
            float v = uintBitsToFloat(A[xb + e]);
            if (!taken && (bi == NONE || v > bv)) {
                bi = e;
                bv = v;
            }
        }
        sv[t] = bv;
        si[t] = bi;
        barrier();
        for (uint h = WG / 2; h > 0; h >>= 1) {
            if (t < h) {
                uint oi = si[t + h];
                float ov = sv[t + h];
                if (oi != NONE &&
                    (si[t] == NONE || ov > sv[t] || (ov == sv[t] && oi < si[t]))) {
                    si[t] = oi;
                    sv[t] = ov;
                }
            }
            barrier();
        }
        if (t == 0) {
            sel[q] = si[0];
            selv[q] = sv[0];
        }
        barrier();
    }
    if (t == 0) {
        float wt[MAXK], chosen = 0.0;
        for (uint q = 0; q < use; q++) {
            wt[q] = exp(selv[q] - mx) / sum;
            chosen += wt[q];
        }
        for (uint q = 0; q < pc.k; q++) {
            float w = q >= use                        ? 0.0
                      : pc.renorm != 0u && chosen > 0.0 ? wt[q] / chosen
                                                        : wt[q];
            D[pc.od + r * pc.k + q] = floatBitsToUint(w);
            IDS[pc.ob + r * pc.k + q] = q < use ? sel[q] : sel[0];
        }
    }
}
