#version 450
// Quantizes rows of keys or values: one workgroup a group of `group` (<= 128) values of one
// row and head, a thread a value or two; affine (value = code * scale + bias, bias the group's
// minimum), codes packed little end first into 32-bit words, then the row's scales and
// biases as f32 bits. Must give what quantize_group in cache_quant.c gives.
layout(local_size_x = 64) in;
layout(binding = 0) readonly buffer Src { float src[]; };
layout(binding = 1) buffer Dst { uint dst[]; };
layout(push_constant) uniform PC {
    uint off[8]; // where tensors 0 and 1 start in their bindings
    uint items;  // rows * heads * groups a row
    uint heads, hd, bits, group;
    uint words;  // a (row, head)'s words: codes, scales, biases
    uint first;  // the slot of the first row
    uint ring;   // slots in the ring, 0: rows in order
    float rnb;   // 1 / (2^bits - 1), the host's float
    uint cap;    // rows of the store ([heads, cap, words])
} pc;

// cache_quant.c's code_of: the code checked against exact products, unfused (precise)
uint code_of(float v, float mn, float scale, float inv, float nb) {
    precise float d = v - mn;
    float q = clamp(floor(d * inv + 0.5), 0.0, nb);
    precise float lo = (q - 0.5) * scale, hi = (q + 0.5) * scale;
    if (q > 0.0 && d < lo)
        q -= 1.0;
    else if (q < nb && d >= hi)
        q += 1.0;
    return uint(q);
}

shared float smn[64], smx[64];
shared uint scode[128];

void main() {
    uint item = gl_WorkGroupID.x + gl_NumWorkGroups.x * gl_WorkGroupID.y;
    if (item >= pc.items) return;
    uint t = gl_LocalInvocationID.x;
    uint ng = pc.hd / pc.group, grp = item % ng, rh = item / ng;
    uint h = rh % pc.heads, r = rh / pc.heads;
    uint x = pc.off[0] + rh * pc.hd + grp * pc.group;
    uint slot = pc.ring != 0u ? (pc.first + r) % pc.ring : pc.first + r;
    uint row = pc.off[1] + (h * pc.cap + slot) * pc.words;
    // values t and t + 64 (a group of more than 64), the group's first where past its end
    float v = t < pc.group ? src[x + t] : src[x];
    float v2 = t + 64u < pc.group ? src[x + t + 64u] : v;
    smn[t] = min(v, v2);
    smx[t] = max(v, v2);
    barrier();
    for (uint s = 32u; s > 0u; s >>= 1) { // min and max are exact in any order
        if (t < s) {
            smn[t] = min(smn[t], smn[t + s]);
            smx[t] = max(smx[t], smx[t + s]);
        }
        barrier();
    }
    float mn = smn[0], mx = smx[0];
    float nb = float((1u << pc.bits) - 1u);
    precise float scale = (mx - mn) * pc.rnb;
    if (!(scale > 0.0)) scale = 1.0;
    float inv = 1.0 / scale;
    uint per = 32u / pc.bits;
    scode[t] = t < pc.group ? code_of(v, mn, scale, inv, nb) : 0u;
    scode[t + 64u] = t + 64u < pc.group ? code_of(v2, mn, scale, inv, nb) : 0u;
    barrier();
    if (t < pc.group / per) { // one thread a word packs its codes
        uint word = 0u;
        for (uint j = 0u; j < per; j++) word |= scode[t * per + j] << (j * pc.bits);
        dst[row + grp * pc.group / per + t] = word;
    }
    if (t == 0u) {
        uint codes = pc.hd * pc.bits / 32u;
        dst[row + codes + grp] = floatBitsToUint(scale);
        dst[row + codes + ng + grp] = floatBitsToUint(mn);
    }
}
