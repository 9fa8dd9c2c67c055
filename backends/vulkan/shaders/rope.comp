#version 450
#extension GL_GOOGLE_include_directive : require
// Rotary embedding of [n, heads, hd]: one thread per rotated pair, plus one per
// pass-through element when dst is not src0. SWITCH (LMH_OP_ROPE_SWITCH, ABI 1.10): each
// row takes INV and af, or INVL and afl where its ENDS value is past thr.
layout(constant_id = 0) const uint WG = 256;
layout(local_size_x_id = 0) in;
#include "common.glsl"

BUF(0, D)
RBUF(1, A)
RBUF(2, POS)
RBUF(3, INV)
#ifdef SWITCH
RBUF(4, INVL)
RBUF(5, ENDS)
#endif

layout(push_constant) uniform PC {
    PC_OFFSETS
    uint total; // n * heads * per
    uint per;   // threads per head: rot / 2, plus hd - rot when not in place
    uint heads;
    uint hd;
    uint rot;
    uint style; // 0: half, 1: interleaved
    float af;
#ifdef SWITCH
    float afl; // the long table's factor
    int thr;   // rows whose ENDS value is > thr take INVL and afl
    uint of;   // ENDS's element offset (binding 5)
#endif
} pc;

void main() {
    uint t = group_index() * WG + gl_LocalInvocationID.x;
    if (t >= pc.total) return;
    uint rh = t / pc.per, j = t - rh * pc.per;
    uint r = rh / pc.heads, base = rh * pc.hd, half_ = pc.rot / 2u;
    if (j < half_) {
#ifdef SWITCH
        bool lng = int(ENDS[pc.of + r]) > pc.thr;
        float inv = uintBitsToFloat(lng ? INVL[pc.oe + j] : INV[pc.oc + j]);
        vec2 cs_sn = rope_cos_sin(int(POS[pc.ob + r]), inv, lng ? pc.afl : pc.af);
#else
        vec2 cs_sn = rope_cos_sin(int(POS[pc.ob + r]), uintBitsToFloat(INV[pc.oc + j]), pc.af);
#endif
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
