#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_KHR_shader_subgroup_vote : require
#extension GL_KHR_shader_subgroup_arithmetic : require
// Prefill attention on the matrix cores (where matmul_coop runs: the fast precision mode), the
// flash-attention walk of attention.comp with its two products as 16 x 16 x 16 products of
// f16 operands into f32. A workgroup takes BQ queries of K/V head gl_WorkGroupID.y, a
// subgroup 16 of them, and walks the keys BKEY at a time: the K and V tiles go to shared
// memory as f16; each subgroup multiplies its queries (held as matrices from the start) by
// K's tile, takes the scores through shared memory into its rows' running softmax (a lane
// a key), writes the probabilities as f16 and adds their product with V to its output
// matrices. The matrices' elements cannot be scaled by row in place, so the max the
// probabilities are taken against moves only when a tile's passes it by more than TAU
// (then the rows' outputs go through shared memory once to be scaled, and the row maxima
// are reduced over the subgroup); in between the probabilities are up to e^TAU, which f16
// holds with its usual precision. Visibility, positions and the soft-cap as in
// attention.comp; no key splits (the host uses it only where the queries give the device
// enough workgroups). The more queries a workgroup, the more each K/V tile it loads serves:
// the loads are half its time, not hidden behind the products (that would take registers
// the outputs use). On an H100 at 4096 keys, 128 queries: 1.69 ms a layer, against 2.88 for
// 64 and attention.comp's 4.55. Needs dv == QD, QD a multiple of 16 up to 128, q, K and V
// rows on 16 bytes and subgroups of 32 (the host checks).
layout(constant_id = 0) const uint WG = 256; // subgroups of 32, 16 queries each
layout(constant_id = 1) const uint KDT = 0;
layout(constant_id = 2) const uint VDT = 0;
layout(constant_id = 4) const uint QD = 128;
layout(local_size_x_id = 0) in;
#include "common.glsl"
#include "coop.glsl"

BUF(0, D)
RBUF4(1, Q)
RBUF4(2, K)
RBUF4(3, V)
RBUF(4, POS)

const float MASKED = -3.0e38;
const float TAU = 8.0;
#define BQ (WG / 2u) // queries a workgroup (ATTN_COOP_BQ in vk_ops.c)
#define BKEY 32u // keys a tile: a lane each
#define QW (QD / 8u) // 16-byte words of 8 halves in a row
// rows in shared memory padded to an odd count of words, so that eight consecutive rows'
// words fall in different banks
#define LDW (QW + 1u)
#define PL (BKEY + 8u) // a row of probabilities in shared memory, in halves

// K's tile, then V's; at the start the block's queries, 2 BKEY rows at a time
shared uvec4 kvs[2u * BKEY * LDW];
// each subgroup's scores (16 x BKEY, f32), also its staging area for 16 x 16 outputs
shared float sst[(WG / 32u) * 16u * BKEY];
// each subgroup's probabilities, 16 x BKEY halves
shared float16_t pst[(WG / 32u) * 16u * PL];
shared float row_s[BQ]; // a row's scale factor on its way to the other lanes
shared int pq_s[BQ];
#include "attn_split.glsl"

// word c (elements 8 c..) of row `row` of K's cache, or V's where isv, as f16 (dtype dt)
uvec4 kv_word(uint isv, uint dt, uint row, uint c) {
    uint base = (isv != 0u ? pc.oc : pc.ob) + row * QD;
    if (dt == DT_F32) {
        uint b4 = base / 4u + c * 2u;
        return isv != 0u ? f32_word(V4[b4], V4[b4 + 1u]) : f32_word(K4[b4], K4[b4 + 1u]);
    }
    uvec4 w = isv != 0u ? V4[base / 8u + c] : K4[base / 8u + c];
    return dt == DT_BF16 ? bf16_word(w) : w;
}

void sg_sync() {
    subgroupMemoryBarrierShared();
    subgroupBarrier();
}

