#version 450
#extension GL_GOOGLE_include_directive : require
// LMH_OP_DELTA_RULE's chunked form (the WY/UT form of transformers'
// torch_chunk_gated_delta_rule): the rows in chunks of L. Within a chunk, with cum[t] the
// running sum of g, kb = beta k, and T = I + the strictly lower (kb[i] . k[j])
// exp(cum[i] - cum[j]):
//   U = T^-1 (beta v),  W = T^-1 (kb exp(cum))          (the chunk's WY form)
//   v_new = U - W S,  o = (q exp(cum)) S + Pm v_new,  Pm[t][s] = (q[t] . k[s]) exp(cum[t] - cum[s]), s <= t
//   S = exp(cum[L-1]) S + (k exp(cum[L-1] - cum))^T v_new
// so a long prefill is a pass of small matrices a chunk and a scan over chunks, not over rows.
//   PREP: a workgroup a (chunk, value head): U, W, Qd = q exp(cum), Kd = k exp(cum[L-1] - cum),
//         Pm and exp(cum[L-1]) into the scratch (k k^T and q k^T, and T^-1 U's and W's
//         products, in tiles through shared memory; T^-1 in place by forward substitution);
//   SEQ:  a workgroup a (value head, CB = 16 columns of dv): the chunks in order, its columns
//         of S in shared memory (columns of S are independent), the products in tiles.
// Each thread of the tiled products sums a 4 x 4 block (rows ty + 16 i, columns tx + 16 j),
// or 4 x 1 in SEQ (column tx): tile reads are broadcasts or consecutive words.
// Scratch, per (chunk, head) of the segment, BLK words: U [L][dv], W [L][dk], Qd [L][dk],
// Kd [L][dk], Pm [L][L], then exp(cum[L-1]).
layout(constant_id = 0) const uint WG = 256;
layout(constant_id = 1) const uint SSZ = 2048; // SEQ: dk * CB (dk <= 256: vk_ops.c)
#define CB 16u
layout(local_size_x_id = 0) in;
#include "common.glsl"
#include "unary.glsl"

#define L 64u

#ifdef PREP
BUF(0, SCR)
RBUF(1, Q)
RBUF(2, K)
RBUF(3, V)
RBUF(4, A)
RBUF(5, BB)
RBUF(6, AL)
RBUF(7, DTB)
#else
BUF(0, O)
RBUF(1, SCR)
BUF(8, ST)
#endif

layout(push_constant) uniform PC {
    PC_OFFSETS     // PREP: scratch, q, k, v, a; SEQ: o, scratch
    uint oB, oA, oT, oS; // b, A_log, dt_bias, state
    uint n, t0, nc; // rows of the op, the segment's first row, its chunks
    uint Hk, Hv, dk, dv;
    uint l2;
    float eps, qscale;
    uint has_dtb, ta, tdtb;
    uint blk;     // scratch words a (chunk, head)
    uint cblocks; // SEQ: column blocks a head
} pc;

uint chunk_len(uint c) { return min(L, pc.n - (pc.t0 + c * L)); }

#ifdef PREP
#define KB 16u // columns of k and q a tile
#define KS 17u // its row stride
shared float scum[L], sbeta[L], sfq[L], sfk[L], SA[L * (L + 1u)], Tl[2u * L * KS];

