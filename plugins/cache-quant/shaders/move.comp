#version 450
// Copies a run of 32-bit words for every head from one store to another (a store grown
// or a ring remade). Must give what move_cpu in cache_quant.c gives.
layout(local_size_x = 64) in;
layout(binding = 0) readonly buffer Src { uint src[]; };
layout(binding = 1) writeonly buffer Dst { uint dst[]; };
layout(push_constant) uniform PC {
    uint off[8];
    uint items; // words
    uint run;   // words a head
    uint from, to;         // the first head's run in the source and destination
    uint sstride, dstride; // words a head in each store
} pc;

void main() {
    uint i = gl_WorkGroupID.x * 64u + gl_LocalInvocationID.x +
             gl_NumWorkGroups.x * 64u * gl_WorkGroupID.y;
    if (i >= pc.items) return;
    uint h = i / pc.run, k = i % pc.run;
    dst[pc.off[1] + pc.to + h * pc.dstride + k] = src[pc.off[0] + pc.from + h * pc.sstride + k];
}