void main() {
    uint l = gl_LocalInvocationID.x, sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
    uint g = gl_WorkGroupID.y, q0 = gl_WorkGroupID.x * BQ;

    // the block's queries, as f16, through the tiles' place, 2 BKEY rows (4 subgroups') at
    // a time
    fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> qa[QD / 16u];
    for (uint h = 0; h < BQ; h += 2u * BKEY) {
        if (h > 0u) barrier(); // the last rows' subgroups have theirs
        for (uint w = l; w < 2u * BKEY * QW; w += WG) {
            uint qq = w / QW, c = w - qq * QW, qi = q0 + h + qq;
            uvec4 v = uvec4(0u);
            if (qi < pc.nq) {
                uint b4 = (pc.oa + query_row(qi) * QD) / 4u + c * 2u;
                v = f32_word(Q4[b4], Q4[b4 + 1u]);
            }
            kvs[qq * LDW + c] = v;
        }
        barrier();
        if (sg * 16u >= h && sg * 16u < h + 2u * BKEY)
            [[unroll]] for (uint c = 0; c < QD / 16u; c++)
                coopMatLoadNV(qa[c], kvs, (sg * 16u - h) * LDW + c * 2u, LDW, false);
    }
    if (l < BQ) pq_s[l] = q0 + l < pc.nq ? int(POS[pc.oe + (q0 + l) / pc.group]) : 0;
    barrier();

    // the block's keys, narrowed to what some query of it can see
    int ks = 0, ke = pc.n_kv;
    if (pc.ring == 0) {
        int pmin = 0x7fffffff, pmax = -0x7fffffff;
        for (uint q = 0; q < BQ; q++)
            if (q0 + q < pc.nq) {
                pmin = min(pmin, pq_s[q]);
                pmax = max(pmax, pq_s[q]);
            }
        narrow(pmin, pmax, ks, ke);
    }

    fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> o[QD / 16u];
    [[unroll]] for (uint j = 0; j < QD / 16u; j++) o[j] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0);
    // A lane takes one key of a tile (column `lane` of the scores: reads without bank
    // conflicts) in each of the subgroup's 16 rows, and keeps for each row the max the
    // probabilities are against (the same in every lane) and its share of the sum.
    float m[16], lpart[16];
    [[unroll]] for (uint r = 0; r < 16u; r++) {
        m[r] = MASKED;
        lpart[r] = 0.0;
    }
    uint sb = sg * 16u * BKEY, pb = sg * 16u * PL;
    for (int t0 = ks; t0 < ke; t0 += int(BKEY)) {
        for (uint w = l; w < 2u * BKEY * QW; w += WG) {
            uint isv = w / (BKEY * QW), rem = w - isv * (BKEY * QW), kr = rem / QW, c = rem - kr * QW;
            int key = t0 + int(kr);
            uvec4 v = uvec4(0u); // keys past the end: zeros, so that V's add nothing (not NaN)
            if (key < ke) v = kv_word(isv, isv != 0u ? VDT : KDT, uint(key) * pc.kvh + g, c);
            kvs[isv * (BKEY * LDW) + kr * LDW + c] = v;
        }
        barrier();

        // the scores of the subgroup's queries against the tile's keys, out to shared memory
        fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> s[BKEY / 16u];
        [[unroll]] for (uint j = 0; j < BKEY / 16u; j++) s[j] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0);
        [[unroll]] for (uint c = 0; c < QD / 16u; c++)
            [[unroll]] for (uint j = 0; j < BKEY / 16u; j++) {
                fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> kb;
                coopMatLoadNV(kb, kvs, j * 16u * LDW + c * 2u, LDW, true);
                s[j] = coopMatMulAddNV(qa[c], kb, s[j]);
            }
        [[unroll]] for (uint j = 0; j < BKEY / 16u; j++) coopMatStoreNV(s[j], sst, sb + j * 16u, BKEY, false);
        sg_sync();

        // this lane's key in each row: masked, scaled, capped; does any pass its row's max
        // by more than TAU?
        int key = t0 + int(lane);
        bool kok = key < ke;
        int pk = key_pos(key);
        float sv[16];
        bool over = false;
        [[unroll]] for (uint r = 0; r < 16u; r++) {
            float v = sst[sb + r * BKEY + lane] * pc.scale;
            if (pc.cap > 0.0) v = pc.cap * tanh_safe(v / pc.cap);
            bool ok = kok && q0 + sg * 16u + r < pc.nq && visible(pk, pq_s[sg * 16u + r]);
            sv[r] = ok ? v : MASKED;
            over = over || sv[r] > m[r] + TAU;
        }
        if (subgroupAny(over)) { // the first visible keys, or a max that moved that far
            [[unroll]] for (uint r = 0; r < 16u; r++) {
                float mx = subgroupMax(sv[r]), alpha = 1.0;
                if (mx > m[r] + TAU) {
                    alpha = exp(m[r] - mx);
                    m[r] = mx;
                }
                lpart[r] *= alpha;
                if (lane == r) row_s[sg * 16u + r] = alpha;
            }
            // the rows' outputs scaled, matrix by matrix through the staging area
            [[unroll]] for (uint j = 0; j < QD / 16u; j++) {
                sg_sync();
                coopMatStoreNV(o[j], sst, sb, 16u, false);
                sg_sync();
                [[unroll]] for (uint e = 0; e < 8u; e++) {
                    uint idx = lane * 8u + e;
                    sst[sb + idx] *= row_s[sg * 16u + idx / 16u];
                }
                sg_sync();
                coopMatLoadNV(o[j], sst, sb, 16u, false);
            }
        }
        [[unroll]] for (uint r = 0; r < 16u; r++) {
            float p = sv[r] <= -1.0e38 ? 0.0 : exp(sv[r] - m[r]);
            lpart[r] += p;
            pst[pb + r * PL + lane] = float16_t(p);
        }
        sg_sync();

        // the probabilities times V's tile, added to the outputs
        [[unroll]] for (uint c = 0; c < BKEY / 16u; c++) {
            fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> pa;
            coopMatLoadNV(pa, pst, pb + c * 16u, PL, false);
            [[unroll]] for (uint j = 0; j < QD / 16u; j++) {
                fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> vb;
                coopMatLoadNV(vb, kvs, BKEY * LDW + c * 16u * LDW + j * 2u, LDW, false);
                o[j] = coopMatMulAddNV(pa, vb, o[j]);
            }
        }
        barrier(); // every subgroup is done with the tiles before the next ones
    }

    // the outputs over the rows' sums (0 for a row that saw no key) and a sink's share
    // against the same max m, through the staging area
    [[unroll]] for (uint r = 0; r < 16u; r++) {
        float L = subgroupAdd(lpart[r]);
        uint qi = q0 + sg * 16u + r;
        if (L > 0.0 && qi < pc.nq) L += sink_term(query_row(qi), m[r]);
        if (lane == r) row_s[sg * 16u + r] = L > 0.0 ? 1.0 / L : 0.0;
    }
    [[unroll]] for (uint j = 0; j < QD / 16u; j++) {
        sg_sync();
        coopMatStoreNV(o[j], sst, sb, 16u, false);
        sg_sync();
        [[unroll]] for (uint e = 0; e < 8u; e++) {
            uint idx = lane * 8u + e, r = sg * 16u + idx / 16u, qi = q0 + r;
            if (qi < pc.nq)
                D[pc.od + query_row(qi) * QD + j * 16u + idx % 16u] = floatBitsToUint(sst[sb + idx] * row_s[r]);
        }
    }
}
