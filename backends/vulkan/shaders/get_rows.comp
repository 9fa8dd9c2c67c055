#version 450
#extension GL_GOOGLE_include_directive : require
// dst f32 [n, d] = table[ids[i], :]; an id outside [0, V) gives a row of zeros.
layout(constant_id = 0) const uint WG = 256;
layout(constant_id = 1) const uint TDT = 0;
layout(local_size_x_id = 0) in;
#include "common.glsl"

BUF(0, D)
RBUF(1, T)
RBUF(2, IDS)

layout(push_constant) uniform PC {
    PC_OFFSETS
    uint total; // n * d
    uint d;
    uint V;
} pc;

void main() {
    uint i = group_index() * WG + gl_LocalInvocationID.x;
    if (i >= pc.total) return;
    uint r = i / pc.d, c = i - r * pc.d;
    int id = int(IDS[pc.ob + r]);
    float v = 0.0;
    if (id >= 0 && uint(id) < pc.V) v = LOADF(T, TDT, pc.oa + uint(id) * pc.d + c);
    D[pc.od + i] = floatBitsToUint(v);
}
