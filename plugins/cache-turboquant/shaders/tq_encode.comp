#version 450
#extension GL_GOOGLE_include_directive : require
// Encodes blocks of keys or values into the store's planes: a workgroup a block of m = 64
// or 128 values, a thread a value. Computes what tq_encode_item in tq_kernels.h computes,
// bit for bit: every step of the codec is a single rounding as in the C (precise: nothing
// fused), the butterflies of the Walsh-Hadamard transform are the C's own pairs (each
// stage's sums do not depend on the order they are done in), the sums of squares (|x|^2,
// |C[code]|^2, the residual's) are summed by one thread in the C's order, and division
// and square root are rounded correctly (common.glsl). So the records are the C's on any
// device (Vulkan makes add, subtract and multiply IEEE), except that one which flushes
// subnormals can differ where a value falls below 2^-126.
layout(local_size_x = 128) in;
layout(binding = 0) readonly buffer Src { uint src[]; }; // f32 rows [n, kvh, hd] or f16 ring [hcap, kvh, hd]
layout(binding = 1) buffer Dst { uint st[]; };           // the store
layout(push_constant) uniform PC {
    uint off[8];
    uint items; // rows x virtual heads
    uint kvh, hd, m, bits;
    uint qjl;   // keys of tq3: plain norm, residual signs
    uint keys;  // 1 keys, 0 values
    uint ring;  // 1: source is the f16 ring
    uint p0;    // the ring's first position
    uint hcap;  // the ring's rows
    uint first; // first store row
    uint cap;   // store rows
} pc;

#include "common.glsl"

shared float su[128]; // the block, then its unit vector u
shared float sy[128]; // transforms in place
shared float sr[128]; // the residual (keys of tq3)
shared uint scode[128];
shared uint ssign[4];
shared float sn, sg2;

// The normalized transform's butterflies on sy (tq_fwht without the 1/sqrt(m), which the
// callers apply with the second sign); every thread must call it (barriers inside).
void fwht(uint t, uint m) {
    barrier();
    for (uint h = 1u; h < m; h <<= 1) {
        if (t < m / 2u) {
            uint j = (t / h) * 2u * h + t % h;
            precise float a = sy[j], b = sy[j + h];
            precise float s = a + b, d = a - b;
            sy[j] = s;
            sy[j + h] = d;
        }
        barrier();
    }
}

void main() {
    uint item = gl_WorkGroupID.x + gl_NumWorkGroups.x * gl_WorkGroupID.y;
    if (item >= pc.items) return;
    uint t = gl_LocalInvocationID.x, m = pc.m;
    uint nb = pc.hd / m, vh_all = pc.kvh * nb, r = item / vh_all, vh = item % vh_all;
    uint h = vh / nb, blk = vh % nb, row = pc.first + r, cap = pc.cap;
    uint cw = pc.bits * m / 32u, sw = pc.qjl != 0u ? m / 32u : 0u;
    bool in_ = t < m;
    float x = 0.0;
    if (in_) {
        if (pc.ring == 0u) {
            x = uintBitsToFloat(src[pc.off[0] + (r * pc.kvh + h) * pc.hd + blk * m + t]);
        } else {
            uint slot = (pc.p0 + r) % pc.hcap;
            uint i = pc.off[0] + (slot * pc.kvh + h) * pc.hd + blk * m + t;
            x = tq_float(TQ_LOAD16(src, i));
        }
        su[t] = x;
    }
    if (t < 4u) ssign[t] = 0u;
    barrier();
    if (t == 0u) { // |x|: the C's sequential sum
        precise float ss = 0.0;
        for (uint i = 0u; i < m; i++) ss += su[i] * su[i];
        sn = tq_sqrt(ss);
    }
    barrier();
    float n = sn;
    // where this block's fields go
    uint kbase = pc.off[1] + vh * cap * (cw + sw + 1u);
    uint vbase = pc.off[1] + vh * (cap * cw + cap / 2u);
    uint codes_at = pc.keys != 0u ? kbase + row * cw : vbase + row * cw;
    uint norms = 0u;
    if (n > 0.0) {
        // u = x / n, then y = R u = D2 Hn D1 u
        float u = 0.0;
        if (in_) {
            u = tq_div(x, n);
            su[t] = u;
            sy[t] = u * tq_sign(m, 0u, t);
        }
        fwht(t, m);
        float rs = tq_rs(m);
        uint c = 0u;
        float cy = 0.0;
        if (in_) {
            precise float y = sy[t] * rs;
            y *= tq_sign(m, 1u, t);
            // the code: boundaries (midpoints of the centroids, in float) at or below y
            uint levels = 1u << pc.bits;
            for (uint i = 0u; i + 1u < levels; i++) {
                precise float bnd = 0.5 * (tq_cb(m, pc.bits, i) + tq_cb(m, pc.bits, i + 1u));
                c += y >= bnd ? 1u : 0u;
            }
            cy = tq_cb(m, pc.bits, c);
            scode[t] = c;
            sy[t] = cy;
        }
        barrier();
        if (pc.qjl == 0u) {
            if (t == 0u) { // the corrected norm n / |C[code]|
                precise float rho = 0.0;
                for (uint i = 0u; i < m; i++) rho += sy[i] * sy[i];
                norms = tq_half(tq_div(n, tq_sqrt(rho)));
            }
        } else {
            // the unit vector's reconstruction R^T C[code] = D1 Hn D2 C[code]
            if (in_) sy[t] = cy * tq_sign(m, 1u, t);
            fwht(t, m);
            if (in_) {
                precise float yh = sy[t] * rs;
                yh *= tq_sign(m, 0u, t);
                precise float res = u - yh;
                sr[t] = res;
                sy[t] = res * tq_sign(m, 2u, t); // then P r = D4 Hn D3 r
            }
            barrier();
            if (t == 0u) {
                precise float g2 = 0.0;
                for (uint i = 0u; i < m; i++) g2 += sr[i] * sr[i];
                sg2 = g2;
            }
            fwht(t, m);
            if (in_) {
                precise float p = sy[t] * rs;
                p *= tq_sign(m, 3u, t);
                if (p >= 0.0) atomicOr(ssign[t >> 5], 1u << (t & 31u));
            }
            barrier();
            if (t == 0u) norms = tq_half(n) | tq_half(tq_sqrt(sg2)) << 16;
        }
        // the codes as an LSB-first bit stream: a thread a word, from the codes it holds
        if (t < cw) {
            uint word = 0u, b0 = 32u * t;
            for (uint i = b0 / pc.bits; i < m && i * pc.bits < b0 + 32u; i++) {
                int sh = int(i * pc.bits) - int(b0);
                word |= sh >= 0 ? scode[i] << uint(sh) : scode[i] >> uint(-sh);
            }
            st[codes_at + t] = word;
        }
    } else if (t < cw) {
        st[codes_at + t] = 0u; // a zero block: all zero, decodes to zero
    }
    if (pc.keys != 0u) {
        if (t < sw) st[kbase + cap * cw + row * sw + t] = ssign[t];
        if (t == 0u) st[kbase + cap * (cw + sw) + row] = norms;
    } else if (t == 0u) {
        // one half of a word the next or previous row's workgroup may be writing at the
        // same time: each clears and sets only its own half
        uint at = vbase + cap * cw + row / 2u, sh = (row & 1u) * 16u;
        atomicAnd(st[at], ~(0xffffu << sh));
        atomicOr(st[at], (norms & 0xffffu) << sh);
    }
}
