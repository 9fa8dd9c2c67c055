#version 450
#extension GL_GOOGLE_include_directive : require
// dst = x / sqrt(mean(x^2) + eps) * (w + off), one workgroup per row.
layout(constant_id = 0) const uint WG = 256;
layout(local_size_x_id = 0) in;
#define NEED_WG_SUM
#include "common.glsl"

BUF(0, D)
RBUF(1, A)
RBUF(2, W)

layout(push_constant) uniform PC {
    PC_OFFSETS
    uint d;
    uint rows;
    uint has_w;
    uint tw;
    float eps;
    float off;
} pc;

void main() {
    uint row = group_index();
    if (row >= pc.rows) return; // uniform over the workgroup
    uint l = gl_LocalInvocationID.x, base = row * pc.d;
    float ss = 0.0;
    for (uint i = l; i < pc.d; i += WG) {
        float x = uintBitsToFloat(A[pc.oa + base + i]);
        ss += x * x;
    }
    ss = wg_sum(ss);
    float s = 1.0 / sqrt(ss / float(pc.d) + pc.eps);
    for (uint i = l; i < pc.d; i += WG) {
        float y = uintBitsToFloat(A[pc.oa + base + i]) * s;
        if (pc.has_w != 0u) y *= LOADF(W, pc.tw, pc.ob + i) + pc.off;
        D[pc.od + base + i] = floatBitsToUint(y);
    }
}
