#version 450
#extension GL_EXT_control_flow_attributes : require
// The chunks' softmax partials of attend.comp merged into each query head's output: a
// workgroup a head. Computes what attend_merge_cpu in cache_quant.c computes. (Merging in
// attend.comp's last workgroup of a K/V head instead, after an atomic count, made decode
// slower on an H100: 2.89 against 2.71 ms/token at 512 rows, 3.84 against 3.54 at 8K.)
layout(local_size_x = 64) in;
layout(binding = 0) readonly buffer T { float part[]; }; // [heads, chunks, dv + 2]
layout(binding = 1) writeonly buffer O { float o[]; };   // [1, heads, dv]
layout(binding = 2) readonly buffer S { float sink[]; }; // [heads] where pc.sinks
layout(push_constant) uniform PC {
    uint off[8];
    uint items; // heads
    uint chunks, dv;
    uint sinks; // the sinks' logits join each head's denominator (ABI 1.10)
} pc;

const uint MAXCH = 1024u; // cache_quant.c's ATT_MAXCH
shared float sw[MAXCH], sl[MAXCH];
shared float smax;

void main() {
    uint h = gl_WorkGroupID.x + gl_NumWorkGroups.x * gl_WorkGroupID.y;
    if (h >= pc.items) return;
    uint t = gl_LocalInvocationID.x, n = pc.chunks, st = pc.dv + 2u;
    uint base = pc.off[0] + h * n * st;
    for (uint c = t; c < n; c += 64u) { // each chunk's max and sum, all loads at once
        sw[c] = part[base + c * st + pc.dv];
        sl[c] = part[base + c * st + pc.dv + 1u];
    }
    barrier();
    if (t == 0u) {
        float m = -1.0 / 0.0;
        for (uint c = 0u; c < n; c++)
            if (sl[c] > 0.0) m = max(m, sw[c]);
        smax = m;
    }
    barrier();
    for (uint c = t; c < n; c += 64u) sw[c] = sl[c] > 0.0 ? exp(sw[c] - smax) : 0.0;
    barrier();
    float l = 0.0;
    for (uint c = 0u; c < n; c++) l += sl[c] * sw[c];
    if (pc.sinks != 0u) l += exp(sink[pc.off[2] + h] - smax);
    for (uint i = t; i < pc.dv; i += 64u) {
        float acc = 0.0;
        for (uint c0 = 0u; c0 < n; c0 += 8u) // eight chunks' loads in flight
            [[unroll]] for (uint u = 0u; u < 8u; u++) {
                uint c = c0 + u;
                if (c < n && sw[c] > 0.0) acc += part[base + c * st + i] * sw[c];
            }
        o[pc.off[1] + h * pc.dv + i] = acc / l;
    }
}
