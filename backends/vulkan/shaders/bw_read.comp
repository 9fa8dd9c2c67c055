#version 450
#extension GL_GOOGLE_include_directive : require
// The device memory's read bandwidth probe (vk_read_bandwidth): every thread reads RU
// 16-byte words of binding 1, a grid-stride apart so that each load instruction of a
// subgroup covers contiguous memory, and folds them; the fold is stored only where it
// equals a value the data never gives, so the loads cannot be optimised away and nothing
// else is written.
layout(constant_id = 0) const uint WG = 256;
layout(constant_id = 1) const uint RU = 16;
layout(local_size_x_id = 0) in;
#include "common.glsl"

BUF(0, D)
RBUF4(1, A)

layout(push_constant) uniform PC {
    PC_OFFSETS
    uint n4; // 16-byte words of binding 1 to read
} pc;

void main() {
    uint stride = gl_NumWorkGroups.x * WG, i = gl_WorkGroupID.x * WG + gl_LocalInvocationID.x;
    uvec4 acc = uvec4(0u);
    uvec4 w[RU];
    [[unroll]] for (uint u = 0; u < RU; u++) w[u] = i + u * stride < pc.n4 ? A4[i + u * stride] : uvec4(0u);
    [[unroll]] for (uint u = 0; u < RU; u++) acc ^= w[u];
    if (acc == uvec4(0x9e3779b9u, 0x7f4a7c15u, 0xf39cc060u, 0x5ced1b1fu)) D[pc.od] = acc.x;
}
