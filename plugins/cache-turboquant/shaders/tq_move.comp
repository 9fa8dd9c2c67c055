#version 450
// Copies a run of 32-bit words of one plane for every head from one store to another (a
// store grown): a workgroup TQ_WG (64) words, a thread a word of each head. Computes what
// tq_move_cpu in tq_kernels.h computes.
layout(local_size_x = 64) in;
layout(binding = 0) readonly buffer Src { uint src[]; };
layout(binding = 1) writeonly buffer Dst { uint dst[]; };
layout(push_constant) uniform PC {
    uint off[8];
    uint items;            // words a head
    uint from, to;         // the run's first word in the first head, source and destination
    uint sstride, dstride; // words a head in each store
    uint heads;
} pc;

void main() {
    uint wg = gl_WorkGroupID.x + gl_NumWorkGroups.x * gl_WorkGroupID.y;
    uint k = wg * 64u + gl_LocalInvocationID.x;
    if (k >= pc.items) return; // (run() keeps items + 64 within 32 bits)
    for (uint h = 0u; h < pc.heads; h++)
        dst[pc.off[1] + pc.to + h * pc.dstride + k] = src[pc.off[0] + pc.from + h * pc.sstride + k];
}
