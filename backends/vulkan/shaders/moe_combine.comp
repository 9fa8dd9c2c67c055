#version 450
#extension GL_GOOGLE_include_directive : require
// dst f32 [n, d] = sum_j w[r, j] * y[r, j, :].
layout(constant_id = 0) const uint WG = 256;
layout(local_size_x_id = 0) in;
#include "common.glsl"

BUF(0, D)
RBUF(1, Y)
RBUF(2, W)

layout(push_constant) uniform PC {
    PC_OFFSETS
    uint total; // n * d
    uint d;
    uint k;
} pc;

void main() {
    uint i = group_index() * WG + gl_LocalInvocationID.x;
    if (i >= pc.total) return;
    uint r = i / pc.d, c = i - r * pc.d;
    float o = 0.0;
    for (uint s = 0; s < pc.k; s++)
        o += uintBitsToFloat(W[pc.ob + r * pc.k + s]) *
             uintBitsToFloat(Y[pc.oa + (r * pc.k + s) * pc.d + c]);
    D[pc.od + i] = floatBitsToUint(o);
}