void main() {
    uint gi = group_index(), c = gi / pc.Hv, h = gi - c * pc.Hv, lid = gl_LocalInvocationID.x;
    uint ty = lid / 16u, tx = lid % 16u;
    if (c >= pc.nc) return; // uniform over the workgroup
    uint tc = pc.t0 + c * L, len = chunk_len(c), hk = h / (pc.Hv / pc.Hk);
    uint dk = pc.dk, dv = pc.dv, base = pc.od + (c * pc.Hv + h) * pc.blk;
    uint oU = base, oW = oU + L * dv, oQ = oW + L * dk, oK = oQ + L * dk, oP = oK + L * dk;
    if (lid < L) {
        float g = 0.0, beta = 0.0, fq = 0.0, fk = 0.0;
        if (lid < len) {
            uint th = (tc + lid) * pc.Hv + h, qk = ((tc + lid) * pc.Hk + hk) * dk;
            float dtb = pc.has_dtb != 0u ? LOADF(DTB, pc.tdtb, pc.oT + h) : 0.0;
            g = -exp(LOADF(AL, pc.ta, pc.oA + h)) * softplus_f(uintBitsToFloat(A[pc.oe + th]) + dtb);
            beta = sigmoid_f(uintBitsToFloat(BB[pc.oB + th]));
            fq = pc.qscale;
            fk = 1.0;
            if (pc.l2 != 0u) {
                float ssq = 0.0, ssk = 0.0;
                for (uint i = 0; i < dk; i++) {
                    float q = uintBitsToFloat(Q[pc.oa + qk + i]), k = uintBitsToFloat(K[pc.ob + qk + i]);
                    ssq += q * q;
                    ssk += k * k;
                }
                fq = pc.qscale / sqrt(ssq + pc.eps);
                fk = 1.0 / sqrt(ssk + pc.eps);
            }
        }
        scum[lid] = g;
        sbeta[lid] = beta;
        sfq[lid] = fq;
        sfk[lid] = fk;
    }
    barrier();
    if (lid == 0u)
        for (uint t = 1; t < L; t++) scum[t] += scum[t - 1]; // g = 0 past the rows: cum stays
    // k k^T and q k^T over dk, KB columns at a time: k's rows in Tl[0], q's in Tl[1]
    float kk[4][4], qk[4][4];
    for (uint a = 0; a < 4u; a++)
        for (uint b = 0; b < 4u; b++) kk[a][b] = qk[a][b] = 0.0;
    for (uint k0 = 0; k0 < dk; k0 += KB) {
        barrier();
        for (uint e = lid; e < L * KB; e += WG) {
            uint r = e / KB, k = e % KB, x = k0 + k, row = ((tc + r) * pc.Hk + hk) * dk + x;
            bool in_ = r < len && x < dk;
            Tl[r * KS + k] = in_ ? uintBitsToFloat(K[pc.ob + row]) : 0.0;
            Tl[L * KS + r * KS + k] = in_ ? uintBitsToFloat(Q[pc.oa + row]) : 0.0;
        }
        barrier();
        for (uint k = 0; k < KB; k++) {
            float ki[4], qi[4], kj[4];
            for (uint a = 0; a < 4u; a++) {
                ki[a] = Tl[(ty + 16u * a) * KS + k];
                qi[a] = Tl[L * KS + (ty + 16u * a) * KS + k];
                kj[a] = Tl[(tx + 16u * a) * KS + k];
            }
            for (uint a = 0; a < 4u; a++)
                for (uint b = 0; b < 4u; b++) {
                    kk[a][b] += ki[a] * kj[b];
                    qk[a][b] += qi[a] * kj[b];
                }
        }
    }
    // T's strictly lower part (SA) and Pm
    for (uint a = 0; a < 4u; a++)
        for (uint b = 0; b < 4u; b++) {
            uint i = ty + 16u * a, j = tx + 16u * b;
            float dec = i < len && j <= i ? exp(scum[i] - scum[j]) : 0.0;
            SA[i * (L + 1u) + j] = j < i ? sbeta[i] * (kk[a][b] * sfk[i] * sfk[j] * dec) : 0.0;
            SCR[oP + i * L + j] = floatBitsToUint(qk[a][b] * sfq[i] * sfk[j] * dec);
        }
    barrier();
    // T^-1 in place, row by row (row i's own values read before any is written): with
    // A = T - I, T^-1[i][c] = -A[i][c] - sum_{c < j < i} A[i][j] T^-1[j][c]
    for (uint i = 1; i < len; i++) {
        float v = 0.0;
        if (lid < i) {
            v = -SA[i * (L + 1u) + lid];
            for (uint j = lid + 1u; j < i; j++) v -= SA[i * (L + 1u) + j] * SA[j * (L + 1u) + lid];
        }
        barrier();
        if (lid < i) SA[i * (L + 1u) + lid] = v;
        barrier();
    }
    if (lid < L) SA[lid * (L + 1u) + lid] = 1.0;
    // U = T^-1 (beta v) and W = T^-1 (beta exp(cum) k): 64 of their dv + dk columns at a
    // time, x's rows 32 at a time in Tl
    for (uint c0 = 0; c0 < dv + dk; c0 += 64u) {
        float acc[4][4];
        for (uint a = 0; a < 4u; a++)
            for (uint b = 0; b < 4u; b++) acc[a][b] = 0.0;
        for (uint j0 = 0; j0 < len; j0 += 32u) {
            barrier();
            for (uint e = lid; e < 32u * 64u; e += WG) {
                uint j = j0 + e / 64u, col = c0 + e % 64u;
                float x = 0.0;
                if (j < len && col < dv + dk)
                    x = col < dv ? sbeta[j] * uintBitsToFloat(V[pc.oc + ((tc + j) * pc.Hv + h) * dv + col])
                                 : sbeta[j] * exp(scum[j]) * sfk[j] *
                                       uintBitsToFloat(K[pc.ob + ((tc + j) * pc.Hk + hk) * dk + col - dv]);
                Tl[e] = x;
            }
            barrier();
            for (uint jr = 0; jr < 32u; jr++) {
                float tv[4], xv[4];
                for (uint a = 0; a < 4u; a++) tv[a] = SA[(ty + 16u * a) * (L + 1u) + j0 + jr];
                for (uint b = 0; b < 4u; b++) xv[b] = Tl[jr * 64u + tx + 16u * b];
                for (uint a = 0; a < 4u; a++)
                    for (uint b = 0; b < 4u; b++) acc[a][b] += tv[a] * xv[b];
            }
        }
        for (uint a = 0; a < 4u; a++)
            for (uint b = 0; b < 4u; b++) {
                uint i = ty + 16u * a, col = c0 + tx + 16u * b;
                if (col >= dv + dk) continue;
                float v = i < len ? acc[a][b] : 0.0;
                SCR[col < dv ? oU + i * dv + col : oW + i * dk + col - dv] = floatBitsToUint(v);
            }
    }
    float last = scum[L - 1u];
    for (uint e = lid; e < L * dk; e += WG) {
        uint t = e / dk, x = e - t * dk;
        float qd = 0.0, kd = 0.0;
        if (t < len) {
            uint r = ((tc + t) * pc.Hk + hk) * dk + x;
            qd = uintBitsToFloat(Q[pc.oa + r]) * sfq[t] * exp(scum[t]);
            kd = uintBitsToFloat(K[pc.ob + r]) * sfk[t] * exp(last - scum[t]);
        }
        SCR[oQ + e] = floatBitsToUint(qd);
        SCR[oK + e] = floatBitsToUint(kd);
    }
    if (lid == 0u) SCR[oP + L * L] = floatBitsToUint(exp(last));
}

