#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_buffer_reference_uvec2 : require
// Several copies in one dispatch (batched decode's cache appends: each sequence's new key
// and value rows into its own cache): copy gl_WorkGroupID.y of a table (binding 1, 8 words
// each: the source's and the destination's device addresses, two words each, low first,
// then the element count), converted between f32, f16 and bf16 as copy.comp does. A 16-bit
// side starts on a 32-bit word and has an even count (vk_ops.c checks), so every thread
// writes whole words of its own.
layout(constant_id = 0) const uint WG = 256;
layout(constant_id = 1) const uint SDT = 0;
layout(constant_id = 2) const uint DDT = 0;
layout(local_size_x_id = 0) in;
#include "common.glsl"

layout(buffer_reference, std430, buffer_reference_align = 4) buffer Words { uint v[]; };
RBUF(1, TAB)

layout(push_constant) uniform PC {
    PC_OFFSETS
} pc;

float load(Words s, uint i) {
    if (SDT == DT_F32) return uintBitsToFloat(s.v[i]);
    return cvt16((s.v[i >> 1] >> ((i & 1u) << 4)) & 0xffffu, SDT);
}

uint to16(float v) { return DDT == DT_F16 ? f32_to_f16(v) : f32_to_bf16(v); }

void main() {
    uint e0 = pc.oa + gl_WorkGroupID.y * 8u;
    Words src = Words(uvec2(TAB[e0], TAB[e0 + 1u]));
    Words dst = Words(uvec2(TAB[e0 + 2u], TAB[e0 + 3u]));
    uint n = TAB[e0 + 4u];
    uint words = DDT == DT_F32 ? n : n / 2u;
    for (uint w = gl_WorkGroupID.x * WG + gl_LocalInvocationID.x; w < words;
         w += gl_NumWorkGroups.x * WG) {
        if (SDT == DDT)
            dst.v[w] = src.v[w]; // the same bits, one word at a time
        else if (DDT == DT_F32)
            dst.v[w] = floatBitsToUint(load(src, w));
        else
            dst.v[w] = to16(load(src, 2u * w)) | (to16(load(src, 2u * w + 1u)) << 16);
    }
}
