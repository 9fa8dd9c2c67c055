#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_shuffle : require
// Decode attention for one query row over the codes, without decoding them (spec 7.2): a
// workgroup a K/V head and chunk of rows, for the G query heads that read that K/V head,
// HG of them at a time (at most HGMAX, 8 or 4 by the build, and HG x head size within
// QCAP: heads of 512 take 4). Computes what tq_attend_item in tq_kernels.h computes (in
// another order of sums):
// - the queries are rotated once (qR = R q and, for tq3 keys, qP = P q) into shared
//   memory, padded 4 floats after every 32 so that the four lanes of a row, reading the
//   same element of four different slices, hit different banks;
// - a tile is TR = 128 rows; four lanes a row and two rows a lane, each lane taking slices
//   of 32 values (3 or 4 whole words of codes, one word of signs; both rows' words loaded
//   before either is used) and scoring them against every head's qR and qP: a code is
//   turned into its centroid once for all heads. The lanes' sums meet through subgroup
//   shuffles, the tile's maximum through subgroupMax and shared memory;
// - the weights (online softmax, a tile at a time) go to shared memory and the values are
//   summed in the rotated basis: a thread takes 4 values of the head for all HG heads
//   over every RS-th row of the tile (RS = 256 / (dv / 4)), four rows' words loaded
//   together, so that a code's centroid and a row's norm serve every head; the RS slices
//   are summed and rotated back (R^T) once at the end of the chunk.
// Hot chunks read the f16 ring's rows (position p in row p % hcap) with the plain query.
// Shared memory: 27 KB (HGMAX 8), 24 KB (4).
layout(local_size_x = 256) in;
layout(binding = 0) readonly buffer Q { float q[]; };      // [1, heads, dk]
layout(binding = 1) readonly buffer KS { uint ks[]; };     // keys' store
layout(binding = 2) readonly buffer VS { uint vs[]; };     // values' store
layout(binding = 3) readonly buffer HK { uint hk[]; };     // hot keys, f16 [hcap, kvh, dk]
layout(binding = 4) readonly buffer HV { uint hv[]; };     // hot values, f16 [hcap, kvh, dv]
layout(binding = 5) writeonly buffer PT { float part[]; }; // [heads, chunks, dv + 2]
layout(push_constant) uniform PC {
    uint off[8];
    uint items; // kvh x chunks
    uint heads, kvh, dk, dv, bits;
    uint qjl;  // the keys carry QJL signs
    uint c0;   // rows below c0 are in the stores, the rest in the ring
    uint pos;  // rows in all
    uint hcap; // the ring's rows
    uint cap;  // the stores' rows
    float scale, softcap;
    uint chunk; // rows a workgroup
    uint ncc;   // cold chunks
    uint use_qjl;
} pc;

#include "common.glsl"

#ifndef HGMAX
#define HGMAX 8u // heads a pass, at most: registers for the sums (score and values)
#endif
const uint WG = 256u, LPR = 4u; // threads; lanes a row in the score pass
const uint TR = 128u, RSTEP = WG / LPR, RPT = TR / RSTEP; // rows a tile; a lane takes RPT, RSTEP apart
const uint QCAP = 2048u;            // a pass's heads x dk (and x dv), at most
const uint QPAD = QCAP + QCAP / 8u; // with 4 floats of padding after every 32
const uint SWS = HGMAX + 4u;        // a row's weights, padded (the lanes' writes)

shared vec4 sq4[2u * QPAD / 4u]; // qR (or q), then qP; at a chunk's end the values' sums
shared vec4 sw4[TR * SWS / 4u];  // the tile's weights [row][head]
shared float sred[64u * HGMAX];  // per subgroup maxima and sums (subgroups of 4 or more)
shared float sm[HGMAX], sal[HGMAX], sl[HGMAX];
shared float scbk[16], scbv[16];

#define SQ(i) sq4[(i) >> 2][(i)&3u]

// element e of head h in a query array (the padded layout)
uint qat(uint h, uint e, uint dkp) { return h * dkp + e + (e >> 5) * 4u; }

