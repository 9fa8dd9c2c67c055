#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
// dst [rows, out] = x [rows, in] W^T (+ bias) on the matrix cores (VK_NV_cooperative_matrix:
// 16 x 16 x 16 products of f16 operands, f32 accumulation). Tiles of 128 rows x BN outputs
// (256, or 128 where a product has few tiles): each subgroup of 32 takes 64 x 64 of them, 4 x
// 4 matrices, so that a step's 16 products cost 8 matrix loads from shared memory. x's and
// W's tiles go through shared memory BK columns a step, in 16-byte words of 8 halves; four
// threads take a row's words, so that a subgroup reads whole rows (as a row a thread, the
// loads alone took longer than the whole product now). The next step's words are loaded into
// registers as they are while the matrix cores work on the current step, then converted to
// f16 (saturated at the f16 range, so a large activation is clipped, never made infinite;
// f16 weights as they are) and stored: with 128-output tiles into the other of two buffers,
// one barrier a step; with 256 (the 48 KB of shared memory hold one buffer) after a barrier
// that waits for the current one's readers. Tiles inside the product without a bias are
// stored straight from the accumulators; the others go out through a 16 x 16 staging area
// a subgroup, so that edges and the bias need no special case. A product of few tiles is
// split over k (gl_WorkGroupID.z, pc.kchunk columns each): each split writes its sums to
// binding 4, and split_sum.comp adds them and the bias. On an H100 at 4096 rows: the
// gate product 1077 us (96 TFLOP/s), against 1621 for 128 x 128 tiles of 8 subgroups of 2 x
// 4 matrices, a row a thread.
// With QUANT, W is MLX-quantized (quant.glsl): a thread takes 8 codes of a row a step (one
// or two 32-bit words: 8 codes are BITS bytes from a multiple of BITS bytes), with their
// group's scale and bias, and dequantizes them (s * q + b in f32) to f16 as it stores them,
// so the weights reach the tiles as f16 and never as a full dequantized copy.
// Rounding the operands to f16 costs about 2^-11 relative per product: over the exact mode's
// conformance tolerance (1e-3 x max |logit|) for most fixtures, so the backend runs it in
// the fast precision mode only. Splitting each operand into two f16 parts did not recover
// the accuracy on the H100 and was slower. The KHR extension would do the same, but Debian
// 12's glslang (12.0) cannot compile it.
layout(constant_id = 0) const uint WG = 256; // BN: 4 or 8 subgroups (of 32: the host checks)
#ifdef QUANT
layout(constant_id = 2) const uint SDT = 0;
layout(constant_id = 4) const uint BITS = 4;
layout(constant_id = 5) const uint GROUP = 64;
const uint WDT = 99u; // (none of the float dtypes)
#else
layout(constant_id = 2) const uint WDT = 0;
#endif
layout(constant_id = 3) const uint VEC = 0; // x and W rows start on 16 bytes, in % 8 == 0
layout(local_size_x_id = 0) in;
#include "common.glsl"
#include "coop.glsl"
#ifdef QUANT
#include "quant.glsl"
#endif

#define BM 128u
#define BN WG
#define BK 32u
// a tile row in shared memory, in 16-byte words of 8 halves: BK halves (4 words) and one
// more, so that eight consecutive rows' words fall in different banks
#define LD4 5u
#define XW (4u * BM / WG) // words of x's tile a thread loads a step (W's: 4)
// two buffers of each tile with 128-output tiles, one with 256
const uint NBUF = 256u / WG;

BUF(0, D)
layout(binding = 0) buffer DF_b { float DF[]; }; // the same, as floats for coopMatStoreNV
RBUF(1, X)
RBUF4(1, X)
RBUF(2, W)
RBUF4(2, W)
RBUF(3, BIAS)
// with k split over gl_WorkGroupID.z: each split's sums [z][rows][out], which
// split_sum.comp adds (and the bias)
layout(binding = 4) buffer PF_b { float PF[]; };

layout(push_constant) uniform PC {
    PC_OFFSETS
    uint in_;
    uint out_;
    uint rows;
    uint has_bias;
    uint tbias;
#ifdef QUANT
    uint pad_[4]; // (matmul_big.comp's layout)
    uint wpr;     // words per weight row
    uint gpr;     // groups per weight row
    uint sc;      // word offsets of the scales and biases from the tensor's start
    uint bi;
#else
    uint pad_[8]; // (matmul_big.comp's layout)
#endif
    uint kchunk;  // columns a split, a multiple of BK
} pc;

