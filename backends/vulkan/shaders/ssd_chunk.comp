#version 450
#extension GL_GOOGLE_include_directive : require
// LMH_OP_SSD_SCAN's chunked form (Mamba-2's state space duality, as mamba2_chunk_scan):
// the rows in chunks of L; within a chunk, with cum[t] = sum_{u <= t} A d[u] (A = -exp(A_log)),
//   y[t] = sum_{s <= t} (C[t] . B[s]) exp(cum[t] - cum[s]) d[s] x[s]      (intra-chunk)
//        + exp(cum[t]) C[t] . h_in                                        (state in)
//        + D x[t]
//   h_out = exp(cum[L-1]) h_in + sum_s exp(cum[L-1] - cum[s]) d[s] x[s] B[s]^T,
// so a long prefill is a few matrix passes and a scan over chunks, not a scan over rows.
// One op's rows may be cut into segments of chunks (the scratch's size); each segment is:
//   STATES: a workgroup a (chunk, head, 64 x 64 block of the state): d and cum of the rows
//           into the scratch (DC, the first block's workgroup), and the block of the
//           chunk's own state (the sum above, h_in = 0) into the scratch (CS);
//   PASS:   a thread a state value: walks the chunks, leaving in CS each chunk's h_in and
//           in the state operand the state after the last;
//   OUT:    a workgroup a (chunk, head, 64 channels of the head): the outputs.
// STATES and OUT are small matrix products, through shared memory in tiles, each thread
// summing a 4 x 4 block of the result (rows ty + 16 i, columns tx + 16 j: the tiles' reads
// are broadcasts or consecutive words, free of bank conflicts with an odd row stride).
// Scratch (f32 words from its offset): DC [chunks][H][2][L] (d, then cum), CS [chunks][H][P][N].
layout(constant_id = 0) const uint WG = 256;
layout(local_size_x_id = 0) in;
#include "common.glsl"
#include "unary.glsl"

#define L 64u

#if defined(STATES)
BUF(0, SCR)
RBUF(1, X)
RBUF(2, DT)
RBUF(3, AL)
RBUF(4, B)
RBUF(7, DTB)
#elif defined(PASS)
BUF(0, SCR)
BUF(8, ST)
#else
BUF(0, Y)
RBUF(1, X)
RBUF(2, SCR)
RBUF(4, B)
RBUF(5, C)
RBUF(6, DD)
#endif

layout(push_constant) uniform PC {
    PC_OFFSETS // 0; x; dt (OUT: the scratch); A_log; B
    uint oC, oD, oT, oS; // C, D, dt_bias, state
    uint n;    // rows of the op
    uint t0;   // the segment's first row
    uint nc;   // its chunks
    uint H, P, G, N;
    uint has_d, has_dtb, ta, td, tdtb;
    float lo, hi;
    uint has_hi;
    uint cs;   // CS's word offset in the scratch
} pc;

uint chunk_len(uint c) { return min(L, pc.n - (pc.t0 + c * L)); }

#if defined(STATES)
#define TT 32u // rows of x and B a tile
shared float sd[L], scum[L], sw[L], Xs[TT * 64u], Bs[TT * 64u];

