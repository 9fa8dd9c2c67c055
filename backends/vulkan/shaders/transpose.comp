#version 450
#extension GL_GOOGLE_include_directive : require
// dst f32 [b, a, c] = src0 f32 [a, b, c] with the outer two dimensions swapped.
layout(constant_id = 0) const uint WG = 256;
layout(local_size_x_id = 0) in;
#include "common.glsl"

BUF(0, D)
RBUF(1, A)

layout(push_constant) uniform PC {
    PC_OFFSETS
    uint total;
    uint A_, B_, C_;
} pc;

void main() {
    uint i = group_index() * WG + gl_LocalInvocationID.x;
    if (i >= pc.total) return;
    uint row = i / pc.C_, c = i - row * pc.C_; // dst row (j, i')
    uint j = row / pc.A_, ii = row - j * pc.A_;
    D[pc.od + i] = A[pc.oa + (ii * pc.B_ + j) * pc.C_ + c];
}
