#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
// Attention for a few queries over many keys (decoding), flash-decoding style. A workgroup
// takes BQ queries that share K/V head gl_WorkGroupID.y and the keys of its split
// (gl_WorkGroupID.z). Its threads form key groups of TPK lanes of one subgroup; a key group
// walks its own keys, KU at a time, each lane loading QD / TPK dimensions of the keys' K
// and V rows in 16-byte words (the next KU keys' loads issued before these are used); the
// dot products are summed across the lanes by subgroup shuffles, and each key group keeps
// its own running max/sum/output in registers: no barrier inside the loop (attention.comp
// has four a tile of keys, and one thread a key, which left decode a chain of memory
// latencies). At the end the key groups are merged through shared memory. With one split
// the result goes to dst; with several each split writes (max, sum, acc[QD]) to binding 5
// and the last of a block's splits to finish merges them (counter per block in binding 6,
// set back to 0), as in attention.comp. Needs dv == QD, K and V rows in whole 16-byte
// words and TPK dividing the subgroup; visibility rules as in attention.comp.
// With SEQS (attn_decode_seqs): the decode attention of several sequences in one dispatch,
// gl_WorkGroupID.x the sequence. Each has its own cache tensors, so its tensors are reached
// through device addresses from a table (binding 1, SEQ_WORDS words a sequence, filled by
// vk_ops.c's attn_seqs_dispatch), with its key count, splits, partials and counters. A
// workgroup takes `per` of its sequence's splits one after another (gl_WorkGroupID.z * per
// on; those past the sequence's splits return at once), each computed as its own workgroup
// would compute it, and the counters count workgroups: the results are the same bits.
layout(constant_id = 0) const uint WG = 128;
layout(constant_id = 1) const uint KDT = 0;
layout(constant_id = 2) const uint VDT = 0;
layout(constant_id = 3) const uint BQ = 2;   // queries per workgroup
layout(constant_id = 4) const uint QD = 128; // head dim of q, k and v
layout(constant_id = 5) const uint TPK = 8;  // lanes per key: a power of two
layout(constant_id = 6) const uint KU = 1;   // keys a key group loads together
layout(local_size_x_id = 0) in;
#include "common.glsl"

#ifdef SEQS
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_buffer_reference_uvec2 : require
layout(buffer_reference, std430, buffer_reference_align = 4) buffer Words { uint v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) readonly buffer Words4 { uvec4 v[]; };
RBUF(1, TAB)
const uint SEQ_WORDS = 20u; // SEQ_WORDS in vk_ops.c
// the workgroup's sequence: its tensors (element 0 at the address) and its parameters
Words q_ref, d_ref, pos_ref;
Words4 k_ref, v_ref;
int s_nkv, s_kv0, s_ring, s_total, s_chunk;
uint s_nsplit, s_nwg, s_pbase, s_cnt;
#define Q q_ref.v
#define D d_ref.v
#define POS pos_ref.v
#define K4 k_ref.v
#define V4 v_ref.v
#define S_OA 0u
#define S_OB 0u
#define S_OC 0u
#define S_OD 0u
#define S_OE 0u
#else
BUF(0, D)
RBUF(1, Q)
RBUF4(2, K)
RBUF4(3, V)
RBUF(4, POS)
#define S_OA pc.oa
#define S_OB pc.ob
#define S_OC pc.oc
#define S_OD pc.od
#define S_OE pc.oe
#endif

const float MASKED = -3.0e38;
const uint MAXS = 64; // splits at most (ATTN_DEC_MAXS in vk_ops.c)
const uint STRIDE = QD + 4u; // a split's partials: max, sum, 2 words unused, acc[QD]
const uint KCH = KDT == DT_F32 ? 4u : 8u; // elements in a 16-byte word
const uint VCH = VDT == DT_F32 ? 4u : 8u;
const uint EPT = QD / TPK;                // dimensions a lane holds
const uint KP = WG / TPK;                 // key groups
const uint NKW = QD / (TPK * KCH);        // 16-byte words of a K row a lane loads
const uint NVW = QD / (TPK * VCH);
const uint NO = BQ * QD / 4u;             // the block's outputs in 4s
const uint SP = WG > NO ? WG / NO : 1u;   // threads an output's split merge is spread over

