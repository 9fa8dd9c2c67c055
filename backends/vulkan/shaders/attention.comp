#version 450
#extension GL_GOOGLE_include_directive : require
// Attention with grouped K/V heads, tiled with an online softmax (flash-attention
// style). A workgroup takes BQ queries that share K/V head gl_WorkGroupID.y ((row, head)
// pairs, consecutive heads of a group first) and walks the keys of its split
// (gl_WorkGroupID.z) WG at a time: each thread scores one key against all BQ queries,
// the tile's softmax is folded into running max/sum, and each thread accumulates DPT
// output dimensions of all BQ queries. With one split the result goes to dst; with
// several (split-K, for decoding over long caches) each split writes (max, sum, acc[dv])
// to binding 5, and the last of a block's splits to finish merges them into dst (it
// learns it is last from a counter per block in binding 6, which it sets back to 0): no
// dispatch of its own, so no step more in decode's chain. Visibility follows ops.h: keys in
// order from position kv0, or a ring of `ring` rows holding the last positions before
// `total`; causal, optional window; optional soft-cap.
layout(constant_id = 0) const uint WG = 128; // keys per tile; a power of two
layout(constant_id = 1) const uint KDT = 0;
layout(constant_id = 2) const uint VDT = 0;
layout(constant_id = 3) const uint BQ = 4;   // queries per workgroup; divides WG
layout(constant_id = 4) const uint QD = 128; // head dim of q and k
layout(constant_id = 5) const uint DPT = 1;  // ceil(dv / WG)
layout(constant_id = 6) const uint KVEC = 0; // 16-byte loads of K rows are aligned
// Loads issued together: KU 16-byte chunks of a K row (divides QD / chunk) and VU V rows.
// A GPU hides memory latency with them; lavapipe gets 1 and 1, as its LLVM takes minutes
// over the unrolled code (the coroutines it makes of barriers grow with it).
layout(constant_id = 7) const uint KU = 1;
layout(constant_id = 8) const uint VU = 1;
layout(local_size_x_id = 0) in;
#include "common.glsl"

BUF(0, D)
RBUF(1, Q)
RBUF(2, K)
RBUF4(2, K)
RBUF(3, V)
RBUF(4, POS)

const float MASKED = -3.0e38;

// the block's queries, in vec4s: a 16-byte chunk of K takes one load of each query's (as
// floats the compiler loaded them one by one: 6.28 against 4.69 ms a layer at 4K keys on
// an H100)
shared vec4 qs4[(BQ * QD + 3u) / 4u];
// a tile's scores, then probabilities: key-major, a key's BQ queries in Q4 vec4s and the
// row padded to an odd count of them, so that the products with V read a key's queries in
// Q4 broadcast loads (query-major, they took BQ loads for BQ multiply-adds) and a thread
// writes its key's row without bank conflicts
const uint Q4 = (BQ + 3u) / 4u, SQ4 = Q4 | 1u;
shared vec4 ss4[WG * SQ4];
shared float red[WG];
shared float m_s[BQ], l_s[BQ], alpha_s[BQ];
shared int pq_s[BQ];
// after the kernel's own shared arrays (its last_s was last before too)
#include "attn_split.glsl"

