#version 450
#extension GL_GOOGLE_include_directive : require
// dst = src0 converted between f32, f16 and bf16 (round to nearest even). A 16-bit dst
// is written a 32-bit word per thread; a word the view shares with its neighbours keeps
// their half.
layout(constant_id = 0) const uint WG = 256;
layout(constant_id = 1) const uint SDT = 0;
layout(constant_id = 2) const uint DDT = 0;
layout(local_size_x_id = 0) in;
#include "common.glsl"

BUF(0, D)
RBUF(1, A)

layout(push_constant) uniform PC {
    PC_OFFSETS
    uint n;
} pc;

uint to16(uint i) { // element i of src0 as DDT's 16 bits
    if (SDT == DDT) return LOAD16(A, pc.oa + i);
    float v = LOADF(A, SDT, pc.oa + i);
    return DDT == DT_F16 ? f32_to_f16(v) : f32_to_bf16(v);
}

void main() {
    uint t = group_index() * WG + gl_LocalInvocationID.x;
    if (DDT == DT_F32) {
        if (t < pc.n) D[pc.od + t] = floatBitsToUint(LOADF(A, SDT, pc.oa + t));
        return;
    }
    if (pc.n == 0u) return;
    uint w = (pc.od >> 1) + t;
    if (w > ((pc.od + pc.n - 1u) >> 1)) return;
    uint e = 2u * w; // dst element (from the binding's start) in the low half
    bool keep_lo = e < pc.od, keep_hi = e + 1u >= pc.od + pc.n;
    uint old = keep_lo || keep_hi ? D[w] : 0u;
    uint lo = keep_lo ? old & 0xffffu : to16(e - pc.od);
    uint hi = keep_hi ? old >> 16 : to16(e + 1u - pc.od);
    D[w] = lo | (hi << 16);
}