// One cold slice of 32 key values for every head of the pass: the centroids and signs of
// its codes (words w, signs sg) against qR and qP. Built for each code width B (a macro, so
// that the words and shifts are constants).
#define COLD_SLICE(NAME, B)                                                                   \
    void NAME(uint w[5], uint sg, uint qa, uint nh, uint dkp, bool useq, inout float a[HGMAX], \
              inout float z[HGMAX]) {                                                         \
        [[unroll]] for (uint j4 = 0u; j4 < 8u; j4++) {                                        \
            vec4 cv, zs;                                                                      \
            [[unroll]] for (uint u = 0u; u < 4u; u++) {                                       \
                uint j = j4 * 4u + u, wi = (B * j) >> 5;                                      \
                cv[u] = scbk[tq_code_at(w[wi], w[wi + 1u], B, j)];                            \
                zs[u] = ((sg >> j) & 1u) != 0u ? 1.0 : -1.0;                                  \
            }                                                                                 \
            [[unroll]] for (uint h = 0u; h < HGMAX; h++) {                                    \
                if (h >= nh) break;                                                           \
                uint at = qat(h, 0u, dkp) + qa + j4 * 4u;                                     \
                a[h] += dot(sq4[at >> 2], cv);                                                \
                if (useq) z[h] += dot(sq4[(QPAD + at) >> 2], zs);                             \
            }                                                                                 \
        }                                                                                     \
    }
COLD_SLICE(cold_slice3, 3u)
COLD_SLICE(cold_slice4, 4u)

// One hot slice of 32 key values (16 words of halves) against every head's q
void hot_slice(uint w[16], uint qa, uint nh, uint dkp, inout float a[HGMAX]) {
    [[unroll]] for (uint j4 = 0u; j4 < 8u; j4++) {
        vec4 kv = vec4(unpackHalf2x16(w[2u * j4]), unpackHalf2x16(w[2u * j4 + 1u]));
        [[unroll]] for (uint h = 0u; h < HGMAX; h++) {
            if (h >= nh) break;
            a[h] += dot(sq4[(qat(h, 0u, dkp) + qa + j4 * 4u) >> 2], kv);
        }
    }
}

