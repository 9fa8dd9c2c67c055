#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
// dst [rows, out] = x [rows, in] W^T (+ bias) on the matrix cores (VK_NV_cooperative_matrix:
// 16 x 16 x 16 products of f16 operands, f32 accumulation). 128 x 128 output tiles; the
// eight subgroups of 32 take 32 rows x 64 outputs each (2 x 4 matrices). x and W go through
// shared memory BK columns at a time, converted to f16 on the way (saturated at the f16
// range, so a large activation is clipped, never made infinite), in two buffers: the next
// columns are loaded into registers while the matrix cores work on the current ones, and
// stored into the other buffer, one barrier a step. The accumulators go out through a
// 16 x 16 staging area a subgroup, so that edges and the bias need no special case.
// Rounding the operands to f16 costs about 2^-11 relative per product: over the
// conformance tolerance (1e-3 x max |logit|) for most fixtures, and enough to flip a
// near-tied MoE routing choice, so the backend uses it only when asked
// (LMHOST_VK_COOPMAT=1). Splitting each operand into two f16 parts did not recover the
// accuracy on the H100 and was slower. The KHR extension would do the same, but Debian 12's
// glslang (12.0) cannot compile it.
layout(constant_id = 0) const uint WG = 256; // 8 subgroups of 32: the host checks
layout(constant_id = 2) const uint WDT = 0;
layout(constant_id = 3) const uint VEC = 0; // x and W rows start on 16 bytes, in % 8 == 0
layout(local_size_x_id = 0) in;
#include "common.glsl"

#define BM 128
#define BN 128
#define BK 32
// a tile row in shared memory: BK halves and 8 more, so that rows start 16 bytes apart in
// different banks
#define LD 40

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

// two buffers of each tile, [row][k]: 40 KB, and the staging areas 8 KB (48 KB: the host
// checks the device's limit)
shared float16_t xs[2 * BM * LD];
shared float16_t ws[2 * BN * LD];
shared float cs[(WG / 32u) * 256u];

float16_t h(float v) { return float16_t(clamp(v, -65504.0, 65504.0)); }

// This thread's share of a step's tiles: 16 columns from k of x row r and of W row n.
void load(uint r, uint n, uint k, out float xv[16], out float wv[16]) {
    bool rok = r < pc.rows, nok = n < pc.out_;
    if (VEC != 0u && k + 16u <= pc.in_) {
        uint qx = (pc.oa + r * pc.in_ + k) / 4u;
        [[unroll]] for (uint h4 = 0; h4 < 4u; h4++) {
            vec4 a = rok ? uintBitsToFloat(X4[qx + h4]) : vec4(0.0);
            [[unroll]] for (uint e = 0; e < 4u; e++) xv[h4 * 4u + e] = a[e];
        }
        if (WDT == DT_F32) {
            uint qw = (pc.ob + n * pc.in_ + k) / 4u;
            [[unroll]] for (uint h4 = 0; h4 < 4u; h4++) {
                vec4 a = nok ? uintBitsToFloat(W4[qw + h4]) : vec4(0.0);
                [[unroll]] for (uint e = 0; e < 4u; e++) wv[h4 * 4u + e] = a[e];
            }
        } else {
            uint qw = (pc.ob + n * pc.in_ + k) / 8u;
            [[unroll]] for (uint h8 = 0; h8 < 2u; h8++) {
                vec4 a = vec4(0.0), b = vec4(0.0);
                if (nok) unpack_word(W4[qw + h8], WDT, a, b);
                [[unroll]] for (uint e = 0; e < 4u; e++) {
                    wv[h8 * 8u + e] = a[e];
                    wv[h8 * 8u + 4u + e] = b[e];
                }
            }
        }
    } else {
        [[unroll]] for (uint e = 0; e < 16u; e++) {
            bool kok = k + e < pc.in_;
            xv[e] = rok && kok ? uintBitsToFloat(X[pc.oa + r * pc.in_ + k + e]) : 0.0;
            wv[e] = nok && kok ? LOADF(W, WDT, pc.ob + n * pc.in_ + k + e) : 0.0;
        }
    }
}

// Stores them into the tiles as f16 at element t (this thread's row and columns of a
// buffer).
void put(uint t, float xv[16], float wv[16]) {
    [[unroll]] for (uint e = 0; e < 16u; e++) {
        xs[t + e] = h(xv[e]);
        ws[t + e] = h(wv[e]);
    }
}

void main() {
    uint l = gl_LocalInvocationID.x, sg = l / 32u, lane = l % 32u;
    uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;
    uint sm = (sg / 2u) * 32u, sn = (sg % 2u) * 64u; // this subgroup's rows and outputs
    uint lr = l / 2u, lk = (l % 2u) * 16u;            // this thread's tile row and columns
    fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> acc[2][4];
    [[unroll]] for (uint i = 0; i < 2u; i++)
        [[unroll]] for (uint j = 0; j < 4u; j++)
            acc[i][j] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0);

    float xv[16], wv[16];
    uint steps = (pc.in_ + BK - 1u) / BK;
    load(m0 + lr, n0 + lr, lk, xv, wv);
    put(lr * LD + lk, xv, wv);
    barrier();
    for (uint s = 0; s < steps; s++) {
        uint cur = (s & 1u) * (BM * LD), nxt = BM * LD - cur;
        bool more = s + 1u < steps;
        if (more) load(m0 + lr, n0 + lr, (s + 1u) * BK + lk, xv, wv);
        [[unroll]] for (uint kk = 0; kk < BK; kk += 16u) {
            fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> a[2], b[4];
            [[unroll]] for (uint i = 0; i < 2u; i++)
                coopMatLoadNV(a[i], xs, cur + (sm + i * 16u) * LD + kk, LD, false);
            [[unroll]] for (uint j = 0; j < 4u; j++)
                coopMatLoadNV(b[j], ws, cur + (sn + j * 16u) * LD + kk, LD, true);
            [[unroll]] for (uint i = 0; i < 2u; i++)
                [[unroll]] for (uint j = 0; j < 4u; j++)
                    acc[i][j] = coopMatMulAddNV(a[i], b[j], acc[i][j]);
        }
        // the other buffer was last read before the previous step's barrier
        if (more) put(nxt + lr * LD + lk, xv, wv);
        barrier();
    }
    // each matrix through this subgroup's staging area: 8 values a lane
    uint cb = sg * 256u;
    [[unroll]] for (uint i = 0; i < 2u; i++)
        [[unroll]] for (uint j = 0; j < 4u; j++) {
            coopMatStoreNV(acc[i][j], cs, cb, 16u, false);
            barrier();
            [[unroll]] for (uint e = 0; e < 8u; e++) {
                uint idx = lane * 8u + e, r = m0 + sm + i * 16u + idx / 16u;
                uint o = n0 + sn + j * 16u + idx % 16u;
                if (r < pc.rows && o < pc.out_) {
                    float v = cs[cb + idx];
                    if (pc.has_bias != 0u) v += LOADF(BIAS, pc.tbias, pc.oc + o);
                    D[pc.od + r * pc.out_ + o] = floatBitsToUint(v);
                }
            }
            barrier();
        }
}
