#version 450
// Rows of the quantized store back to f32, for the backend's attention and for read_rows: one
// invocation a value. Must give what dequantize_cpu in cache_quant.c gives.
layout(local_size_x = 64) in;
layout(binding = 0) readonly buffer Src { uint src[]; };
layout(binding = 1) writeonly buffer Dst { float dst[]; };
layout(push_constant) uniform PC {
    uint off[8];
    uint items; // rows * heads * hd
    uint heads, hd, bits, group;
    uint words;
    uint cap;   // rows of the store ([heads, cap, words])
    uint first; // the slot of output row 0
    uint ring;  // slots of a ring (output row r is slot (first + r) % ring), 0: in order
} pc;

void main() {
    uint e = gl_WorkGroupID.x * 64u + gl_LocalInvocationID.x +
             gl_NumWorkGroups.x * 64u * gl_WorkGroupID.y;
    if (e >= pc.items) return;
    uint d = e % pc.hd, rh = e / pc.hd, r = rh / pc.heads;
    uint slot = pc.ring != 0u ? (pc.first + r) % pc.ring : pc.first + r;
    uint row = pc.off[0] + ((rh % pc.heads) * pc.cap + slot) * pc.words;
    uint per = 32u / pc.bits, codes = pc.hd * pc.bits / 32u, ng = pc.hd / pc.group;
    uint q = (src[row + d / per] >> ((d % per) * pc.bits)) & ((1u << pc.bits) - 1u);
    uint g = d / pc.group;
    float scale = uintBitsToFloat(src[row + codes + g]), bias = uintBitsToFloat(src[row + codes + ng + g]);
    precise float v = float(q) * scale + bias; // unfused, as the C function computes it
    dst[pc.off[1] + e] = v;
}
