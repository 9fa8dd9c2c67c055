#version 450
#extension GL_GOOGLE_include_directive : require
// The end of a product split over k (matmul_big.comp): dst[i] = the splits' sums of element
// i of [rows, out] added in split order, + bias[i % out]. One thread an element.
layout(constant_id = 0) const uint WG = 256;
layout(local_size_x_id = 0) in;
#include "common.glsl"

BUF(0, D)
RBUF(1, P)
RBUF(3, BIAS)

layout(push_constant) uniform PC {
    PC_OFFSETS
    uint n;      // elements of dst
    uint out_;
    uint nsplit;
    uint has_bias;
    uint tbias;
} pc;

void main() {
    uint i = group_index() * WG + gl_LocalInvocationID.x;
    if (i >= pc.n) return;
    float s = 0.0;
    for (uint z = 0; z < pc.nsplit; z++) s += uintBitsToFloat(P[pc.oa + z * pc.n + i]);
    if (pc.has_bias != 0u) s += LOADF(BIAS, pc.tbias, pc.oc + i % pc.out_);
    D[pc.od + i] = floatBitsToUint(s);
}
