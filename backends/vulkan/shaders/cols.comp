#version 450
#extension GL_GOOGLE_include_directive : require
// LMH_OP_COLS: dst [rows, w] = columns of src0 [rows, W]: those from `from` on, or (gather)
// src0[r, idx[j]] with idx i32 [w] (checked in range before: vk_ops.c). One thread an
// element of dst.
layout(constant_id = 0) const uint WG = 256;
layout(local_size_x_id = 0) in;
#include "common.glsl"

BUF(0, D)
RBUF(1, A)
RBUF(2, IDX)

layout(push_constant) uniform PC {
    PC_OFFSETS
    uint n;      // elements of dst
    uint w;      // dst's row
    uint W;      // src0's row
    uint from;   // first column (no gather)
    uint gather; // src1 holds the columns
} pc;

void main() {
    uint i = group_index() * WG + gl_LocalInvocationID.x;
    if (i >= pc.n) return;
    uint r = i / pc.w, j = i - r * pc.w;
    uint c = pc.gather != 0u ? IDX[pc.ob + j] : pc.from + j;
    D[pc.od + i] = c < pc.W ? A[pc.oa + r * pc.W + c] : 0u;
}
