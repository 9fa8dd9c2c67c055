#version 450
#extension GL_GOOGLE_include_directive : require
// Merges attention.comp's split-K partials (max, sum, acc[dv]) of each (row, head).
layout(constant_id = 0) const uint WG = 128;
layout(local_size_x_id = 0) in;
#include "common.glsl"

BUF(0, D)
RBUF(5, P)

layout(push_constant) uniform PC {
    PC_OFFSETS
    uint nqh; // rows * heads
    uint dv;
    uint nsplit;
} pc;

void main() {
    uint qid = group_index();
    if (qid >= pc.nqh) return;
    uint stride = pc.dv + 2u, base = qid * pc.nsplit * stride;
    float M = -3.0e38;
    for (uint z = 0; z < pc.nsplit; z++) M = max(M, uintBitsToFloat(P[base + z * stride]));
    float L = 0.0;
    for (uint z = 0; z < pc.nsplit; z++) {
        float m = uintBitsToFloat(P[base + z * stride]);
        if (m > -1.0e38) L += uintBitsToFloat(P[base + z * stride + 1u]) * exp(m - M);
    }
    for (uint dim = gl_LocalInvocationID.x; dim < pc.dv; dim += WG) {
        float s = 0.0;
        for (uint z = 0; z < pc.nsplit; z++) {
            float m = uintBitsToFloat(P[base + z * stride]);
            if (m > -1.0e38) s += uintBitsToFloat(P[base + z * stride + 2u + dim]) * exp(m - M);
        }
        D[pc.od + qid * pc.dv + dim] = floatBitsToUint(L > 0.0 ? s / L : 0.0);
    }
}