void main() {
    uint lid = gl_LocalInvocationID.x, ty = lid / 16u, tx = lid % 16u;
    uint npb = (pc.P + 63u) / 64u, nnb = (pc.N + 63u) / 64u;
    uint gi = group_index(), nb = gi % nnb, pb = (gi / nnb) % npb, ch = gi / (nnb * npb);
    uint c = ch / pc.H, h = ch - c * pc.H;
    if (c >= pc.nc) return; // uniform over the workgroup
    uint tc = pc.t0 + c * L, len = chunk_len(c), g = h / (pc.H / pc.G), HP = pc.H * pc.P;
    float ah = -exp(LOADF(AL, pc.ta, pc.oc + h));
    if (lid < L) {
        float d = 0.0;
        if (lid < len) {
            float dtb = pc.has_dtb != 0u ? LOADF(DTB, pc.tdtb, pc.oT + h) : 0.0;
            d = softplus_f(uintBitsToFloat(DT[pc.ob + (tc + lid) * pc.H + h]) + dtb);
            d = d < pc.lo ? pc.lo : d;
            if (pc.has_hi != 0u && d > pc.hi) d = pc.hi;
        }
        sd[lid] = d;
    }
    barrier();
    if (lid == 0u) {
        float cum = 0.0;
        for (uint t = 0; t < L; t++) {
            cum += ah * sd[t]; // d = 0 past the chunk's rows: cum stays
            scum[t] = cum;
        }
    }
    barrier();
    uint dc = (c * pc.H + h) * 2u * L;
    if (lid < L) {
        if (gi % (nnb * npb) == 0u) {
            SCR[pc.od + dc + lid] = floatBitsToUint(sd[lid]);
            SCR[pc.od + dc + L + lid] = floatBitsToUint(scum[lid]);
        }
        sw[lid] = lid < len ? exp(scum[L - 1u] - scum[lid]) * sd[lid] : 0.0;
    }
    // S[p][n] = sum_t sw[t] x[t][p] B[t][n] over this workgroup's 64 x 64 block
    uint p0 = pb * 64u, n0 = nb * 64u;
    float acc[4][4];
    for (uint i = 0; i < 4u; i++)
        for (uint j = 0; j < 4u; j++) acc[i][j] = 0.0;
    for (uint t0 = 0; t0 < len; t0 += TT) {
        barrier(); // sw written; the last tile read
        for (uint e = lid; e < TT * 64u; e += WG) {
            uint t = e / 64u, k = e % 64u, r = tc + t0 + t;
            bool in_t = t0 + t < len;
            Xs[e] = in_t && p0 + k < pc.P
                        ? sw[t0 + t] * uintBitsToFloat(X[pc.oa + r * HP + h * pc.P + p0 + k])
                        : 0.0;
            Bs[e] = in_t && n0 + k < pc.N
                        ? uintBitsToFloat(B[pc.oe + (r * pc.G + g) * pc.N + n0 + k])
                        : 0.0;
        }
        barrier();
        for (uint t = 0; t < TT; t++) {
            float xv[4], bv[4];
            for (uint i = 0; i < 4u; i++) xv[i] = Xs[t * 64u + ty + 16u * i];
            for (uint j = 0; j < 4u; j++) bv[j] = Bs[t * 64u + tx + 16u * j];
            for (uint i = 0; i < 4u; i++)
                for (uint j = 0; j < 4u; j++) acc[i][j] += xv[i] * bv[j];
        }
    }
    uint cs = pc.od + pc.cs + (c * pc.H + h) * pc.P * pc.N;
    for (uint i = 0; i < 4u; i++)
        for (uint j = 0; j < 4u; j++) {
            uint p = p0 + ty + 16u * i, n = n0 + tx + 16u * j;
            if (p < pc.P && n < pc.N) SCR[cs + p * pc.N + n] = floatBitsToUint(acc[i][j]);
        }
}

#elif defined(PASS)
void main() {
    uint e = group_index() * WG + gl_LocalInvocationID.x, PN = pc.P * pc.N;
    if (e >= pc.H * PN) return;
    uint h = e / PN;
    float hv = uintBitsToFloat(ST[pc.oS + e]);
    // 8 chunks' values loaded before any is written: the loads do not wait on the chain
    for (uint c0 = 0; c0 < pc.nc; c0 += 8u) {
        float own[8], last[8];
        for (uint k = 0; k < 8u; k++) {
            uint c = c0 + k;
            own[k] = c < pc.nc ? uintBitsToFloat(SCR[pc.od + pc.cs + c * pc.H * PN + e]) : 0.0;
            last[k] = c < pc.nc ? uintBitsToFloat(SCR[pc.od + (c * pc.H + h) * 2u * L + L +
                                                      chunk_len(c) - 1u])
                                : 0.0;
        }
        for (uint k = 0; k < 8u && c0 + k < pc.nc; k++) {
            SCR[pc.od + pc.cs + (c0 + k) * pc.H * PN + e] = floatBitsToUint(hv); // its h_in
            hv = exp(last[k]) * hv + own[k];
        }
    }
    ST[pc.oS + e] = floatBitsToUint(hv);
}

#else // OUT
#define NB 16u // states a tile (shared memory within 32 KB, lavapipe's)
#define TS 17u // its row stride
shared float sd[L], scum[L], Ms[L * (L + 1u)], Tl[3u * L * TS];

