#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
// The matrix cores' rate probe (vk_compute_peak where matmul_coop.comp runs): every
// subgroup multiplies two 16 x 16 f16 matrices into NACC independent f32 accumulators,
// pc.iters times, as matmul_coop's inner step does. The accumulators' sum (each grows by
// 16 m a step) is stored only where it equals a value it never takes, so none of the work
// can be left out and nothing else is written.
layout(constant_id = 0) const uint WG = 256;
layout(local_size_x_id = 0) in;
#include "common.glsl"

#define NACC 8 // accumulators (vk_record_peak_probe counts NACC * 2 * 16^3 FLOP a step)

BUF(0, D)

layout(push_constant) uniform PC {
    PC_OFFSETS
    uint iters;
    float m, c;
} pc;

void main() {
    fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> a = fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>(float16_t(pc.m));
    fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> b = fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>(float16_t(pc.c));
    fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> acc[NACC];
    [[unroll]] for (uint j = 0; j < NACC; j++) acc[j] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(float(j));
    for (uint i = 0; i < pc.iters; i++)
        [[unroll]] for (uint j = 0; j < NACC; j++) acc[j] = coopMatMulAddNV(a, b, acc[j]);
    [[unroll]] for (uint j = 1; j < NACC; j++) acc[0] = acc[0] + acc[j];
    float s = 0.0;
    for (uint i = 0; i < acc[0].length(); i++) s += acc[0][i];
    if (s == -1.0) D[pc.od] = floatBitsToUint(s);
}
