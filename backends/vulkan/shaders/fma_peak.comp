#version 450
#extension GL_GOOGLE_include_directive : require
// The multiply-add rate probe (vk_compute_peak), f32 as the products' tiles compute: every
// thread runs NCH independent chains a = a * m + c of vec4s, pc.iters times 4 rounds (4 a
// loop step, so that the loop's own instructions take few issue slots). The chains converge
// (|m| < 1), and their sum is stored only where it equals a value they never reach, so none
// of the work can be left out and nothing else is written.
layout(constant_id = 0) const uint WG = 256;
layout(local_size_x_id = 0) in;
#include "common.glsl"

#define NCH 8 // vec4 chains a thread (vk_record_peak_probe counts NCH * 4 * 2 * 4 FLOP a step)

BUF(0, D)

layout(push_constant) uniform PC {
    PC_OFFSETS
    uint iters;
    float m, c;
} pc;

void main() {
    float s0 = float(gl_LocalInvocationID.x & 7u);
    vec4 a[NCH];
    [[unroll]] for (uint j = 0; j < NCH; j++) a[j] = vec4(s0, s0 + 1.0, float(j), -float(j));
    vec4 m = vec4(pc.m), c = vec4(pc.c);
    for (uint i = 0; i < pc.iters; i++)
        [[unroll]] for (uint r = 0; r < 4u; r++)
            [[unroll]] for (uint j = 0; j < NCH; j++) a[j] = fma(a[j], m, c);
    vec4 s = vec4(0.0);
    [[unroll]] for (uint j = 0; j < NCH; j++) s += a[j];
    if (s.x + s.y + s.z + s.w == -1.0) D[pc.od] = floatBitsToUint(s.x);
}
