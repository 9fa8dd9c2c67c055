#version 450
#extension GL_GOOGLE_include_directive : require
// dst [rows, out] = x [rows, in] W^T (+ bias) for many rows, in larger tiles than
// matmul.comp: 128 x 128 outputs a workgroup, 8 rows x 8 outputs a thread (64 sums against
// 16 operands read from shared memory: four times matmul.comp's arithmetic a shared read),
// and the next 16 columns of x and W loaded into registers (16-byte loads where VEC says the
// rows allow) while the current ones are multiplied. A thread's outputs are two runs of 4,
// half the tile apart, so that the 16 threads reading W's tile read 256 contiguous bytes
// (8 outputs in a run took two shared-memory passes more a column; prefill 4-7% slower on an
// H100). Each sum runs over k in order, one multiply-add a step, as in matmul.comp (the same
// greedy tokens on an H100). For prefill (the host's choice: vk_ops.c).
layout(constant_id = 0) const uint WG = 256; // must be 256: 16 x 16 threads
layout(constant_id = 2) const uint WDT = 0;
layout(constant_id = 3) const uint VEC = 0; // x and W rows start on 16 bytes, in % 8 == 0
layout(local_size_x_id = 0) in;
#include "common.glsl"

#define BM 128
#define BN 128
#define BK 16
#define PAD 4 // keeps a row of the tiles on 16 bytes for the vector reads

BUF(0, D)
RBUF(1, X)
RBUF4(1, X)
RBUF(2, W)
RBUF4(2, W)
RBUF(3, BIAS)

layout(push_constant) uniform PC {
    PC_OFFSETS
    uint in_;
    uint out_;
    uint rows;
    uint has_bias;
    uint tbias;
} pc;

// the tiles, k-major: xs[k][row], ws[k][output]
shared vec4 xs4[BK * (BM + PAD) / 4];
shared vec4 ws4[BK * (BN + PAD) / 4];

// Eight values of x row r (absolute) and W row n from column k on (zero past the ends):
// each thread loads a row's half of the 16 columns of both tiles.
void load(uint r, uint n, uint k, out float xv[8], out float wv[8]) {
    bool rok = r < pc.rows, nok = n < pc.out_;
    if (VEC != 0u && k + 8u <= pc.in_) {
        vec4 a = vec4(0.0), b = vec4(0.0);
        if (rok) {
            uint q = (pc.oa + r * pc.in_ + k) / 4u;
            a = uintBitsToFloat(X4[q]);
            b = uintBitsToFloat(X4[q + 1u]);
        }
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
            xv[e] = a[e];
            xv[e + 4u] = b[e];
            wv[e] = c[e];
            wv[e + 4u] = d[e];
        }
    } else {
        [[unroll]] for (uint e = 0; e < 8u; e++) {
            bool kok = k + e < pc.in_;
            xv[e] = rok && kok ? uintBitsToFloat(X[pc.oa + r * pc.in_ + k + e]) : 0.0;
            wv[e] = nok && kok ? LOADF(W, WDT, pc.ob + n * pc.in_ + k + e) : 0.0;
        }
    }
}

void main() {
    uint l = gl_LocalInvocationID.x;
    uint tx = l % 16u, ty = l / 16u;
    uint n0 = gl_WorkGroupID.x * BN, m0 = gl_WorkGroupID.y * BM;
    // this thread's share of each tile load: row lr (of x and of W), columns lk..lk+7
    uint lr = l / 2u, lk = (l % 2u) * 8u;

    float acc[8][8];
    [[unroll]] for (uint i = 0; i < 8u; i++)
        [[unroll]] for (uint j = 0; j < 8u; j++) acc[i][j] = 0.0;

    float xv[8], wv[8];
    load(m0 + lr, n0 + lr, lk, xv, wv);
    for (uint k0 = 0; k0 < pc.in_; k0 += BK) {
        barrier(); // the previous step's reads of the tiles are done
        [[unroll]] for (uint e = 0; e < 8u; e++) {
            uint c = lk + e;
            // scalar stores into the vec4 arrays: element lr of row c
            xs4[(c * (BM + PAD) + lr) / 4u][lr % 4u] = xv[e];
            ws4[(c * (BN + PAD) + lr) / 4u][lr % 4u] = wv[e];
        }
        barrier();
        if (k0 + BK < pc.in_) load(m0 + lr, n0 + lr, k0 + BK + lk, xv, wv);
        [[unroll]] for (uint c = 0; c < BK; c++) {
            vec4 a0 = xs4[(c * (BM + PAD) + ty * 8u) / 4u];
            vec4 a1 = xs4[(c * (BM + PAD) + ty * 8u) / 4u + 1u];
            vec4 b0 = ws4[(c * (BN + PAD) + tx * 4u) / 4u];
            vec4 b1 = ws4[(c * (BN + PAD) + BN / 2u + tx * 4u) / 4u];
            [[unroll]] for (uint i = 0; i < 8u; i++) {
                float a = i < 4u ? a0[i] : a1[i - 4u];
                [[unroll]] for (uint j = 0; j < 4u; j++) {
                    acc[i][j] += a * b0[j];
                    acc[i][j + 4u] += a * b1[j];
                }
            }
        }
    }
    [[unroll]] for (uint i = 0; i < 8u; i++) {
        uint r = m0 + ty * 8u + i;
        if (r >= pc.rows) break;
        [[unroll]] for (uint j = 0; j < 8u; j++) {
            uint o = n0 + (j < 4u ? 0u : BN / 2u - 4u) + tx * 4u + j;
            if (o >= pc.out_) continue;
            float s = acc[i][j];
            if (pc.has_bias != 0u) s += LOADF(BIAS, pc.tbias, pc.oc + o);
            D[pc.od + r * pc.out_ + o] = floatBitsToUint(s);
        }
    }
}