void main() {
    uint l = gl_LocalInvocationID.x, g = gl_WorkGroupID.y, z = gl_WorkGroupID.z;
    uint q0 = gl_WorkGroupID.x * BQ;
    const uint R = WG / BQ; // threads per query in the tile reductions

    for (uint i = l; i < BQ * QD; i += WG) {
        uint qq = i / QD, c = i - qq * QD, qi = q0 + qq;
        float v = 0.0;
        if (qi < pc.nq) {
            uint r = qi / pc.group, h = g * pc.group + (qi - r * pc.group);
            v = uintBitsToFloat(Q[pc.oa + (r * pc.heads + h) * QD + c]);
        }
        qs4[i / 4u][i % 4u] = v;
    }
    if (l < BQ) {
        uint qi = q0 + l;
        pq_s[l] = qi < pc.nq ? int(POS[pc.oe + qi / pc.group]) : 0;
        m_s[l] = MASKED;
        l_s[l] = 0.0;
    }
    barrier();

    // this split's keys, narrowed to what some query of the block can see
    int ks = int(z) * pc.chunk, ke = min(pc.n_kv, ks + pc.chunk);
    if (pc.ring == 0) { // a ring's keys are not in order
        int pmin = 0x7fffffff, pmax = -0x7fffffff;
        for (uint q = 0; q < BQ; q++)
            if (q0 + q < pc.nq) {
                pmin = min(pmin, pq_s[q]);
                pmax = max(pmax, pq_s[q]);
            }
        narrow(pmin, pmax, ks, ke);
    }

    float acc[BQ * DPT];
    [[unroll]] for (uint i = 0; i < BQ * DPT; i++) acc[i] = 0.0;

    for (int t0 = ks; t0 < ke; t0 += int(WG)) {
        int key = t0 + int(l);
        float s[BQ];
        [[unroll]] for (uint q = 0; q < BQ; q++) s[q] = MASKED;
        if (key < ke) {
            int pk = key_pos(key);
            float dsum[BQ];
            [[unroll]] for (uint q = 0; q < BQ; q++) dsum[q] = 0.0;
            uint kb = pc.ob + (uint(key) * pc.kvh + g) * QD;
            if (KVEC != 0u) {
                const uint CH = KDT == DT_F32 ? 4u : 8u;
                for (uint c0 = 0; c0 < QD / CH; c0 += KU) [[unroll]] for (uint u = 0; u < KU; u++) {
                    uint c = c0 + u;
                    vec4 wa, wb;
                    unpack_word(K4[kb / CH + c], KDT, wa, wb);
                    [[unroll]] for (uint q = 0; q < BQ; q++) {
                        uint qb = (q * QD + c * CH) / 4u;
                        dsum[q] += dot(wa, qs4[qb]);
                        if (CH == 8u) dsum[q] += dot(wb, qs4[qb + 1u]);
                    }
                }
            } else {
                for (uint c = 0; c < QD; c++) {
                    float kv = LOADF(K, KDT, kb + c);
                    [[unroll]] for (uint q = 0; q < BQ; q++) {
                        uint i = q * QD + c;
                        dsum[q] += kv * qs4[i / 4u][i % 4u];
                    }
                }
            }
            [[unroll]] for (uint q = 0; q < BQ; q++) {
                int pq = pq_s[q];
                if (q0 + q < pc.nq && visible(pk, pq)) {
                    float v = dsum[q] * pc.scale;
                    if (pc.cap > 0.0) v = pc.cap * tanh_safe(v / pc.cap);
                    s[q] = v;
                }
            }
        }
        [[unroll]] for (uint q = 0; q < BQ; q++) ss4[l * SQ4 + q / 4u][q % 4u] = s[q];
        barrier();

        // the tile's max per query, folded into the running max (a warp's threads read
        // neighbouring queries of a key)
        uint qr = l % BQ, part = l / BQ, qv = qr / 4u, qc = qr % 4u;
        float mx = MASKED;
        for (uint k = part; k < WG; k += R) mx = max(mx, ss4[k * SQ4 + qv][qc]);
        red[l] = mx;
        barrier();
        if (l < BQ) {
            float m = m_s[l];
            for (uint i = 0; i < R; i++) m = max(m, red[i * BQ + l]);
            alpha_s[l] = m_s[l] <= -1.0e38 ? (m <= -1.0e38 ? 1.0 : 0.0) : exp(m_s[l] - m);
            m_s[l] = m;
        }
        barrier();

        // probabilities against the running max, and their sum
        float m = m_s[qr], sum = 0.0;
        for (uint k = part; k < WG; k += R) {
            float sv = ss4[k * SQ4 + qv][qc];
            float p = sv <= -1.0e38 ? 0.0 : exp(sv - m);
            ss4[k * SQ4 + qv][qc] = p;
            sum += p;
        }
        red[l] = sum;
        barrier();
        if (l < BQ) {
            float t = 0.0;
            for (uint i = 0; i < R; i++) t += red[i * BQ + l];
            l_s[l] = l_s[l] * alpha_s[l] + t;
        }

        [[unroll]] for (uint q = 0; q < BQ; q++)
            [[unroll]] for (uint j = 0; j < DPT; j++) acc[q * DPT + j] *= alpha_s[q];
        // V rows VU at a time, their loads issued before the first is used: one key at a
        // time made this loop a chain of WG memory latencies on a GPU (most of a decode
        // step's attention time).
        int nk = min(int(WG), ke - t0), k = 0;
        for (; k + int(VU) <= nk; k += int(VU)) {
            float vv[VU * DPT];
            [[unroll]] for (int u = 0; u < int(VU); u++) {
                uint vb = pc.oc + (uint(t0 + k + u) * pc.kvh + g) * pc.dv;
                [[unroll]] for (uint j = 0; j < DPT; j++) {
                    uint dim = l + j * WG;
                    vv[u * DPT + j] = dim < pc.dv ? LOADF(V, VDT, vb + dim) : 0.0;
                }
            }
            [[unroll]] for (int u = 0; u < int(VU); u++) {
                vec4 p[Q4];
                [[unroll]] for (uint i = 0; i < Q4; i++) p[i] = ss4[uint(k + u) * SQ4 + i];
                [[unroll]] for (uint j = 0; j < DPT; j++)
                    [[unroll]] for (uint q = 0; q < BQ; q++)
                        acc[q * DPT + j] += p[q / 4u][q % 4u] * vv[u * DPT + j];
            }
        }
        for (; k < nk; k++) {
            uint vb = pc.oc + (uint(t0 + k) * pc.kvh + g) * pc.dv;
            [[unroll]] for (uint j = 0; j < DPT; j++) {
                uint dim = l + j * WG;
                if (dim < pc.dv) {
                    float vv = LOADF(V, VDT, vb + dim);
                    [[unroll]] for (uint q = 0; q < BQ; q++)
                        acc[q * DPT + j] += ss4[uint(k) * SQ4 + q / 4u][q % 4u] * vv;
                }
            }
        }
        barrier();
    }

    [[unroll]] for (uint q = 0; q < BQ; q++) {
        uint qi = q0 + q;
        if (qi >= pc.nq) break;
        uint row = query_row(qi);
        if (pc.nsplit == 1u) {
            float L = l_s[q];
            if (L > 0.0) L += sink_term(row, m_s[q]);
            [[unroll]] for (uint j = 0; j < DPT; j++) {
                uint dim = l + j * WG;
                if (dim < pc.dv)
                    D[pc.od + row * pc.dv + dim] = floatBitsToUint(L > 0.0 ? acc[q * DPT + j] / L : 0.0);
            }
        } else {
            uint pb = (row * pc.nsplit + z) * (pc.dv + 2u);
            if (l == 0u) {
                P[pb] = floatBitsToUint(m_s[q]);
                P[pb + 1u] = floatBitsToUint(l_s[q]);
            }
            [[unroll]] for (uint j = 0; j < DPT; j++) {
                uint dim = l + j * WG;
                if (dim < pc.dv) P[pb + 2u + dim] = floatBitsToUint(acc[q * DPT + j]);
            }
        }
    }
    if (pc.nsplit == 1u) return;

    if (!last_split()) return;
    // the last split: merge every split's (max, sum, acc) of each query of the block, in
    // one pass with a running max, four splits' loads at a time (this is the tail of the
    // step's critical path)
    for (uint q = 0; q < BQ; q++) {
        uint qi = q0 + q;
        if (qi >= pc.nq) break;
        uint row = query_row(qi);
        uint stride = pc.dv + 2u, base = row * pc.nsplit * stride;
        for (uint dim = l; dim < pc.dv; dim += WG) {
            float M = MASKED, L = 0.0, o = 0.0;
            for (uint s0 = 0; s0 < pc.nsplit; s0 += 4u) {
                float m4[4], l4[4], a4[4];
                [[unroll]] for (uint u = 0; u < 4u; u++) {
                    uint pb = base + min(s0 + u, pc.nsplit - 1u) * stride;
                    m4[u] = s0 + u < pc.nsplit ? uintBitsToFloat(P[pb]) : MASKED;
                    l4[u] = uintBitsToFloat(P[pb + 1u]);
                    a4[u] = uintBitsToFloat(P[pb + 2u + dim]);
                }
                [[unroll]] for (uint u = 0; u < 4u; u++) {
                    if (m4[u] <= -1.0e38) continue; // a split that saw no key
                    float mn = max(M, m4[u]), f = exp(M - mn), w = exp(m4[u] - mn);
                    L = L * f + l4[u] * w;
                    o = o * f + a4[u] * w;
                    M = mn;
                }
            }
            if (L > 0.0) L += sink_term(row, M);
            D[pc.od + row * pc.dv + dim] = floatBitsToUint(L > 0.0 ? o / L : 0.0);
        }
    }
}
