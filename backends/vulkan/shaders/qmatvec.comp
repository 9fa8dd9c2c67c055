#version 450
#extension GL_GOOGLE_include_directive : require
// dst [rows, out] = x [rows, in] W^T (+ bias) for a few rows, MAXR of them a workgroup (as
// matvec.comp), with W quantized (see quant.glsl), straight from the packed words. Like matvec.comp: each workgroup computes
// NR output columns, its threads split the inner dimension a 32-value chunk at a time,
// and the partial sums are reduced over the workgroup (subgroupAdd where available).
// Per chunk a thread loads the BITS words of each of its NR weight rows (16-byte loads
// for 4 and 8 bits where W allows, else 32-bit ones), and accumulates d = sum q * x and sx = sum x; the chunk then adds s * d + b * sx, so the
// scale and bias cost two multiplies per 32 values rather than one per value. Several rows
// of 4- or 8-bit codes go by pieces() instead (PIECES).
// With MOE: one work item (an expert and up to MAXR of its (row, slot) pairs) per
// gl_WorkGroupID.y, from the list moe_sort.comp made. With FUSED (and MAXR 1): the norm or
// SwiGLU before and the residual add after, see fused.glsl.
layout(constant_id = 0) const uint WG = 64;
layout(constant_id = 1) const uint NR = 4;   // output columns per workgroup
layout(constant_id = 2) const uint SDT = 0;  // dtype of scales and biases
layout(constant_id = 3) const uint VEC = 0;  // 16-byte loads of x are aligned
layout(constant_id = 4) const uint BITS = 4;
layout(constant_id = 5) const uint GROUP = 64;
layout(constant_id = 9) const uint WVEC = 0; // every chunk of W starts on 16 bytes
layout(constant_id = 10) const uint PIECES = 0; // several rows, 4- and 8-bit codes: pieces()
layout(local_size_x_id = 0) in;
// chunks a thread loads at once: 16 rows' worth of 4 words or less (8 of more, for
// registers), 4 at most
const uint UR = (BITS <= 4u ? 16u : 8u) / NR;
const uint U = UR < 1u ? 1u : UR > 4u ? 4u : UR;
#include "common.glsl"
#include "quant.glsl"

#ifndef MAXR
#define MAXR 4 // the qmatvec1 variant is built with 1: a decode step's registers for one row
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
    uint nrows;    // rows of x (not MOE)
    uint has_bias;
    uint tbias;
    uint k;        // MOE: slots per row
    uint per_slot; // MOE: x is [n, k, in] rather than [n, in]
    uint list_at;  // MOE: where in S the pair list and the items start
    uint items_at;
    uint wpr;      // words per weight row
    uint gpr;      // groups per weight row
    uint sc;       // word offsets of the scales and biases from the tensor's start
    uint bi;
#ifdef FUSED
    FUSED_PC
#endif
} pc;

#include "matvec_reduce.glsl"

// One chunk (32 values) of the NR weight rows, whose words are w, against each x row.
void chunk(uint c, uint w[NR][9], uint nrows, uint xrow[MAXR], uint wrow0, uint o0,
           inout float acc[NR][MAXR]) {
    float d[NR][MAXR], sx[MAXR];
    [[unroll]] for (uint j = 0; j < MAXR; j++) {
        sx[j] = 0.0;
        [[unroll]] for (uint r = 0; r < NR; r++) d[r][j] = 0.0;
    }
    // 4 values at a time: x as one vec4 per row, codes decoded to a vec4
    [[unroll]] for (uint q = 0; q < 8u; q++) {
        vec4 xv[MAXR];
        [[unroll]] for (uint j = 0; j < MAXR; j++) {
            xv[j] = vec4(0.0);
            if (j < nrows) {
                uint xo = pc.oa + xrow[j] * pc.in_ + c * 32u + q * 4u;
                xv[j] = VEC != 0u ? uintBitsToFloat(X4[xo / 4u])
                                  : vec4(uintBitsToFloat(X[xo]), uintBitsToFloat(X[xo + 1u]),
                                         uintBitsToFloat(X[xo + 2u]), uintBitsToFloat(X[xo + 3u]));
#ifdef FUSED
                xv[j] = pro4(xv[j], c * 32u + q * 4u);
#endif
            }
            sx[j] += xv[j].x + xv[j].y + xv[j].z + xv[j].w;
        }
        [[unroll]] for (uint r = 0; r < NR; r++) {
            vec4 qv = vec4(QVAL(QCODE(w[r], q * 4u)), QVAL(QCODE(w[r], q * 4u + 1u)),
                           QVAL(QCODE(w[r], q * 4u + 2u)), QVAL(QCODE(w[r], q * 4u + 3u)));
            [[unroll]] for (uint j = 0; j < MAXR; j++) d[r][j] += dot(qv, xv[j]);
        }
    }
    uint g = c * 32u / GROUP;
    [[unroll]] for (uint r = 0; r < NR; r++) {
        uint row = wrow0 + min(o0 + r, pc.out_ - 1u);
        float s = QSB(W, pc.ob + pc.sc, row * pc.gpr + g);
        float b = QBI(W, pc.ob + pc.bi, row * pc.gpr + g);
        [[unroll]] for (uint j = 0; j < MAXR; j++) acc[r][j] += s * d[r][j] + b * sx[j];
    }
}

