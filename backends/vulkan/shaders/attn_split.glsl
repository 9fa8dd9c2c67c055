// Shared by attention.comp and attn_decode.comp (included after common.glsl): their push
// constants (one layout, filled by vk_ops.c's op_attention), the split-K bindings, and the
// rules both apply: which query row a block's query is, where a key sits, what a query sees,
// and which split of a block merges the others.

// coherent: the last split reads what the other workgroups wrote
layout(binding = 5) coherent buffer P_b { uint P[]; };
layout(binding = 6) coherent buffer CNT_b { uint CNT[]; };

layout(push_constant) uniform PC {
    PC_OFFSETS
    uint nq;     // queries per K/V head: n * group
    uint heads;
    uint kvh;
    uint group;
    uint dv;
    int n_kv;
    int kv0;
    int window;
    int ring;
    int total;
    int chunk;   // keys per split (attention.comp: a multiple of its WG)
    uint nsplit;
    float scale;
    float cap;
    uint ocnt; // this dispatch's counters in CNT: one per (query block, K/V head)
    uint osink; // (ABI 1.10 sinks) 1 + the element offset of the sinks in binding 7; 0: none
} pc;

// per-head sink logits (ops.h LMH_ATTN_SINKS), one f32 a head
layout(binding = 7) readonly buffer SINK_b { uint SINK[]; };

// A sink's share of the softmax denominator of query row `row` (token row * heads + head),
// against the max M its sum L was taken with: out = acc / (L + sink_term). Only for L > 0 (a
// row that saw no key stays 0).
float sink_term(uint row, float M) {
    if (pc.osink == 0u) return 0.0;
    return exp(uintBitsToFloat(SINK[pc.osink - 1u + row % pc.heads]) - M);
}

shared uint last_s;

// A sequence's own parameters: the push constants', or (attn_decode.comp with SEQS, several
// sequences a dispatch) those of the workgroup's sequence, from its table entry.
#ifdef SEQS
#define S_NKV s_nkv
#define S_KV0 s_kv0
#define S_RING s_ring
#define S_TOTAL s_total
#define S_CHUNK s_chunk
#define S_NSPLIT s_nsplit
#define S_NWG s_nwg
#define S_PBASE s_pbase
#define S_CNT s_cnt
#else
#define S_NKV pc.n_kv
#define S_KV0 pc.kv0
#define S_RING pc.ring
#define S_TOTAL pc.total
#define S_CHUNK pc.chunk
#define S_NSPLIT pc.nsplit
#define S_NWG pc.nsplit
#define S_PBASE 0u
#define S_CNT (pc.ocnt + gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x)
#endif

// query qi of the workgroup's K/V head (gl_WorkGroupID.y): its row in q and dst (token row
// * heads + head)
uint query_row(uint qi) {
    uint r = qi / pc.group;
    return r * pc.heads + pc.group * gl_WorkGroupID.y + (qi - r * pc.group);
}

// the position of key `key`: in order from kv0, or in a ring of `ring` rows holding the last
// positions before `total`
int key_pos(int key) {
    return S_RING != 0 ? key + S_RING * ((S_TOTAL - 1 - key) / S_RING) : S_KV0 + key;
}

// whether a query at position pq sees the key at pk: causal, optional window
bool visible(int pk, int pq) { return pk <= pq && (pc.window == 0 || pq - pk < pc.window); }

// the split's keys [ks, ke) narrowed to what queries at positions pmin..pmax can see (keys
// in order only, not a ring; the callers test that first, which measured 4% faster on an
// H100 than computing pmin and pmax in every case)
void narrow(int pmin, int pmax, inout int ks, inout int ke) {
    ke = min(ke, pmax - S_KV0 + 1);
    if (pc.window > 0) ks = max(ks, pmin - pc.window + 1 - S_KV0);
}

// After a split wrote its partials (all threads call this): whether this workgroup is the
// last of its block's S_NWG workgroups to finish, which then merges the splits. The block's
// counter goes back to 0 for the next dispatch.
bool last_split() {
    // every thread's partials visible device-wide before the block's count goes up
    memoryBarrierBuffer();
    barrier();
    if (gl_LocalInvocationID.x == 0u) {
        uint c = S_CNT;
        last_s = atomicAdd(CNT[c], 1u) == S_NWG - 1u ? 1u : 0u;
        if (last_s != 0u) CNT[c] = 0u; // the others have all counted: ready for the next use
    }
    barrier();
    if (last_s == 0u) return false;
    memoryBarrierBuffer();
    return true;
}
