#version 450
#extension GL_GOOGLE_include_directive : require
// Decodes blocks of the store into f32 rows (prefill's attention and read_rows): a
// workgroup a block, a thread a value. Computes what tq_decode_item in tq_kernels.h
// computes, with the same roundings (precise; the transforms' butterflies are the C's
// pairs), so the rows are the C's bit for bit.
layout(local_size_x = 128) in;
layout(binding = 0) readonly buffer Src { uint st[]; };    // the store
layout(binding = 1) writeonly buffer Dst { float dst[]; }; // f32 rows [n, kvh, hd]
layout(push_constant) uniform PC {
    uint off[8];
    uint items; // rows x virtual heads
    uint kvh, hd, m, bits;
    uint qjl;   // the store has QJL signs
    uint keys;  // 1 keys, 0 values
    uint first; // first store row
    uint cap;   // store rows
    uint use_qjl; // whether the QJL term counts
} pc;

#include "common.glsl"

shared float sy[128], sz[128]; // R^T C[code] and P^T z, transformed together

void main() {
    uint item = gl_WorkGroupID.x + gl_NumWorkGroups.x * gl_WorkGroupID.y;
    if (item >= pc.items) return;
    uint t = gl_LocalInvocationID.x, m = pc.m;
    uint nb = pc.hd / m, vh_all = pc.kvh * nb, r = item / vh_all, vh = item % vh_all;
    uint h = vh / nb, blk = vh % nb, row = pc.first + r, cap = pc.cap;
    uint cw = pc.bits * m / 32u, sw = pc.qjl != 0u ? m / 32u : 0u;
    bool in_ = t < m, qjl = pc.qjl != 0u && pc.use_qjl != 0u;
    uint codes_at, norms, signs = 0u;
    if (pc.keys != 0u) {
        uint base = pc.off[0] + vh * cap * (cw + sw + 1u);
        codes_at = base + row * cw;
        if (qjl && in_) signs = st[base + cap * cw + row * sw + (t >> 5)];
        norms = st[base + cap * (cw + sw) + row];
    } else {
        uint base = pc.off[0] + vh * (cap * cw + cap / 2u);
        codes_at = base + row * cw;
        norms = (st[base + cap * cw + row / 2u] >> ((row & 1u) * 16u)) & 0xffffu;
    }
    if (in_) {
        uint bit = pc.bits * t, w = bit >> 5;
        uint lo = st[codes_at + w], hi = (bit & 31u) + pc.bits > 32u ? st[codes_at + w + 1u] : 0u;
        sy[t] = tq_cb(m, pc.bits, tq_code_at(lo, hi, pc.bits, t)) * tq_sign(m, 1u, t); // D2
        sz[t] = ((signs >> (t & 31u)) & 1u) != 0u ? tq_sign(m, 3u, t) : -tq_sign(m, 3u, t); // D4 z
    }
    barrier();
    for (uint hh = 1u; hh < m; hh <<= 1) {
        if (t < m / 2u) {
            uint j = (t / hh) * 2u * hh + t % hh;
            precise float a = sy[j], b = sy[j + hh], c = sz[j], d = sz[j + hh];
            precise float s0 = a + b, d0 = a - b, s1 = c + d, d1 = c - d;
            sy[j] = s0;
            sy[j + hh] = d0;
            if (qjl) {
                sz[j] = s1;
                sz[j + hh] = d1;
            }
        }
        barrier();
    }
    if (!in_) return;
    float rs = tq_rs(m);
    precise float out_ = sy[t] * rs;
    out_ *= tq_sign(m, 0u, t); // D1
    if (qjl) {
        precise float g = tq_float(norms >> 16) * tq_kappa(m);
        precise float z = sz[t] * rs;
        z *= tq_sign(m, 2u, t); // D3
        out_ += g * z;
    }
    out_ *= tq_float(norms & 0xffffu);
    dst[pc.off[1] + (r * pc.kvh + h) * pc.hd + blk * m + t] = out_;
}
