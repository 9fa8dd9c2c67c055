#version 450
#extension GL_GOOGLE_include_directive : require
// dst [rows, out] = x [rows, in] W^T (+ bias) for many rows, in larger tiles than
// matmul.comp: 128 outputs x 16 * TM rows a workgroup, TM rows x 8 outputs a thread (with TM
// 8, 64 sums against 16 operands read from shared memory: four times matmul.comp's
// arithmetic a shared read; TM 4 where the product has few tiles), and the next 16 columns
// of x and W loaded into registers (16-byte loads where VEC says the rows allow) while the
// current ones are multiplied. A thread's outputs are two runs of 4, half the tile apart, so
// that the 16 threads reading W's tile read 256 contiguous bytes (8 outputs in a run took two
// shared-memory passes more a column; prefill 4-7% slower on an H100). Each sum runs over k
// in order, one multiply-add a step, as in matmul.comp (the same greedy tokens on an H100).
// For prefill and batched decode (the host's choice: vk_ops.c). Where a product has too few
// tiles to fill the device (a batch of decode steps: one tile row), the k range is split
// over gl_WorkGroupID.z (kchunk columns each) and each split writes its sums to P, split by
// split; split_sum.comp then adds them in split order (and the bias).
// With QUANT, W is MLX-quantized (quant.glsl): each thread dequantizes 8 codes of a row a
// step (two 4-code windows of one or two 32-bit loads, one scale and bias: a step's 16 values
// of a row share a group), as qmatmul.comp does 4, with the same arithmetic.
layout(constant_id = 0) const uint WG = 256; // must be 256: 16 x 16 threads
layout(constant_id = 3) const uint VEC = 0; // x (and W) rows start on 16 bytes, in % 8 == 0
#ifdef QUANT
layout(constant_id = 2) const uint SDT = 0;
layout(constant_id = 4) const uint BITS = 4;
layout(constant_id = 5) const uint GROUP = 64;
layout(constant_id = 6) const uint TM = 8; // rows a thread: 8, or 4 (tiles of 64 rows)
#else
layout(constant_id = 2) const uint WDT = 0;
layout(constant_id = 4) const uint TM = 8; // rows a thread: 8, or 4 (tiles of 64 rows)
#endif
layout(local_size_x_id = 0) in;
#include "common.glsl"
#ifdef QUANT
#include "quant.glsl"
#endif

const uint BM = 16u * TM; // rows a tile
#define BN 128
#define BK 16
#define PAD 4 // keeps a row of the tiles on 16 bytes for the vector reads

BUF(0, D)
RBUF(1, X)
RBUF4(1, X)
RBUF(2, W)
RBUF4(2, W)
RBUF(3, BIAS)
BUF(4, P) // the splits' sums [z][rows][out]

layout(push_constant) uniform PC {
    PC_OFFSETS
    uint in_;
    uint out_;
    uint rows;
    uint has_bias;
    uint tbias;
#ifdef QUANT
    uint pad_[4]; // where matmul.comp has its MoE words
    uint wpr;     // words per weight row
    uint gpr;     // groups per weight row
    uint sc;      // word offsets of the scales and biases from the tensor's start
    uint bi;
#else
    uint pad_[8];
#endif
    uint kchunk;  // columns a split (a multiple of BK), with gl_NumWorkGroups.z splits
} pc;

// the tiles, k-major: xs[k][row], ws[k][output]
shared vec4 xs4[BK * (BM + PAD) / 4u];
shared vec4 ws4[BK * (BN + PAD) / 4];

// TM values of x row r (absolute) from column k on (zero past the ends): the threads load
// x's tile 16 / TM to a row.
void load_x(uint r, uint k, out float xv[8]) {
    bool rok = r < pc.rows;
    if (VEC != 0u && k + TM <= pc.in_) {
        uint q = (pc.oa + r * pc.in_ + k) / 4u;
        [[unroll]] for (uint h = 0; h < TM / 4u; h++) {
            vec4 a = rok ? uintBitsToFloat(X4[q + h]) : vec4(0.0);
            [[unroll]] for (uint e = 0; e < 4u; e++) xv[h * 4u + e] = a[e];
        }
    } else {
        [[unroll]] for (uint e = 0; e < TM; e++)
            xv[e] = rok && k + e < pc.in_ ? uintBitsToFloat(X[pc.oa + r * pc.in_ + k + e]) : 0.0;
    }
}

