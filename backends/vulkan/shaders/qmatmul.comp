#version 450
#extension GL_GOOGLE_include_directive : require
// dst [rows, out] = x [rows, in] W^T (+ bias) for many rows with W quantized (see
// quant.glsl). The tiling of matmul.comp: 64 x 64 output tiles, a 4 x 4 block per thread,
// x and W staged through shared memory BK = 16 columns at a time. Each thread decodes 4
// codes of one weight row per step (one or two 32-bit loads: 4 * BITS <= 32 bits) and
// stores s * q + b in shared memory, so every packed value is unpacked once per tile and
// reused by the tile's 64 rows of x; the products accumulate in f32.
// With MOE: gl_WorkGroupID.y is a work item of moe_sort.comp (an expert and up to BM of
// its (row, slot) pairs); rows are gathered from x and scattered to dst.
layout(constant_id = 0) const uint WG = 256; // must be 256: 16 x 16 threads
layout(constant_id = 2) const uint SDT = 0;
layout(constant_id = 4) const uint BITS = 4;
layout(constant_id = 5) const uint GROUP = 64;
layout(local_size_x_id = 0) in;
#include "common.glsl"
#include "quant.glsl"

#define BM 64
#define BN 64
#define BK 16 // divides every GROUP: a step's 16 values of a row share one scale and bias

BUF(0, D)
RBUF(1, X)
RBUF(2, W)
RBUF(3, BIAS)
#ifdef MOE
RBUF(5, S)
#endif

layout(push_constant) uniform PC {
    PC_OFFSETS
    uint in_;
    uint out_;
    uint rows;
    uint has_bias;
    uint tbias;
    uint k;
    uint per_slot;
    uint list_at;
    uint items_at;
    uint wpr;
    uint gpr;
    uint sc;
    uint bi;
} pc;

shared float xs[BK][BM + 4];
shared float ws[BK][BN + 4];
shared uint xrow_s[BM], drow_s[BM];

void main() {
    uint l = gl_LocalInvocationID.x;
    uint tx = l % 16u, ty = l / 16u;
    uint n0 = gl_WorkGroupID.x * BN;
    uint wrow0 = 0u, nrows;
#ifdef MOE
    uint it = pc.items_at + gl_WorkGroupID.y * 3u;
    uint e = S[it], first = S[it + 1u];
    nrows = S[it + 2u];
    wrow0 = e * pc.out_;
    if (l < BM) {
        uint p = l < nrows ? S[pc.list_at + first + l] : 0u;
        xrow_s[l] = pc.per_slot != 0u ? p : p / pc.k;
        drow_s[l] = p;
    }
#else
    uint m0 = gl_WorkGroupID.y * BM;
    nrows = min(uint(BM), pc.rows - m0);
    if (l < BM) xrow_s[l] = drow_s[l] = m0 + l;
#endif
    barrier();

    // the weight row and the 4 columns of the step this thread dequantizes
    uint wr = l / 4u, wc = (l % 4u) * 4u;
    bool wvalid = n0 + wr < pc.out_;
    uint wrow = wrow0 + (wvalid ? n0 + wr : 0u);
    uint wat = pc.ob + wrow * pc.wpr;

    float acc[4][4];
    [[unroll]] for (uint i = 0; i < 4u; i++)
        [[unroll]] for (uint j = 0; j < 4u; j++) acc[i][j] = 0.0;

    for (uint k0 = 0; k0 < pc.in_; k0 += BK) {
        // x: 1024 elements, 4 per thread; rows along k are contiguous (in % 32 == 0)
        [[unroll]] for (uint q = 0; q < 4u; q++) {
            uint idx = l + q * WG, r = idx / BK, c = idx % BK;
            xs[c][r] = r < nrows ? uintBitsToFloat(X[pc.oa + xrow_s[r] * pc.in_ + k0 + c]) : 0.0;
        }
        // W: 4 codes of row wr at bit (k0 + wc) * BITS, within one 32-bit window
        {
            uint v = k0 + wc, bit = v * BITS, sh = bit & 31u;
            uint word = W[wat + (bit >> 5)] >> sh;
            if (sh + 4u * BITS > 32u) word |= W[wat + (bit >> 5) + 1u] << (32u - sh);
            uint g = wrow * pc.gpr + k0 / GROUP;
            float s = QSB(W, pc.ob + pc.sc, g), b = QBI(W, pc.ob + pc.bi, g);
            [[unroll]] for (uint i = 0; i < 4u; i++)
                ws[wc + i][wr] = wvalid ? s * QVAL((word >> (i * BITS)) & QMASK) + b : 0.0;
        }
        barrier();
        [[unroll]] for (uint c = 0; c < BK; c++) {
            vec4 a = vec4(xs[c][ty * 4u], xs[c][ty * 4u + 1u], xs[c][ty * 4u + 2u],
                          xs[c][ty * 4u + 3u]);
            vec4 b = vec4(ws[c][tx * 4u], ws[c][tx * 4u + 1u], ws[c][tx * 4u + 2u],
                          ws[c][tx * 4u + 3u]);
            [[unroll]] for (uint i = 0; i < 4u; i++)
                [[unroll]] for (uint j = 0; j < 4u; j++) acc[i][j] += a[i] * b[j];
        }
        barrier();
    }
    [[unroll]] for (uint i = 0; i < 4u; i++) {
        uint r = ty * 4u + i;
        if (r >= nrows) break;
        [[unroll]] for (uint j = 0; j < 4u; j++) {
            uint o = n0 + tx * 4u + j;
            if (o >= pc.out_) break;
            float s = acc[i][j];
            if (pc.has_bias != 0u) s += LOADF(BIAS, pc.tbias, pc.oc + o);
            D[pc.od + drow_s[r] * pc.out_ + o] = floatBitsToUint(s);
        }
    }
}