void main() {
    uint item = gl_WorkGroupID.x + gl_NumWorkGroups.x * gl_WorkGroupID.y;
    if (item >= pc.items) return;
    uint t = gl_LocalInvocationID.x;
    uint dk = pc.dk, dv = pc.dv, bits = pc.bits, G = pc.heads / pc.kvh, cap = pc.cap;
    uint nch = pc.ncc + (pc.pos - pc.c0 + pc.chunk - 1u) / pc.chunk;
    uint g = item / nch, ch = item % nch;
    bool cold = ch < pc.ncc;
    uint first = cold ? ch * pc.chunk : pc.c0 + (ch - pc.ncc) * pc.chunk;
    uint last = min(first + pc.chunk, cold ? pc.c0 : pc.pos);
    uint mk = max(tq_block(dk), 64u), mv = max(tq_block(dv), 64u);
    uint nbk = dk / mk, nbv = dv / mv;
    uint cwk = bits * mk / 32u, swk = pc.qjl != 0u ? mk / 32u : 0u, cwv = bits * mv / 32u;
    bool useq = cold && pc.qjl != 0u && pc.use_qjl != 0u;
    uint HG = min(min(G, HGMAX), QCAP / max(dk, dv)), dkp = dk + dk / 8u;
    if (t < 16u) {
        scbk[t] = tq_cb(mk, bits, t);
        scbv[t] = tq_cb(mv, bits, t);
    }
    // the score pass: lanes lq of row rr, by subgroup so that a row's lanes share one
    uint lt = gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID;
    uint rr = lt / LPR, lq = lt % LPR;
    // the value pass: values ve..ve+3 (block vb, at veb in it) of rows rs, rs + RS, ...
    // (threads past RS * dv / 4, where dv / 4 does not divide 256, take none)
    uint neg = dv / 4u, RS = WG / neg, eg = t % neg, rs = t / neg;
    uint ve = eg * 4u, vb = ve / mv, veb = ve % mv, vend = rs < RS ? TR : 0u;

    for (uint h0 = 0u; h0 < G; h0 += HG) {
        uint nh = min(HG, G - h0);
        // the pass's queries: cold ones into R q (D2 Hn D1 q) and P q (D4 Hn D3 q)
        for (uint i = t; i < nh * dk; i += WG) {
            uint h = i / dk, e = i % dk, at = qat(h, e, dkp);
            float v = q[pc.off[0] + (g * G + h0 + h) * dk + e];
            SQ(at) = cold ? v * tq_sign(mk, 0u, e % mk) : v;
            if (useq) SQ(QPAD + at) = v * tq_sign(mk, 2u, e % mk);
        }
        if (t < HGMAX) sm[t] = -1.0 / 0.0;
        barrier();
        if (cold) {
            uint half_ = nh * dk / 2u, arrays = useq ? 2u : 1u;
            for (uint hh = 1u; hh < mk; hh <<= 1) {
                for (uint k = t; k < arrays * half_; k += WG) {
                    uint arr = k / half_, kk = k % half_;
                    uint j = (kk / hh) * 2u * hh + kk % hh; // pairs inside blocks of mk
                    uint a0 = arr * QPAD + qat(j / dk, j % dk, dkp);
                    uint a1 = arr * QPAD + qat((j + hh) / dk, (j + hh) % dk, dkp);
                    float x = SQ(a0), y = SQ(a1);
                    SQ(a0) = x + y;
                    SQ(a1) = x - y;
                }
                barrier();
            }
            float rs_ = tq_rs(mk);
            for (uint i = t; i < arrays * nh * dk; i += WG) {
                uint arr = i / (nh * dk), j = i % (nh * dk), at = arr * QPAD + qat(j / dk, j % dk, dkp);
                SQ(at) = SQ(at) * rs_ * tq_sign(mk, arr == 0u ? 1u : 3u, j % dk % mk);
            }
            barrier();
        }

        float acc[4u * HGMAX];
        [[unroll]] for (uint i = 0u; i < 4u * HGMAX; i++) acc[i] = 0.0;
        float lsum[HGMAX / 4u];
        [[unroll]] for (uint i = 0u; i < HGMAX / 4u; i++) lsum[i] = 0.0;

        for (uint r0 = first; r0 < last; r0 += TR) {
            // scores of rows r0 + rr + RSTEP k (k < RPT), every head of the pass; each slice's
            // words for all of them are loaded before any is used
            float s[RPT * HGMAX];
            [[unroll]] for (uint i = 0u; i < RPT * HGMAX; i++) s[i] = 0.0;
            for (uint sl_ = lq; sl_ * 32u < dk; sl_ += LPR) {
                uint e0 = sl_ * 32u, b = e0 / mk, eb = e0 % mk, qa = e0 + (e0 >> 5) * 4u;
                if (cold) {
                    uint base = pc.off[1] + (g * nbk + b) * cap * (cwk + swk + 1u);
                    uint w[RPT][5], sg[RPT], nw[RPT];
                    [[unroll]] for (uint k = 0u; k < RPT; k++) {
                        uint row = min(r0 + rr + RSTEP * k, last - 1u); // (past the end: scored, then masked)
                        uint cwd = base + row * cwk + eb * bits / 32u;
                        [[unroll]] for (uint i = 0u; i < 4u; i++) w[k][i] = i < bits ? ks[cwd + i] : 0u;
                        w[k][4] = 0u;
                        sg[k] = useq ? ks[base + cap * cwk + row * swk + eb / 32u] : 0u;
                        nw[k] = ks[base + cap * (cwk + swk) + row];
                    }
                    [[unroll]] for (uint k = 0u; k < RPT; k++) {
                        float a[HGMAX], z[HGMAX];
                        [[unroll]] for (uint h = 0u; h < HGMAX; h++) a[h] = z[h] = 0.0;
                        if (bits == 3u)
                            cold_slice3(w[k], sg[k], qa, nh, dkp, useq, a, z);
                        else
                            cold_slice4(w[k], sg[k], qa, nh, dkp, useq, a, z);
                        float n = tq_float(nw[k] & 0xffffu);
                        float gk = useq ? tq_float(nw[k] >> 16) * tq_kappa(mk) : 0.0;
                        [[unroll]] for (uint h = 0u; h < HGMAX; h++) s[k * HGMAX + h] += n * (a[h] + gk * z[h]);
                    }
                } else {
                    uint w[RPT][16];
                    [[unroll]] for (uint k = 0u; k < RPT; k++) {
                        uint row = min(r0 + rr + RSTEP * k, last - 1u);
                        uint hb = pc.off[3] + (row % pc.hcap * pc.kvh + g) * dk + e0;
                        [[unroll]] for (uint i = 0u; i < 16u; i++)
                            w[k][i] = (hb & 1u) == 0u ? hk[(hb >> 1) + i] // aligned: whole words
                                                      : TQ_LOAD16(hk, hb + 2u * i) | TQ_LOAD16(hk, hb + 2u * i + 1u) << 16;
                    }
                    [[unroll]] for (uint k = 0u; k < RPT; k++) {
                        float a[HGMAX];
                        [[unroll]] for (uint h = 0u; h < HGMAX; h++) a[h] = 0.0;
                        hot_slice(w[k], qa, nh, dkp, a);
                        [[unroll]] for (uint h = 0u; h < HGMAX; h++) s[k * HGMAX + h] += a[h];
                    }
                }
            }
            // each row's four lanes sum their slices; then scale, soft-cap, the tile's max
            [[unroll]] for (uint h = 0u; h < HGMAX; h++) {
                if (h >= nh) break;
                float mx = -1.0 / 0.0;
                [[unroll]] for (uint k = 0u; k < RPT; k++) {
                    float v = s[k * HGMAX + h];
                    v += subgroupShuffleXor(v, 1u);
                    v += subgroupShuffleXor(v, 2u);
                    v *= pc.scale;
                    if (pc.softcap > 0.0) v = pc.softcap * tanh(v / pc.softcap);
                    v = r0 + rr + RSTEP * k < last ? v : -1.0 / 0.0;
                    s[k * HGMAX + h] = v;
                    mx = max(mx, v);
                }
                mx = subgroupMax(mx);
                if (subgroupElect()) sred[gl_SubgroupID * HGMAX + h] = mx;
            }
            barrier();
            if (t < nh) {
                float mt = -1.0 / 0.0, mo = sm[t];
                for (uint k = 0u; k < gl_NumSubgroups; k++) mt = max(mt, sred[k * HGMAX + t]);
                float mn = max(mo, mt);
                sal[t] = mo == -1.0 / 0.0 ? 0.0 : exp(mo - mn); // what the sums so far are worth
                sm[t] = mn;
            }
            barrier();
            // weights: lane lq writes heads lq, lq + 4, ... and keeps their sums
            [[unroll]] for (uint h = 0u; h < HGMAX; h++) {
                if (h >= nh) break;
                if (h % LPR == lq) {
                    float l = lsum[h / 4u] * sal[h];
                    [[unroll]] for (uint k = 0u; k < RPT; k++) {
                        float w = exp(s[k * HGMAX + h] - sm[h]); // 0 past the end
                        sw4[((rr + RSTEP * k) * SWS + h) >> 2][h & 3u] = w;
                        l += w;
                    }
                    lsum[h / 4u] = l;
                }
            }
            barrier();
            // values, in the rotated basis for cold rows
            [[unroll]] for (uint h = 0u; h < HGMAX; h++) {
                if (h >= nh) break;
                float al = sal[h];
                [[unroll]] for (uint u = 0u; u < 4u; u++) acc[h * 4u + u] *= al;
            }
            for (uint v0 = rs; v0 < vend && r0 + v0 < last; v0 += 4u * RS) {
                vec4 val[4];
                if (cold) { // four rows' words and norms, then their centroids
                    uint base = pc.off[2] + (g * nbv + vb) * (cap * cwv + cap / 2u);
                    uint bit = veb * bits, sh = bit & 31u, lo[4], hi[4], nv[4];
                    [[unroll]] for (uint k = 0u; k < 4u; k++) {
                        uint row = min(r0 + v0 + k * RS, last - 1u), cwd = base + row * cwv + (bit >> 5);
                        lo[k] = vs[cwd];
                        hi[k] = sh + 4u * bits > 32u ? vs[cwd + 1u] : 0u;
                        nv[k] = vs[base + cap * cwv + row / 2u] >> ((row & 1u) * 16u);
                    }
                    uint msk = (1u << bits) - 1u;
                    [[unroll]] for (uint k = 0u; k < 4u; k++) {
                        uint v4 = sh == 0u ? lo[k] : (lo[k] >> sh) | (hi[k] << (32u - sh));
                        val[k] = vec4(scbv[v4 & msk], scbv[(v4 >> bits) & msk], scbv[(v4 >> (2u * bits)) & msk],
                                      scbv[(v4 >> (3u * bits)) & msk]) *
                                 tq_float(nv[k] & 0xffffu);
                    }
                } else {
                    uint w0[4], w1[4];
                    [[unroll]] for (uint k = 0u; k < 4u; k++) {
                        uint row = min(r0 + v0 + k * RS, last - 1u);
                        uint i = pc.off[4] + (row % pc.hcap * pc.kvh + g) * dv + ve;
                        w0[k] = (i & 1u) == 0u ? hv[i >> 1] : TQ_LOAD16(hv, i) | TQ_LOAD16(hv, i + 1u) << 16;
                        w1[k] = (i & 1u) == 0u ? hv[(i >> 1) + 1u] : TQ_LOAD16(hv, i + 2u) | TQ_LOAD16(hv, i + 3u) << 16;
                    }
                    [[unroll]] for (uint k = 0u; k < 4u; k++) val[k] = vec4(unpackHalf2x16(w0[k]), unpackHalf2x16(w1[k]));
                }
                [[unroll]] for (uint k = 0u; k < 4u; k++) {
                    uint vr = v0 + k * RS; // rows past the end have weight 0
                    [[unroll]] for (uint h4 = 0u; h4 < HGMAX; h4 += 4u) {
                        if (h4 >= nh) break;
                        vec4 w = sw4[(vr * SWS + h4) >> 2];
                        [[unroll]] for (uint j = 0u; j < 4u; j++)
                            [[unroll]] for (uint u = 0u; u < 4u; u++) acc[(h4 + j) * 4u + u] += w[j] * val[k][u];
                    }
                }
            }
        }

        // the chunk's sums: l per head; the RS slices' values, one slice at a time, into
        // sq4 (free now), with R^T's first signs (D2) for cold chunks
        [[unroll]] for (uint h = 0u; h < HGMAX; h++) {
            if (h >= nh) break;
            float v = subgroupAdd(h % LPR == lq ? lsum[h / 4u] : 0.0);
            if (subgroupElect()) sred[gl_SubgroupID * HGMAX + h] = v;
        }
        barrier();
        if (t < nh) {
            float l = 0.0;
            for (uint k = 0u; k < gl_NumSubgroups; k++) l += sred[k * HGMAX + t];
            sl[t] = l;
        }
        for (uint k = 0u; k < RS; k++) {
            if (rs == k)
                [[unroll]] for (uint h = 0u; h < HGMAX; h++) {
                    if (h >= nh) break;
                    [[unroll]] for (uint u = 0u; u < 4u; u++) {
                        uint e = ve + u, at = h * dv + e;
                        float v = cold ? acc[h * 4u + u] * tq_sign(mv, 1u, e % mv) : acc[h * 4u + u];
                        SQ(at) = k == 0u ? v : SQ(at) + v;
                    }
                }
            barrier();
        }
        if (cold) { // the rest of R^T: Hn, then D1
            uint half_ = nh * dv / 2u;
            for (uint hh = 1u; hh < mv; hh <<= 1) {
                for (uint k = t; k < half_; k += WG) {
                    uint j = (k / hh) * 2u * hh + k % hh;
                    float x = SQ(j), y = SQ(j + hh);
                    SQ(j) = x + y;
                    SQ(j + hh) = x - y;
                }
                barrier();
            }
        }
        float rs_ = tq_rs(mv);
        for (uint i = t; i < nh * dv; i += WG) {
            uint h = i / dv, e = i % dv;
            float v = cold ? SQ(i) * rs_ * tq_sign(mv, 0u, e % mv) : SQ(i);
            part[pc.off[5] + ((g * G + h0 + h) * nch + ch) * (dv + 2u) + e] = v;
        }
        if (t < nh) {
            uint at = pc.off[5] + ((g * G + h0 + t) * nch + ch) * (dv + 2u) + dv;
            part[at] = sm[t];
            part[at + 1u] = sl[t];
        }
        barrier(); // before the next pass's queries take sq4 and sm
    }
}