void main() {
    uint lid = gl_LocalInvocationID.x, ty = lid / 16u, tx = lid % 16u;
    uint npb = (pc.P + 63u) / 64u;
    uint gi = group_index(), pb = gi % npb, ch = gi / npb, c = ch / pc.H, h = ch - c * pc.H;
    if (c >= pc.nc) return;
    uint tc = pc.t0 + c * L, len = chunk_len(c), g = h / (pc.H / pc.G), HP = pc.H * pc.P;
    uint dc = (c * pc.H + h) * 2u * L, p0 = pb * 64u;
    if (lid < L) {
        sd[lid] = uintBitsToFloat(SCR[pc.ob + dc + lid]);
        scum[lid] = uintBitsToFloat(SCR[pc.ob + dc + L + lid]);
    }
    // C B^T (rows t, columns s) and C h_in^T (rows t, columns p) over the states, a tile
    // of NB at a time: C's rows in Tl[0], B's in Tl[1], h_in's in Tl[2]
    uint hin = pc.ob + pc.cs + (c * pc.H + h) * pc.P * pc.N;
    float cb[4][4], yo[4][4];
    for (uint i = 0; i < 4u; i++)
        for (uint j = 0; j < 4u; j++) cb[i][j] = yo[i][j] = 0.0;
    for (uint n0 = 0; n0 < pc.N; n0 += NB) {
        barrier();
        for (uint e = lid; e < L * NB; e += WG) {
            uint r = e / NB, k = e % NB, n = n0 + k, row = ((tc + r) * pc.G + g) * pc.N + n;
            bool in_ = r < len && n < pc.N;
            Tl[r * TS + k] = in_ ? uintBitsToFloat(C[pc.oC + row]) : 0.0;
            Tl[L * TS + r * TS + k] = in_ ? uintBitsToFloat(B[pc.oe + row]) : 0.0;
            Tl[2u * L * TS + r * TS + k] =
                p0 + r < pc.P && n < pc.N ? uintBitsToFloat(SCR[hin + (p0 + r) * pc.N + n]) : 0.0;
        }
        barrier();
        for (uint k = 0; k < NB; k++) {
            float cv[4], bv[4], hv[4];
            for (uint i = 0; i < 4u; i++) cv[i] = Tl[(ty + 16u * i) * TS + k];
            for (uint j = 0; j < 4u; j++) {
                bv[j] = Tl[L * TS + (tx + 16u * j) * TS + k];
                hv[j] = Tl[2u * L * TS + (tx + 16u * j) * TS + k];
            }
            for (uint i = 0; i < 4u; i++)
                for (uint j = 0; j < 4u; j++) {
                    cb[i][j] += cv[i] * bv[j];
                    yo[i][j] += cv[i] * hv[j];
                }
        }
    }
    // M[t][s] = (C[t] . B[s]) exp(cum[t] - cum[s]) d[s], s <= t; x's rows of the channels
    for (uint i = 0; i < 4u; i++)
        for (uint j = 0; j < 4u; j++) {
            uint t = ty + 16u * i, s = tx + 16u * j;
            Ms[t * (L + 1u) + s] = s <= t && t < len ? cb[i][j] * exp(scum[t] - scum[s]) * sd[s] : 0.0;
        }
    float y[4][4];
    for (uint i = 0; i < 4u; i++)
        for (uint j = 0; j < 4u; j++) y[i][j] = yo[i][j] * exp(scum[ty + 16u * i]);
    for (uint s0 = 0; s0 < len; s0 += 32u) { // x's rows, 32 at a time
        barrier();
        for (uint e = lid; e < 32u * 64u; e += WG) {
            uint s = s0 + e / 64u, p = e % 64u;
            Tl[e] = s < len && p0 + p < pc.P
                        ? uintBitsToFloat(X[pc.oa + (tc + s) * HP + h * pc.P + p0 + p])
                        : 0.0;
        }
        barrier();
        for (uint s = 0; s < 32u; s++) {
            float mv[4], xv[4];
            for (uint i = 0; i < 4u; i++) mv[i] = Ms[(ty + 16u * i) * (L + 1u) + s0 + s];
            for (uint j = 0; j < 4u; j++) xv[j] = Tl[s * 64u + tx + 16u * j];
            for (uint i = 0; i < 4u; i++)
                for (uint j = 0; j < 4u; j++) y[i][j] += mv[i] * xv[j];
        }
    }
    float dh = pc.has_d != 0u ? LOADF(DD, pc.td, pc.oD + h) : 0.0;
    for (uint i = 0; i < 4u; i++)
        for (uint j = 0; j < 4u; j++) {
            uint t = ty + 16u * i, p = p0 + tx + 16u * j;
            if (t >= len || p >= pc.P) continue;
            uint o = (tc + t) * HP + h * pc.P + p;
            Y[pc.od + o] = floatBitsToUint(y[i][j] + dh * uintBitsToFloat(X[pc.oa + o]));
        }
}
#endif
