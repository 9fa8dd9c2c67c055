#version 450
#extension GL_GOOGLE_include_directive : require
// dst = x / sqrt(mean(x^2) + eps) * (w + off), one workgroup per row.
// Built with ADD (a residual add fused ahead of the norm): x = A + B, also written to S.
// Built with ROPE (a rotary embedding fused behind the norm, rows being heads): the
// normalized row is rotated (see rope.comp) before it is written; without has_norm the
// rope alone (x as it is); with has_copy the result is also converted to cdt and written
// to C (the cache append that reads it, vk_fuse.c).
// (Variants of their own, not specialization constants: the plain norm then declares no
// binding that the unused descriptors would alias.)
layout(constant_id = 0) const uint WG = 256;
layout(local_size_x_id = 0) in;
#define NEED_WG_SUM
#include "common.glsl"

BUF(0, D)
RBUF(1, A)
RBUF(2, W)
#ifdef ADD
RBUF(3, B)
BUF(4, S)
#endif
#ifdef ROPE
RBUF(3, POS)
RBUF(4, INV)
BUF(5, C)
#define MAXD 512
shared float ys[MAXD], yr[MAXD];
#endif

layout(push_constant) uniform PC {
    PC_OFFSETS
    uint d;
    uint rows;
    uint has_w;
    uint tw;
    float eps;
    float off;
    uint heads; // ROPE: rows per position
    uint rot;   // ROPE: rotated dims
    uint style; // ROPE: 0 half, 1 interleaved
    float af;   // ROPE: cos/sin factor
    uint oc5;      // ROPE: element offset of C
    uint has_norm; // ROPE: 0: the rope alone
    uint has_copy; // ROPE: also write the result to C
    uint cdt;      // ROPE: C's dtype (16-bit: d and oc5 even)
} pc;

void main() {
    uint row = group_index();
    if (row >= pc.rows) return; // uniform over the workgroup
    uint l = gl_LocalInvocationID.x, base = row * pc.d;
    float ss = 0.0;
    for (uint i = l; i < pc.d; i += WG) {
        float x = uintBitsToFloat(A[pc.oa + base + i]);
#ifdef ADD
        x += uintBitsToFloat(B[pc.oc + base + i]);
        S[pc.oe + base + i] = floatBitsToUint(x);
#endif
        ss += x * x;
    }
    ss = wg_sum(ss);
    float s = 1.0 / sqrt(ss / float(pc.d) + pc.eps);
#ifdef ROPE
    if (pc.has_norm == 0u) s = 1.0;
#endif
    for (uint i = l; i < pc.d; i += WG) {
#ifdef ADD
        // the sum this thread wrote (S may alias A, which is read-only here)
        float y = uintBitsToFloat(S[pc.oe + base + i]) * s;
#else
        float y = uintBitsToFloat(A[pc.oa + base + i]) * s;
#endif
        if (pc.has_w != 0u) y *= LOADF(W, pc.tw, pc.ob + i) + pc.off;
#ifdef ROPE
        ys[i] = y;
#else
        D[pc.od + base + i] = floatBitsToUint(y);
#endif
    }
#ifdef ROPE
    barrier();
    uint half_ = pc.rot / 2u;
    int p = int(POS[pc.oc + row / pc.heads]);
    for (uint i = l; i < pc.d; i += WG) {
        float y = ys[i];
        if (i < pc.rot) {
            uint j = pc.style == 0u ? (i < half_ ? i : i - half_) : i / 2u;
            uint ia = pc.style == 0u ? j : 2u * j, ib = pc.style == 0u ? j + half_ : 2u * j + 1u;
            vec2 cs = rope_cos_sin(p, uintBitsToFloat(INV[pc.oe + j]), pc.af);
            y = i == ia ? ys[ia] * cs.x - ys[ib] * cs.y : ys[ib] * cs.x + ys[ia] * cs.y;
        }
        D[pc.od + base + i] = floatBitsToUint(y);
        if (pc.has_copy != 0u) {
            if (pc.cdt == DT_F32)
                C[pc.oc5 + base + i] = floatBitsToUint(y);
            else
                yr[i] = y;
        }
    }
    if (pc.has_copy != 0u && pc.cdt != DT_F32) { // 16 bits: a word (two elements) a thread
        barrier();
        for (uint k = l; k < pc.d / 2u; k += WG) {
            float a = yr[2u * k], c = yr[2u * k + 1u];
            uint lo = pc.cdt == DT_F16 ? f32_to_f16(a) : f32_to_bf16(a);
            uint hi = pc.cdt == DT_F16 ? f32_to_f16(c) : f32_to_bf16(c);
            C[(pc.oc5 + base) / 2u + k] = lo | (hi << 16);
        }
    }
#endif
}
