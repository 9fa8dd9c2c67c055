#version 450
#extension GL_GOOGLE_include_directive : require
// MoE routing, one thread per row: softmax over the experts, top k by repeated selection
// (ties to the lower id, like torch.topk), optionally renormalised over the chosen k.
layout(constant_id = 0) const uint WG = 64;
layout(local_size_x_id = 0) in;
#include "common.glsl"

#define MAXK 32

BUF(0, D)   // f32 [n, k] weights
RBUF(1, A)  // f32 [n, E] router logits
BUF(2, IDS) // i32 [n, k] chosen experts (written)

layout(push_constant) uniform PC {
    PC_OFFSETS
    uint n;
    uint E;
    uint k;
    uint renorm;
} pc;

void main() {
    uint r = group_index() * WG + gl_LocalInvocationID.x;
    if (r >= pc.n) return;
    uint xb = pc.oa + r * pc.E;
    float mx = -3.0e38;
    for (uint e = 0; e < pc.E; e++) mx = max(mx, uintBitsToFloat(A[xb + e]));
    float sum = 0.0;
    for (uint e = 0; e < pc.E; e++) sum += exp(uintBitsToFloat(A[xb + e]) - mx);
    uint sel[MAXK];
    float wt[MAXK], chosen = 0.0;
    for (uint s = 0; s < pc.k; s++) {
        int best = -1;
        float bv = 0.0;
        for (uint e = 0; e < pc.E; e++) {
            bool taken = false;
            for (uint t = 0; t < s; t++) taken = taken || sel[t] == e;
            float v = uintBitsToFloat(A[xb + e]);
            if (!taken && (best < 0 || v > bv)) {
                best = int(e);
                bv = v;
            }
        }
        sel[s] = uint(best);
        wt[s] = exp(bv - mx) / sum;
        chosen += wt[s];
    }
    for (uint s = 0; s < pc.k; s++) {
        float w = pc.renorm != 0u && chosen > 0.0 ? wt[s] / chosen : wt[s];
        D[pc.od + r * pc.k + s] = floatBitsToUint(w);
        IDS[pc.ob + r * pc.k + s] = sel[s];
    }
}