// Eight values of W row n from column k on: two threads to a row of W's tile.
#ifdef QUANT
// (k < in, a multiple of 8; in is a multiple of 32, so the 8 values are in one group)
void load_w(uint n, uint k, out float wv[8]) {
    bool nok = n < pc.out_;
    uint wrow = nok ? n : 0u, wat = pc.ob + wrow * pc.wpr, g = wrow * pc.gpr + k / GROUP;
    float s = QSB(W, pc.ob + pc.sc, g), b = QBI(W, pc.ob + pc.bi, g);
    [[unroll]] for (uint h = 0; h < 2u; h++) {
        uint bit = (k + h * 4u) * BITS, sh = bit & 31u;
        uint word = W[wat + (bit >> 5)] >> sh;
        if (sh + 4u * BITS > 32u) word |= W[wat + (bit >> 5) + 1u] << (32u - sh);
        [[unroll]] for (uint i = 0; i < 4u; i++)
            wv[h * 4u + i] = nok ? s * QVAL((word >> (i * BITS)) & QMASK) + b : 0.0;
    }
}
#else
void load_w(uint n, uint k, out float wv[8]) {
    bool nok = n < pc.out_;
    if (VEC != 0u && k + 8u <= pc.in_) {
        vec4 c = vec4(0.0), d = vec4(0.0);
        if (nok) {
            if (WDT == DT_F32) {
                uint q = (pc.ob + n * pc.in_ + k) / 4u;
                c = uintBitsToFloat(W4[q]);
                d = uintBitsToFloat(W4[q + 1u]);
            } else {
                unpack_word(W4[(pc.ob + n * pc.in_ + k) / 8u], WDT, c, d);
            }
        }
        [[unroll]] for (uint e = 0; e < 4u; e++) {
            wv[e] = c[e];
            wv[e + 4u] = d[e];
        }
    } else {
        [[unroll]] for (uint e = 0; e < 8u; e++)
            wv[e] = nok && k + e < pc.in_ ? LOADF(W, WDT, pc.ob + n * pc.in_ + k + e) : 0.0;
    }
}
#endif

void main() {
    uint l = gl_LocalInvocationID.x;
    uint tx = l % 16u, ty = l / 16u;
    uint n0 = gl_WorkGroupID.x * BN, m0 = gl_WorkGroupID.y * BM;
    // this thread's share of each tile load: x row xr, columns xk..xk+TM-1; W row wr,
    // columns wk..wk+7
    uint xr = l / (16u / TM), xk = (l % (16u / TM)) * TM;
    uint wr = l / 2u, wk = (l % 2u) * 8u;

    float acc[8][8];
    [[unroll]] for (uint i = 0; i < 8u; i++)
        [[unroll]] for (uint j = 0; j < 8u; j++) acc[i][j] = 0.0;

    // this split's columns [kb, ke)
    uint kb = gl_WorkGroupID.z * pc.kchunk, ke = min(pc.in_, kb + pc.kchunk);
    float xv[8], wv[8];
    load_x(m0 + xr, kb + xk, xv);
    load_w(n0 + wr, kb + wk, wv);
    for (uint k0 = kb; k0 < ke; k0 += BK) {
        barrier(); // the previous step's reads of the tiles are done
        // scalar stores into the vec4 arrays: element xr (wr) of row c
        [[unroll]] for (uint e = 0; e < TM; e++)
            xs4[((xk + e) * (BM + PAD) + xr) / 4u][xr % 4u] = xv[e];
        [[unroll]] for (uint e = 0; e < 8u; e++)
            ws4[((wk + e) * (BN + PAD) + wr) / 4u][wr % 4u] = wv[e];
        barrier();
        if (k0 + BK < ke) {
            load_x(m0 + xr, k0 + BK + xk, xv);
            load_w(n0 + wr, k0 + BK + wk, wv);
        }
        [[unroll]] for (uint c = 0; c < BK; c++) {
            vec4 a0 = xs4[(c * (BM + PAD) + ty * TM) / 4u];
            vec4 a1 = TM == 8u ? xs4[(c * (BM + PAD) + ty * TM) / 4u + 1u] : vec4(0.0);
            vec4 b0 = ws4[(c * (BN + PAD) + tx * 4u) / 4u];
            vec4 b1 = ws4[(c * (BN + PAD) + BN / 2u + tx * 4u) / 4u];
            [[unroll]] for (uint i = 0; i < TM; i++) {
                float a = i < 4u ? a0[i] : a1[i - 4u];
                [[unroll]] for (uint j = 0; j < 4u; j++) {
                    acc[i][j] += a * b0[j];
                    acc[i][j + 4u] += a * b1[j];
                }
            }
        }
    }
    bool split = gl_NumWorkGroups.z > 1u;
    [[unroll]] for (uint i = 0; i < TM; i++) {
        uint r = m0 + ty * TM + i;
        if (r >= pc.rows) break;
        [[unroll]] for (uint j = 0; j < 8u; j++) {
            uint o = n0 + (j < 4u ? 0u : BN / 2u - 4u) + tx * 4u + j;
            if (o >= pc.out_) continue;
            float s = acc[i][j];
            if (split) {
                P[pc.oe + (gl_WorkGroupID.z * pc.rows + r) * pc.out_ + o] = floatBitsToUint(s);
                continue;
            }
            if (pc.has_bias != 0u) s += LOADF(BIAS, pc.tbias, pc.oc + o);
            D[pc.od + r * pc.out_ + o] = floatBitsToUint(s);
        }
    }
}
