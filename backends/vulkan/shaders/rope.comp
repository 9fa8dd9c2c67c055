#version 450
#extension GL_GOOGLE_include_directive : require
// Rotary embedding of [n, heads, hd]: one thread per rotated pair, plus one per
// pass-through element when dst is not src0.
layout(constant_id = 0) const uint WG = 256;
layout(local_size_x_id = 0) in;
#include "common.glsl"

BUF(0, D)
RBUF(1, A)
RBUF(2, POS)
RBUF(3, INV)

layout(push_constant) uniform PC {
    PC_OFFSETS
    uint total; // n * heads * per
    uint per;   // threads per head: rot / 2, plus hd - rot when not in place
    uint heads;
    uint hd;
    uint rot;
    uint style; // 0: half, 1: interleaved
    float af;
} pc;

void main() {
    uint t = group_index() * WG + gl_LocalInvocationID.x;
    if (t >= pc.total) return;
    uint rh = t / pc.per, j = t - rh * pc.per;
    uint r = rh / pc.heads, base = rh * pc.hd, half_ = pc.rot / 2u;
    if (j < half_) {
        vec2 cs_sn = rope_cos_sin(int(POS[pc.ob + r]), uintBitsToFloat(INV[pc.oc + j]), pc.af);
        float cs = cs_sn.x, sn = cs_sn.y;
        uint ia = pc.style == 0u ? j : 2u * j, ib = pc.style == 0u ? j + half_ : 2u * j + 1u;
        float x0 = uintBitsToFloat(A[pc.oa + base + ia]);
        float x1 = uintBitsToFloat(A[pc.oa + base + ib]);
        D[pc.od + base + ia] = floatBitsToUint(x0 * cs - x1 * sn);
        D[pc.od + base + ib] = floatBitsToUint(x1 * cs + x0 * sn);
    } else {
        uint i = pc.rot + (j - half_);
        D[pc.od + base + i] = A[pc.oa + base + i];
    }
}
