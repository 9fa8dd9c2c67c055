#version 450
#extension GL_GOOGLE_include_directive : require
// dst [rows, out] = x [rows, in] W^T (+ bias) for many rows: 64 x 64 output tiles, a
// 4 x 4 block per thread, x and W staged through shared memory 16 columns at a time
// (converted to f32 there), f32 accumulation.
// With MOE: gl_WorkGroupID.y is a work item of moe_sort.comp (an expert and up to BM of
// its (row, slot) pairs); rows are gathered from x and scattered to dst.
layout(constant_id = 0) const uint WG = 256; // must be 256: 16 x 16 threads
layout(constant_id = 2) const uint WDT = 0;
layout(local_size_x_id = 0) in;
#include "common.glsl"

#define BM 64
#define BN 64
#define BK 16

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
} pc;

shared float xs[BK][BM + 4];
shared float ws[BK][BN + 4];
shared uint xrow_s[BM], drow_s[BM];

void main() {
    uint l = gl_LocalInvocationID.x;
    uint tx = l % 16u, ty = l / 16u;
    uint n0 = gl_WorkGroupID.x * BN;
    uint wbase = pc.ob, nrows;
#ifdef MOE
    uint it = pc.items_at + gl_WorkGroupID.y * 3u;
    uint e = S[it], first = S[it + 1u];
    nrows = S[it + 2u];
    wbase += e * pc.out_ * pc.in_;
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

    float acc[4][4];
    [[unroll]] for (uint i = 0; i < 4u; i++)
        [[unroll]] for (uint j = 0; j < 4u; j++) acc[i][j] = 0.0;

    for (uint k0 = 0; k0 < pc.in_; k0 += BK) {
        // 1024 elements of each tile, 4 per thread; rows along k are contiguous
        [[unroll]] for (uint q = 0; q < 4u; q++) {
            uint idx = l + q * WG, r = idx / BK, c = idx % BK, k = k0 + c;
            float xv = 0.0, wv = 0.0;
            if (r < nrows && k < pc.in_)
                xv = uintBitsToFloat(X[pc.oa + xrow_s[r] * pc.in_ + k]);
            if (n0 + r < pc.out_ && k < pc.in_)
                wv = LOADF(W, WDT, wbase + (n0 + r) * pc.in_ + k);
            xs[c][r] = xv;
            ws[c][r] = wv;
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