#else // SEQ
shared float Ss[SSZ], Vn[L * CB], Tl[2u * L * 17u];

void main() {
    uint gi = group_index(), h = gi / pc.cblocks, jb = gi - h * pc.cblocks;
    uint lid = gl_LocalInvocationID.x, ty = lid / 16u, tx = lid % 16u;
    if (h >= pc.Hv) return; // uniform over the workgroup
    uint dk = pc.dk, dv = pc.dv, j0 = jb * CB, cbw = min(CB, dv - j0);
    for (uint e = lid; e < dk * CB; e += WG) {
        uint i = e / CB, jj = e - i * CB;
        Ss[e] = jj < cbw ? uintBitsToFloat(ST[pc.oS + (h * dk + i) * dv + j0 + jj]) : 0.0;
    }
    for (uint c = 0; c < pc.nc; c++) {
        uint tc = pc.t0 + c * L, len = chunk_len(c), base = pc.oa + (c * pc.Hv + h) * pc.blk;
        uint oU = base, oW = oU + L * dv, oQ = oW + L * dk, oK = oQ + L * dk, oP = oK + L * dk;
        // W S and Qd S over dk, 16 columns at a time: W's rows in Tl[0], Qd's in Tl[1]
        float va[4], oa[4];
        for (uint a = 0; a < 4u; a++) va[a] = oa[a] = 0.0;
        for (uint k0 = 0; k0 < dk; k0 += 16u) {
            barrier();
            for (uint e = lid; e < L * 16u; e += WG) {
                uint r = e / 16u, k = e % 16u;
                bool in_ = k0 + k < dk;
                Tl[r * 17u + k] = in_ ? uintBitsToFloat(SCR[oW + r * dk + k0 + k]) : 0.0;
                Tl[L * 17u + r * 17u + k] = in_ ? uintBitsToFloat(SCR[oQ + r * dk + k0 + k]) : 0.0;
            }
            barrier();
            for (uint k = 0; k < 16u && k0 + k < dk; k++) {
                float sv = Ss[(k0 + k) * CB + tx];
                for (uint a = 0; a < 4u; a++) {
                    va[a] += Tl[(ty + 16u * a) * 17u + k] * sv;
                    oa[a] += Tl[L * 17u + (ty + 16u * a) * 17u + k] * sv;
                }
            }
        }
        // v_new = U - W S
        for (uint a = 0; a < 4u; a++) {
            uint t = ty + 16u * a;
            Vn[t * CB + tx] = t < len && tx < cbw
                                  ? uintBitsToFloat(SCR[oU + t * dv + j0 + tx]) - va[a]
                                  : 0.0;
        }
        // o = Qd S + Pm v_new, Pm's columns 32 at a time
        for (uint s0 = 0; s0 < len; s0 += 32u) {
            barrier();
            for (uint e = lid; e < L * 32u; e += WG) {
                uint r = e / 32u, k = e % 32u;
                Tl[r * 33u + k] = uintBitsToFloat(SCR[oP + r * L + s0 + k]);
            }
            barrier();
            for (uint k = 0; k < 32u; k++) {
                float vn = Vn[(s0 + k) * CB + tx];
                for (uint a = 0; a < 4u; a++) oa[a] += Tl[(ty + 16u * a) * 33u + k] * vn;
            }
        }
        for (uint a = 0; a < 4u; a++) {
            uint t = ty + 16u * a;
            if (t < len && tx < cbw)
                O[pc.od + ((tc + t) * pc.Hv + h) * dv + j0 + tx] = floatBitsToUint(oa[a]);
        }
        // S = exp(cum[L-1]) S + Kd^T v_new: S's rows 64 at a time, Kd's rows 32 at a time
        float el = uintBitsToFloat(SCR[oP + L * L]);
        for (uint ib = 0; ib < dk; ib += 64u) {
            float sa[4];
            for (uint a = 0; a < 4u; a++) {
                uint i = ib + ty + 16u * a;
                sa[a] = i < dk ? Ss[i * CB + tx] * el : 0.0;
            }
            for (uint t0 = 0; t0 < len; t0 += 32u) {
                barrier();
                for (uint e = lid; e < 32u * 64u; e += WG) {
                    uint tr = e / 64u, ii = e % 64u;
                    Tl[tr * 65u + ii] = t0 + tr < len && ib + ii < dk
                                            ? uintBitsToFloat(SCR[oK + (t0 + tr) * dk + ib + ii])
                                            : 0.0;
                }
                barrier();
                for (uint tr = 0; tr < 32u; tr++) {
                    float vn = Vn[(t0 + tr) * CB + tx];
                    for (uint a = 0; a < 4u; a++) sa[a] += Tl[tr * 65u + ty + 16u * a] * vn;
                }
            }
            for (uint a = 0; a < 4u; a++) {
                uint i = ib + ty + 16u * a;
                if (i < dk) Ss[i * CB + tx] = sa[a];
            }
        }
    }
    for (uint e = lid; e < dk * CB; e += WG) {
        uint i = e / CB, jj = e - i * CB;
        if (jj < cbw) ST[pc.oS + (h * dk + i) * dv + j0 + jj] = floatBitsToUint(Ss[e]);
    }
}
#endif