// the tiles' buffers, [row][k] in words of 8 halves, and the staging areas: 44 KB with
// 128-output tiles, 38 KB with 256 (the host checks the device's limit)
shared uvec4 xs[NBUF * BM * LD4];
shared uvec4 ws[NBUF * BN * LD4];
shared float cs[(WG / 32u) * 256u];

// This thread's share of a step as loaded, not yet converted: words w = l + i WG of x's
// tile (row w / 4, columns k + 8 (w % 4)..; f32: 2 16-byte words each), i < XW, and of
// W's, i < 4 (16-bit: 1 word each, f32: 2); zeros outside the product. Four threads take a
// row's four words, so that a subgroup reads whole rows of 128 (x) and 64 bytes (W).
void load(uint m0, uint n0, uint l, uint k, out uvec4 xr[8], out uvec4 wr[8]) {
    bool full = VEC != 0u && k + BK <= pc.in_;
    [[unroll]] for (uint i = 0; i < 4u; i++) {
        uint w = l + i * WG, kq = k + (w % 4u) * 8u;
        uint r = m0 + w / 4u, n = n0 + w / 4u;
        bool xi = i < XW, rok = xi && r < pc.rows, nok = n < pc.out_;
#ifdef QUANT
        // in is a multiple of the group (>= 32 = BK), so a step's 8 codes are all in the
        // row and in one group: the words, the scale and the bias, zeros past the outputs
        if (nok) {
            uint wat = pc.ob + n * pc.wpr, bit = kq * BITS, g = n * pc.gpr + kq / GROUP;
            uint sh = bit & 31u;
            wr[i] = uvec4(W[wat + (bit >> 5)],
                          sh + 8u * BITS > 32u ? W[wat + (bit >> 5) + 1u] : 0u,
                          floatBitsToUint(QSB(W, pc.ob + pc.sc, g)),
                          floatBitsToUint(QBI(W, pc.ob + pc.bi, g)));
        } else {
            wr[i] = uvec4(0u);
        }
#endif
        if (full) {
            uint qx = (pc.oa + r * pc.in_ + kq) / 4u;
            if (xi) {
                xr[2u * i] = rok ? X4[qx] : uvec4(0u);
                xr[2u * i + 1u] = rok ? X4[qx + 1u] : uvec4(0u);
            }
            if (WDT == DT_F32) {
                uint qw = (pc.ob + n * pc.in_ + kq) / 4u;
                wr[2u * i] = nok ? W4[qw] : uvec4(0u);
                wr[2u * i + 1u] = nok ? W4[qw + 1u] : uvec4(0u);
            } else if (WDT != 99u) {
                wr[i] = nok ? W4[(pc.ob + n * pc.in_ + kq) / 8u] : uvec4(0u);
            }
        } else {
            [[unroll]] for (uint e = 0; e < 8u; e++) {
                uint kx = kq + e;
                if (xi) xr[2u * i + e / 4u][e % 4u] = rok && kx < pc.in_ ? X[pc.oa + r * pc.in_ + kx] : 0u;
                if (WDT == DT_F32)
                    wr[2u * i + e / 4u][e % 4u] = nok && kx < pc.in_ ? W[pc.ob + n * pc.in_ + kx] : 0u;
            }
            if (WDT != DT_F32 && WDT != 99u)
                [[unroll]] for (uint e = 0; e < 4u; e++) {
                    uint kw = kq + e * 2u, j = pc.ob + n * pc.in_ + kw;
                    uint lo = nok && kw < pc.in_ ? LOAD16(W, j) : 0u;
                    uint hi = nok && kw + 1u < pc.in_ ? LOAD16(W, j + 1u) : 0u;
                    wr[i][e] = lo | (hi << 16);
                }
        }
    }
}

// Converts them and stores them into buffer `buf` of both tiles.
void put(uint buf, uint l, uvec4 xr[8], uvec4 wr[8]) {
    [[unroll]] for (uint i = 0; i < 4u; i++) {
        uint w = l + i * WG, t = (w / 4u) * LD4 + w % 4u;
        if (i < XW) xs[buf * (BM * LD4) + t] = f32_word(xr[2u * i], xr[2u * i + 1u]);
        uvec4 v = wr[i];
#ifdef QUANT
        // the 8 codes from bit sh of words v.x, v.y; then s * q + b, as f16
        {
            uint sh = ((w % 4u) * 8u * BITS) & 31u; // (the step starts on a whole word)
            float s = uintBitsToFloat(v.z), b = uintBitsToFloat(v.w);
            float f[8];
            [[unroll]] for (uint e = 0; e < 8u; e++) {
                uint p = sh + e * BITS;
                uint c = p >= 32u ? v.y >> (p - 32u)
                                  : (v.x >> p) | (p + BITS > 32u ? v.y << (32u - p) : 0u);
                f[e] = s * QVAL(c & QMASK) + b;
            }
            v = uvec4(h2(f[0], f[1]), h2(f[2], f[3]), h2(f[4], f[5]), h2(f[6], f[7]));
        }
#else
        if (WDT == DT_F32) {
            v = f32_word(wr[2u * i], wr[2u * i + 1u]);
        } else if (WDT == DT_BF16) {
            v = bf16_word(v);
        }
#endif
        ws[buf * (BN * LD4) + t] = v;
    }
}