#if MAXR > 1 && !defined(MOE)
// Several rows of x, 4- and 8-bit codes (PIECES): a thread takes 8 consecutive values at a
// time and the workgroup's threads consecutive ones, so that every load of x's rows and of
// the weights is one contiguous run across a subgroup. A thread's 32-value chunks 128 bytes
// apart, as in chunk(), made each of its loads of an x row touch a line of its own: with 4
// or 8 rows those loads, not the weights, were the product's time (H200, 7B 4-bit shape, a
// step of 8 rows 18.9 -> 11.5 ms, of 4 rows 11.4 -> 7.4; one row keeps chunk(), where the
// same mapping was no faster).
void pieces(uint o0, uint nrows, uint xrow[MAXR], inout float acc[NR][MAXR]) {
    uint l = gl_LocalInvocationID.x;
    uint npc = pc.in_ / 8u; // pieces of 8 values a row
    for (uint p = l; p < npc; p += WG) {
        vec4 x0[MAXR], x1[MAXR];
        [[unroll]] for (uint j = 0; j < MAXR; j++) {
            x0[j] = vec4(0.0);
            x1[j] = vec4(0.0);
            if (j < nrows) {
                uint xo = pc.oa + xrow[j] * pc.in_ + p * 8u;
                if (VEC != 0u) {
                    x0[j] = uintBitsToFloat(X4[xo / 4u]);
                    x1[j] = uintBitsToFloat(X4[xo / 4u + 1u]);
                } else {
                    x0[j] = vec4(uintBitsToFloat(X[xo]), uintBitsToFloat(X[xo + 1u]),
                                 uintBitsToFloat(X[xo + 2u]), uintBitsToFloat(X[xo + 3u]));
                    x1[j] = vec4(uintBitsToFloat(X[xo + 4u]), uintBitsToFloat(X[xo + 5u]),
                                 uintBitsToFloat(X[xo + 6u]), uintBitsToFloat(X[xo + 7u]));
                }
            }
        }
        uint g = p * 8u / GROUP;
        [[unroll]] for (uint r = 0; r < NR; r++) {
            uint row = min(o0 + r, pc.out_ - 1u);
            uint at = pc.ob + row * pc.wpr + p * (BITS / 4u);
            uint w[2];
            w[0] = W[at];
            w[1] = BITS == 8u ? W[at + 1u] : 0u;
            float sc = QSB(W, pc.ob + pc.sc, row * pc.gpr + g);
            float bi = QBI(W, pc.ob + pc.bi, row * pc.gpr + g);
            vec4 w0 = vec4(QVAL(QCODE(w, 0u)), QVAL(QCODE(w, 1u)), QVAL(QCODE(w, 2u)),
                           QVAL(QCODE(w, 3u))) * sc + bi;
            vec4 w1 = vec4(QVAL(QCODE(w, 4u)), QVAL(QCODE(w, 5u)), QVAL(QCODE(w, 6u)),
                           QVAL(QCODE(w, 7u))) * sc + bi;
            [[unroll]] for (uint j = 0; j < MAXR; j++)
                acc[r][j] += dot(w0, x0[j]) + dot(w1, x1[j]);
        }
    }
}
#endif

void main() {
    uint l = gl_LocalInvocationID.x;
    uint nrows, wrow0 = 0u; // wrow0: the stacked row of output column 0 (MOE: the expert's)
    uint xrow[MAXR], drow[MAXR];
#ifdef MOE
    uint it = pc.items_at + gl_WorkGroupID.y * 3u;
    uint e = S[it], first = S[it + 1u];
    nrows = S[it + 2u];
    wrow0 = e * pc.out_;
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

#if MAXR > 1 && !defined(MOE)
    if (PIECES != 0u && (BITS == 4u || BITS == 8u)) {
        pieces(o0, nrows, xrow, acc);
        reduce_store(acc, o0, nrows, drow);
        return;
    }
#endif
    // A thread's chunks U at a time, every weight load of the U issued before the first
    // chunk is used: a 4096-wide row is 128 chunks, two for each of 64 threads, so loading
    // and using them one by one waited for memory twice a product (0.7 TB/s on an H100).
    // Chunks past the row load the last one again (in bounds, never used).
    uint nch = pc.in_ / 32u;
    for (uint c0 = l; c0 < nch; c0 += U * WG) {
        uint w[4][NR][9];
        [[unroll]] for (uint u = 0; u < U; u++) {
            uint c = min(c0 + u * WG, nch - 1u);
            [[unroll]] for (uint r = 0; r < NR; r++) {
                uint at = pc.ob + (wrow0 + min(o0 + r, pc.out_ - 1u)) * pc.wpr + c * BITS;
                if (WVEC != 0u && (BITS == 4u || BITS == 8u)) {
                    [[unroll]] for (uint h = 0; h < BITS / 4u; h++) {
                        uvec4 v = W4[at / 4u + h];
                        w[u][r][4u * h] = v.x;
                        w[u][r][4u * h + 1u] = v.y;
                        w[u][r][4u * h + 2u] = v.z;
                        w[u][r][4u * h + 3u] = v.w;
                    }
                    w[u][r][8] = 0u;
                } else {
                    [[unroll]] for (uint i = 0; i < 9u; i++) w[u][r][i] = i < BITS ? W[at + i] : 0u;
                }
            }
        }
        [[unroll]] for (uint u = 0; u < U; u++)
            if (c0 + u * WG < nch) chunk(c0 + u * WG, w[u], nrows, xrow, wrow0, o0, acc);
    }

    reduce_store(acc, o0, nrows, drow);
}
