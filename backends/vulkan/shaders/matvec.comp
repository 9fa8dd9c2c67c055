#version 450
#extension GL_GOOGLE_include_directive : require
// dst [rows, out] = x [rows, in] W^T (+ bias) for a few rows, MAXR of them a workgroup (row
// groups: matvec_reduce.glsl's ROW_GROUP): the weight is read once; each workgroup computes
// NR output columns, its threads split the inner dimension and the partial sums are
// reduced over the workgroup.
// With MOE: one work item (an expert and up to MAXR of its (row, slot) pairs) per
// gl_WorkGroupID.y, from the list moe_sort.comp made. With FUSED (and MAXR 1): the norm or
// SwiGLU before and the residual add after, see fused.glsl.
layout(constant_id = 0) const uint WG = 64;
layout(constant_id = 1) const uint NR = 2;   // output columns per workgroup
layout(constant_id = 2) const uint WDT = 0;  // weight dtype
layout(constant_id = 3) const uint VEC = 0;  // 16-byte loads of W and x are aligned
layout(local_size_x_id = 0) in;
#include "common.glsl"

#ifndef MAXR
#define MAXR 4 // the matvec1 variant is built with 1: a decode step's registers for one row
#endif

BUF(0, D)
RBUF(1, X)
RBUF4(1, X)
RBUF(2, W)
RBUF4(2, W)
RBUF(3, BIAS)
#ifdef MOE
RBUF(5, S) // moe_sort's output: see there
#endif

layout(push_constant) uniform PC {
    PC_OFFSETS
    uint in_;
    uint out_;
    uint nrows;   // rows of x (not MOE)
    uint has_bias;
    uint tbias;
    uint k;       // MOE: slots per row
    uint per_slot; // MOE: x is [n, k, in] rather than [n, in]
    uint list_at; // MOE: where in S the pair list and the items start
    uint items_at;
#ifdef FUSED
    uint pad_[4]; // where qmatvec.comp has its quantization words
    FUSED_PC
#endif
} pc;

#include "matvec_reduce.glsl"

// acc[r][j] += chunk c of weight row o0 + r (loaded into w[r]) . chunk c of x row j
void chunk(uint c, uint CH, uvec4 w[NR], uint nrows, uint xrow[MAXR], inout float acc[NR][MAXR]) {
    vec4 xa[MAXR], xb[MAXR];
    [[unroll]] for (uint j = 0; j < MAXR; j++) {
        if (j < nrows) {
            uint xq = (pc.oa + xrow[j] * pc.in_) / 4u + c * (CH / 4u);
            xa[j] = uintBitsToFloat(X4[xq]);
            xb[j] = CH == 8u ? uintBitsToFloat(X4[xq + 1u]) : vec4(0.0);
#ifdef FUSED
            xa[j] = pro4(xa[j], c * CH);
            if (CH == 8u) xb[j] = pro4(xb[j], c * CH + 4u);
#endif
        }
    }
    [[unroll]] for (uint r = 0; r < NR; r++) {
        vec4 wa, wb;
        unpack_word(w[r], WDT, wa, wb);
        [[unroll]] for (uint j = 0; j < MAXR; j++)
            if (j < nrows) acc[r][j] += dot(wa, xa[j]) + dot(wb, xb[j]);
    }
}

void main() {
    uint l = gl_LocalInvocationID.x;
    uint nrows, wbase = pc.ob;
    uint xrow[MAXR], drow[MAXR];
#ifdef MOE
    uint it = pc.items_at + gl_WorkGroupID.y * 3u;
    uint e = S[it], first = S[it + 1u];
    nrows = S[it + 2u];
    wbase += e * pc.out_ * pc.in_;
    uint o0 = gl_WorkGroupID.x * NR;
    [[unroll]] for (uint j = 0; j < MAXR; j++) {
        uint p = j < nrows ? S[pc.list_at + first + j] : 0u;
        xrow[j] = pc.per_slot != 0u ? p : p / pc.k;
        drow[j] = p;
    }
#else
    ROW_GROUP(o0, nrows, xrow, drow);
#endif
    tail_early(o0);
    float acc[NR][MAXR];
    [[unroll]] for (uint r = 0; r < NR; r++)
        [[unroll]] for (uint j = 0; j < MAXR; j++) acc[r][j] = 0.0;

    if (VEC != 0u) {
        // a chunk is 16 bytes of W: 8 elements of f16/bf16, 4 of f32
        const uint CH = WDT == DT_F32 ? 4u : 8u;
        uint nch = pc.in_ / CH, c = l;
        // Four chunks a thread per step, their weight loads all issued before the first is
        // used: a thread then waits for memory once per four chunks, not once per chunk
        // (decode is a few chunks a thread, so latency, not bandwidth, set its time).
        for (; c + 3u * WG < nch; c += 4u * WG) {
            uvec4 wv[4][NR];
            [[unroll]] for (uint u = 0; u < 4u; u++)
                [[unroll]] for (uint r = 0; r < NR; r++) {
                    uint o = o0 + r;
                    wv[u][r] = o < pc.out_ ? W4[(wbase + o * pc.in_) / CH + c + u * WG] : uvec4(0u);
                }
            [[unroll]] for (uint u = 0; u < 4u; u++) chunk(c + u * WG, CH, wv[u], nrows, xrow, acc);
        }
        for (; c < nch; c += WG) {
            uvec4 wv[NR];
            [[unroll]] for (uint r = 0; r < NR; r++) {
                uint o = o0 + r;
                wv[r] = o < pc.out_ ? W4[(wbase + o * pc.in_) / CH + c] : uvec4(0u);
            }
            chunk(c, CH, wv, nrows, xrow, acc);
        }
    } else {
        for (uint i = l; i < pc.in_; i += WG) {
            float xv[MAXR];
            [[unroll]] for (uint j = 0; j < MAXR; j++)
                xv[j] = j < nrows ? uintBitsToFloat(X[pc.oa + xrow[j] * pc.in_ + i]) : 0.0;
#ifdef FUSED
            xv[0] = pro1(xv[0], i);
#endif
            [[unroll]] for (uint r = 0; r < NR; r++) {
                uint o = o0 + r;
                if (o >= pc.out_) break;
                float w = LOADF(W, WDT, wbase + o * pc.in_ + i);
                [[unroll]] for (uint j = 0; j < MAXR; j++) acc[r][j] += w * xv[j];
            }
        }
    }

    reduce_store(acc, o0, nrows, drow);
}