void main() {
    uint l = gl_LocalInvocationID.x, sg = l / 32u, lane = l % 32u;
    uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;
    uint nsn = BN / 64u;                                // subgroups along the outputs
    uint sm = (sg / nsn) * 64u, sn = (sg % nsn) * 64u; // this subgroup's rows and outputs
    fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> acc[4][4];
    [[unroll]] for (uint i = 0; i < 4u; i++)
        [[unroll]] for (uint j = 0; j < 4u; j++)
            acc[i][j] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0);

    // this split's columns from kb (the last split's last step may be partial)
    uint kb = gl_WorkGroupID.z * pc.kchunk, ke = min(pc.in_, kb + pc.kchunk);
    uvec4 xr[8], wr[8];
    uint steps = (ke - kb + BK - 1u) / BK;
    load(m0, n0, l, kb, xr, wr);
    put(0u, l, xr, wr);
    barrier();
    for (uint s = 0; s < steps; s++) {
        uint cur = NBUF == 2u ? s & 1u : 0u;
        bool more = s + 1u < steps;
        if (more) load(m0, n0, l, kb + (s + 1u) * BK, xr, wr);
        [[unroll]] for (uint kk = 0; kk < BK / 8u; kk += 2u) {
            fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> a[4], b[4];
            [[unroll]] for (uint i = 0; i < 4u; i++)
                coopMatLoadNV(a[i], xs, cur * (BM * LD4) + (sm + i * 16u) * LD4 + kk, LD4, false);
            [[unroll]] for (uint j = 0; j < 4u; j++)
                coopMatLoadNV(b[j], ws, cur * (BN * LD4) + (sn + j * 16u) * LD4 + kk, LD4, true);
            [[unroll]] for (uint i = 0; i < 4u; i++)
                [[unroll]] for (uint j = 0; j < 4u; j++)
                    acc[i][j] = coopMatMulAddNV(a[i], b[j], acc[i][j]);
        }
        // two buffers: the other one was last read before the previous step's barrier; one:
        // wait until every subgroup is done with it
        if (NBUF == 1u) barrier();
        if (more) put(NBUF == 2u ? 1u - cur : 0u, l, xr, wr);
        barrier();
    }
    // Whole tiles without a bias straight to dst or the split's sums (rows and buffer
    // 16-byte aligned); the others matrix by matrix through this subgroup's staging area, 8
    // values a lane.
    bool split = gl_NumWorkGroups.z > 1u, bias = pc.has_bias != 0u && !split;
    uint base = split ? pc.oe + gl_WorkGroupID.z * pc.rows * pc.out_ : pc.od;
    bool direct = !bias && m0 + BM <= pc.rows && n0 + BN <= pc.out_ && base % 4u == 0u &&
                  pc.out_ % 4u == 0u;
    uint cb = sg * 256u;
    [[unroll]] for (uint i = 0; i < 4u; i++)
        [[unroll]] for (uint j = 0; j < 4u; j++) {
            uint r0 = m0 + sm + i * 16u, o0 = n0 + sn + j * 16u;
            if (direct && split) {
                coopMatStoreNV(acc[i][j], PF, base + r0 * pc.out_ + o0, pc.out_, false);
                continue;
            }
            if (direct) {
                coopMatStoreNV(acc[i][j], DF, base + r0 * pc.out_ + o0, pc.out_, false);
                continue;
            }
            coopMatStoreNV(acc[i][j], cs, cb, 16u, false);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            [[unroll]] for (uint e = 0; e < 8u; e++) {
                uint idx = lane * 8u + e, r = r0 + idx / 16u, o = o0 + idx % 16u;
                if (r < pc.rows && o < pc.out_) {
                    float v = cs[cb + idx];
                    if (bias) v += LOADF(BIAS, pc.tbias, pc.oc + o);
                    if (split)
                        PF[base + r * pc.out_ + o] = v;
                    else
                        D[base + r * pc.out_ + o] = floatBitsToUint(v);
                }
            }
            subgroupBarrier(); // read before the next matrix is stored
        }
}
