#version 450
#extension GL_GOOGLE_include_directive : require
// add, mul (src1 of dst's shape, of the innermost size, or one element; any float dtype),
// scale, swiglu, geglu (src1 or the fused [gate | up] rows), softcap, sigmoid_gate (src1
// one f32 per row, or of dst's shape with d = 1), unary (LMH_UNARY_* fn), swiglu_oai (the
// clamped SwiGLU of interleaved (gate, up) pairs: alpha f0, limit in fn's bits). One thread
// per element of dst.
layout(constant_id = 0) const uint WG = 256;
layout(constant_id = 1) const uint OP = 0; // see VK_ELT_* in vk_ops.c
layout(local_size_x_id = 0) in;
#include "common.glsl"
#include "unary.glsl"

BUF(0, D)
RBUF(1, A)
RBUF(2, B)

layout(push_constant) uniform PC {
    PC_OFFSETS
    uint n;     // elements of dst
    uint bn;    // elements of src1 (broadcast by index modulo bn)
    uint tb;    // src1 dtype
    uint d;     // fused gates, sigmoid_gate: dst's innermost size
    uint fused; // gates: src1 is NULL
    float f0;   // scale factor, soft-cap
    uint fn;    // unary: LMH_UNARY_*
} pc;

float silu(float v) { return v / (1.0 + exp(-v)); }
float gelu_tanh(float v) {
    return 0.5 * v * (1.0 + tanh_safe(0.7978845608028654 * (v + 0.044715 * v * v * v)));
}

void main() {
    uint i = group_index() * WG + gl_LocalInvocationID.x;
    if (i >= pc.n) return;
    float r;
    if (OP == 0u || OP == 1u) {
        float a = uintBitsToFloat(A[pc.oa + i]);
        uint j = pc.bn == pc.n ? i : i % pc.bn;
        float b = LOADF(B, pc.tb, pc.ob + j);
        r = OP == 0u ? a + b : a * b;
    } else if (OP == 2u) {
        r = uintBitsToFloat(A[pc.oa + i]) * pc.f0;
    } else if (OP == 3u || OP == 4u) {
        float g, u;
        if (pc.fused != 0u) {
            uint row = i / pc.d, c = i - row * pc.d;
            g = uintBitsToFloat(A[pc.oa + row * 2u * pc.d + c]);
            u = uintBitsToFloat(A[pc.oa + row * 2u * pc.d + pc.d + c]);
        } else {
            g = uintBitsToFloat(A[pc.oa + i]);
            u = uintBitsToFloat(B[pc.ob + i]);
        }
        r = (OP == 3u ? silu(g) : gelu_tanh(g)) * u;
    } else if (OP == 5u) {
        r = pc.f0 * tanh_safe(uintBitsToFloat(A[pc.oa + i]) / pc.f0);
    } else if (OP == 7u) {
        r = unary_f(pc.fn, uintBitsToFloat(A[pc.oa + i]));
    } else if (OP == 8u) {
        float lim = uintBitsToFloat(pc.fn);
        float g = min(uintBitsToFloat(A[pc.oa + 2u * i]), lim);
        float u = clamp(uintBitsToFloat(A[pc.oa + 2u * i + 1u]), -lim, lim);
        r = (u + 1.0) * (g / (1.0 + exp(-pc.f0 * g)));
    } else {
        float g = uintBitsToFloat(B[pc.ob + i / pc.d]);
        r = uintBitsToFloat(A[pc.oa + i]) * (1.0 / (1.0 + exp(-g)));
    }
    D[pc.od + i] = floatBitsToUint(r);
}