// KU keys' rows from T0 (key groups interleaved), clamped to the split: KW, VW
#define LOAD_KEYS(T0, KW, VW)                                                                   \
    [[unroll]] for (uint u = 0; u < KU; u++) {                                                  \
        uint row = uint(min((T0) + int(u * KP + kg), ke - 1)) * pc.kvh + g;                   \
        uint kb = S_OB / KCH + row * (QD / KCH), vb = S_OC / VCH + row * (QD / VCH);           \
        [[unroll]] for (uint c = 0; c < NKW; c++) KW[u * NKW + c] = K4[kb + c * TPK + t];     \
        [[unroll]] for (uint c = 0; c < NVW; c++) VW[u * NVW + c] = V4[vb + c * TPK + t];     \
    }

shared float cm[KP * BQ], cl[KP * BQ];
shared float cacc[KP * BQ * QD];
shared float wm[BQ * MAXS], wl[BQ * MAXS], wmax[BQ];
shared vec4 red4[WG];
// after the kernel's own shared arrays (its last_s was last before too)
#include "attn_split.glsl"
layout(binding = 5) coherent buffer P4_b { uvec4 P4[]; }; // the partials in 16-byte words

void main() {
    uint lid = gl_LocalInvocationID.x, g = gl_WorkGroupID.y;
#ifdef SEQS
    uint e0 = pc.oa + gl_WorkGroupID.x * SEQ_WORDS; // binding 1 is the table
    s_nsplit = TAB[e0 + 15u];
    uint per = TAB[e0 + 18u], z0 = gl_WorkGroupID.z * per; // splits a workgroup, in turn
    if (z0 >= s_nsplit) return; // the whole workgroup: no barrier is left waiting
    s_nwg = (s_nsplit + per - 1u) / per;
    q_ref = Words(uvec2(TAB[e0], TAB[e0 + 1u]));
    d_ref = Words(uvec2(TAB[e0 + 2u], TAB[e0 + 3u]));
    k_ref = Words4(uvec2(TAB[e0 + 4u], TAB[e0 + 5u]));
    v_ref = Words4(uvec2(TAB[e0 + 6u], TAB[e0 + 7u]));
    pos_ref = Words(uvec2(TAB[e0 + 8u], TAB[e0 + 9u]));
    s_nkv = int(TAB[e0 + 10u]);
    s_kv0 = int(TAB[e0 + 11u]);
    s_ring = int(TAB[e0 + 12u]);
    s_total = int(TAB[e0 + 13u]);
    s_chunk = int(TAB[e0 + 14u]);
    s_pbase = TAB[e0 + 16u];
    s_cnt = TAB[e0 + 17u] + g;
    uint q0 = 0u;
#else
    uint q0 = gl_WorkGroupID.x * BQ, z = gl_WorkGroupID.z;
#endif
    // key group and lane from the subgroup, so the shuffles stay inside a key group
    uint t = gl_SubgroupInvocationID % TPK;
    uint kg = gl_SubgroupID * (gl_SubgroupSize / TPK) + gl_SubgroupInvocationID / TPK;

    // the lane's dimensions: word c * TPK + t of a row, for c < QD / (TPK * CH)
    float qr[BQ * EPT];
    int pq[BQ];
    [[unroll]] for (uint q = 0; q < BQ; q++) {
        uint qi = q0 + q;
        bool ok = qi < pc.nq;
        uint qb = S_OA + (ok ? query_row(qi) : 0u) * QD;
        [[unroll]] for (uint c = 0; c < NKW; c++)
            [[unroll]] for (uint e = 0; e < KCH; e++)
                qr[q * EPT + c * KCH + e] =
                    ok ? uintBitsToFloat(Q[qb + (c * TPK + t) * KCH + e]) : 0.0;
        pq[q] = ok ? int(POS[S_OE + qi / pc.group]) : 0;
    }

#ifdef SEQS
    // each of the workgroup's splits as its own workgroup would compute it
    for (uint z = z0; z < min(z0 + per, s_nsplit); z++) {
        if (z > z0) barrier(); // the last split's key-group merge is done with cm, cl, cacc
#endif
    // this split's keys, narrowed to what some query of the block can see
    int ks = int(z) * S_CHUNK, ke = min(S_NKV, ks + S_CHUNK);
    if (S_RING == 0) { // a ring's keys are not in order
        int pmin = 0x7fffffff, pmax = -0x7fffffff;
        [[unroll]] for (uint q = 0; q < BQ; q++)
            if (q0 + q < pc.nq) {
                pmin = min(pmin, pq[q]);
                pmax = max(pmax, pq[q]);
            }
        narrow(pmin, pmax, ks, ke);
    }

    float m[BQ], l[BQ], acc[BQ * EPT];
    [[unroll]] for (uint q = 0; q < BQ; q++) {
        m[q] = MASKED;
        l[q] = 0.0;
    }
    [[unroll]] for (uint i = 0; i < BQ * EPT; i++) acc[i] = 0.0;

    // The same trip count in every thread: the shuffles need the whole subgroup. The next
    // keys' loads are issued before this step's arithmetic (two steps' rows in registers),
    // so memory is kept busy while the scores are folded in.
    uvec4 kw[KU * NKW], vw[KU * NVW], kn[KU * NKW], vn[KU * NVW];
    if (ks < ke) LOAD_KEYS(ks, kw, vw);
    for (int t0 = ks; t0 < ke; t0 += int(KP * KU)) {
        if (t0 + int(KP * KU) < ke) LOAD_KEYS(t0 + int(KP * KU), kn, vn);
        float p[KU * BQ];
        [[unroll]] for (uint u = 0; u < KU; u++) {
            float dq[BQ];
            [[unroll]] for (uint q = 0; q < BQ; q++) dq[q] = 0.0;
            [[unroll]] for (uint c = 0; c < NKW; c++) {
                vec4 a, b;
                unpack_word(kw[u * NKW + c], KDT, a, b);
                [[unroll]] for (uint q = 0; q < BQ; q++) {
                    uint o = q * EPT + c * KCH;
                    dq[q] += dot(a, vec4(qr[o], qr[o + 1u], qr[o + 2u], qr[o + 3u]));
                    if (KCH == 8u)
                        dq[q] += dot(b, vec4(qr[o + 4u], qr[o + 5u], qr[o + 6u], qr[o + 7u]));
                }
            }
            // every lane of the key group ends with the same sum (the adds commute)
            [[unroll]] for (uint s = 1u; s < TPK; s <<= 1)
                [[unroll]] for (uint q = 0; q < BQ; q++) dq[q] += subgroupShuffleXor(dq[q], s);
            int key = t0 + int(u * KP + kg);
            int pk = key_pos(key);
            [[unroll]] for (uint q = 0; q < BQ; q++) {
                float v = dq[q] * pc.scale;
                if (pc.cap > 0.0) v = pc.cap * tanh_safe(v / pc.cap);
                bool ok = key < ke && q0 + q < pc.nq && visible(pk, pq[q]);
                p[u * BQ + q] = ok ? v : MASKED;
            }
        }
        // fold the KU scores into the running max and sum, then add their V rows
        [[unroll]] for (uint q = 0; q < BQ; q++) {
            float mx = m[q];
            [[unroll]] for (uint u = 0; u < KU; u++) mx = max(mx, p[u * BQ + q]);
            float alpha = m[q] <= -1.0e38 ? 0.0 : exp(m[q] - mx);
            m[q] = mx;
            l[q] *= alpha;
            [[unroll]] for (uint i = 0; i < EPT; i++) acc[q * EPT + i] *= alpha;
            [[unroll]] for (uint u = 0; u < KU; u++) {
                float s = p[u * BQ + q];
                s = s <= -1.0e38 ? 0.0 : exp(s - mx);
                p[u * BQ + q] = s;
                l[q] += s;
            }
        }
        [[unroll]] for (uint u = 0; u < KU; u++)
            [[unroll]] for (uint c = 0; c < NVW; c++) {
                vec4 a, b;
                unpack_word(vw[u * NVW + c], VDT, a, b);
                [[unroll]] for (uint q = 0; q < BQ; q++) {
                    uint o = q * EPT + c * VCH;
                    float s = p[u * BQ + q];
                    [[unroll]] for (uint e = 0; e < 4u; e++) acc[o + e] += s * a[e];
                    if (VCH == 8u) [[unroll]] for (uint e = 0; e < 4u; e++) acc[o + 4u + e] += s * b[e];
                }
            }
        [[unroll]] for (uint i = 0; i < KU * NKW; i++) kw[i] = kn[i];
        [[unroll]] for (uint i = 0; i < KU * NVW; i++) vw[i] = vn[i];
    }

    // merge the key groups
    if (t == 0u)
        [[unroll]] for (uint q = 0; q < BQ; q++) {
            cm[kg * BQ + q] = m[q];
            cl[kg * BQ + q] = l[q];
        }
    [[unroll]] for (uint q = 0; q < BQ; q++)
        [[unroll]] for (uint c = 0; c < NVW; c++)
            [[unroll]] for (uint e = 0; e < VCH; e++)
                cacc[(kg * BQ + q) * QD + (c * TPK + t) * VCH + e] = acc[q * EPT + c * VCH + e];
    barrier();
    for (uint i = lid; i < BQ * QD; i += WG) {
        uint q = i / QD, dim = i - q * QD, qi = q0 + q;
        if (qi >= pc.nq) continue;
        float M = MASKED;
        for (uint k = 0; k < KP; k++) M = max(M, cm[k * BQ + q]);
        float L = 0.0, o = 0.0;
        for (uint k = 0; k < KP; k++) {
            float mk = cm[k * BQ + q];
            if (mk <= -1.0e38) continue; // a key group that saw no key
            float w = exp(mk - M);
            L += cl[k * BQ + q] * w;
            o += cacc[(k * BQ + q) * QD + dim] * w;
        }
        uint row = query_row(qi);
        if (S_NSPLIT == 1u) {
            if (L > 0.0) L += sink_term(row, M);
            D[S_OD + row * QD + dim] = floatBitsToUint(L > 0.0 ? o / L : 0.0);
        } else {
            uint pb = S_PBASE + (row * S_NSPLIT + z) * STRIDE;
            if (dim == 0u) {
                P[pb] = floatBitsToUint(M);
                P[pb + 1u] = floatBitsToUint(L);
            }
            P[pb + 4u + dim] = floatBitsToUint(o);
        }
    }
#ifdef SEQS
    }
#endif
    if (S_NSPLIT == 1u) return;

    if (!last_split()) return;
    // The last split merges: every split's weight exp(max - overall max) first (a thread a
    // split), then each 4 outputs a sum over the splits, spread over SP threads with their
    // 16-byte loads issued together (this is the tail of the step's critical path).
    for (uint i = lid; i < BQ * S_NSPLIT; i += WG) {
        uint q = i / S_NSPLIT, s = i - q * S_NSPLIT, qi = q0 + q;
        uint pb = S_PBASE + ((qi < pc.nq ? query_row(qi) : 0u) * S_NSPLIT + s) * STRIDE;
        wm[q * MAXS + s] = uintBitsToFloat(P[pb]);
        wl[q * MAXS + s] = uintBitsToFloat(P[pb + 1u]);
    }
    barrier();
    float w = 0.0; // BQ * nsplit <= WG (the host caps nsplit)
    if (lid < BQ * S_NSPLIT) {
        uint q = lid / S_NSPLIT, s = lid - q * S_NSPLIT;
        float M = MASKED, ms = wm[q * MAXS + s];
        for (uint k = 0; k < S_NSPLIT; k++) M = max(M, wm[q * MAXS + k]);
        w = ms <= -1.0e38 ? 0.0 : exp(ms - M);
        if (s == 0u) wmax[q] = M; // the sinks' reference
    }
    barrier();
    if (lid < BQ * S_NSPLIT) wm[lid / S_NSPLIT * MAXS + lid % S_NSPLIT] = w;
    barrier();
    for (uint i0 = 0; i0 < NO * SP; i0 += WG) {
        uint i = i0 + lid, ov = i % NO, sp = i / NO, q = ov / (QD / 4u), qi = q0 + q;
        vec4 o = vec4(0.0);
        if (i < NO * SP && qi < pc.nq) {
            uint base = (S_PBASE + query_row(qi) * S_NSPLIT * STRIDE + 4u) / 4u + ov - q * (QD / 4u);
            uint s = sp;
            for (; s + 3u * SP < S_NSPLIT; s += 4u * SP) {
                uvec4 a4[4];
                [[unroll]] for (uint u = 0; u < 4u; u++) a4[u] = P4[base + (s + u * SP) * (STRIDE / 4u)];
                [[unroll]] for (uint u = 0; u < 4u; u++) o += wm[q * MAXS + s + u * SP] * uintBitsToFloat(a4[u]);
            }
            for (; s < S_NSPLIT; s += SP) o += wm[q * MAXS + s] * uintBitsToFloat(P4[base + s * (STRIDE / 4u)]);
        }
        red4[lid] = o;
        barrier();
        if (i < NO && qi < pc.nq) {
            // part 0 gathers the others (SP > 1 only where NO * SP <= WG: one pass, i == lid)
            vec4 r = red4[lid];
            for (uint k = 1; k < SP; k++) r += red4[k * NO + lid];
            float L = 0.0;
            for (uint k = 0; k < S_NSPLIT; k++) L += wm[q * MAXS + k] * wl[q * MAXS + k];
            if (L > 0.0) L += sink_term(query_row(qi), wmax[q]);
            r = L > 0.0 ? r / L : vec4(0.0);
            uint db = S_OD + query_row(qi) * QD + (ov - q * (QD / 4u)) * 4u;
            [[unroll]] for (uint e = 0; e < 4u; e++) D[db + e] = floatBitsToUint(r[e]);
        }
        barrier();
    }
}
