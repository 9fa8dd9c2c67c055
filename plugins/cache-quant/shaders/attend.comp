#version 450
#extension GL_EXT_control_flow_attributes : require
// Decode attention over the quantized store, without an f32 copy: one workgroup a K/V
// head and chunk of rows, for the G query heads that share that K/V head. Eight lanes a
// row, each with a slice of its values (whole words of codes within one scale group):
// a block is 32 rows, read in one coalesced run since a head's rows are contiguous, and
// the next block's words are loaded while this one is used. Scores for the whole chunk
// stay in shared memory, so the softmax is one pass; then the values are summed the same
// way and the 32 row slots reduced. The chunk's partials (weighted values, max, sum) go
// to T for attend_merge.comp. Computes what attend_chunk in cache_quant.c computes (in
// another order of sums). Built for each code width (BITS) and slice (LD values a lane,
// the head size / 8), so that a lane's values and sums sit in registers; cache_quant.c
// picks the build and checks the shapes it takes (attend_fits).
layout(local_size_x = 256) in;
layout(binding = 0) readonly buffer Q { float q[]; };  // [1, heads, d]
layout(binding = 1) readonly buffer P { int qpos[]; }; // the query's position
layout(binding = 2) readonly buffer K { uint ks[]; };  // store [kvh, cap, wk]
layout(binding = 3) readonly buffer V { uint vs[]; };  // store [kvh, cap, wv]
layout(binding = 4) writeonly buffer T { float part[]; }; // [heads, chunks, dv + 2]
layout(push_constant) uniform PC {
    uint off[8];
    uint items; // kvh * chunks
    uint heads, kvh, d, dv, bits, gk, gv;
    uint nkv;   // rows held
    uint pos;   // positions appended
    uint cap;   // rows of the store
    uint ring;  // 1: they are a ring
    int window;
    float scale, softcap;
    uint chunk; // rows a workgroup, a multiple of 32
} pc;

// cache_quant.c's ATT_* limits: keep them equal
// (26 KB of shared memory: within the 32 KB of lavapipe and of most GPUs)
const uint LANES = 8u, SLOTS = 32u, SCORES = 2048u;
const uint PER = 32u / BITS, LW = LD / PER, MAXG = 64u / LD; // codes a word, words a lane
shared float ss[SCORES];    // the chunk's scores, then weights, [G][chunk]
shared float sr[8u * 512u]; // partial dot products, then the value sums' reduction
shared float sq[512];       // the G queries
shared float sm[MAXG], sl[MAXG];

// code j of a lane's slice, from its words w
#define CODE(w, j) float((w[(j) / PER] >> (((j) % PER) * BITS)) & ((1u << BITS) - 1u))

void main() {
    uint item = gl_WorkGroupID.x + gl_NumWorkGroups.x * gl_WorkGroupID.y;
    if (item >= pc.items) return;
    uint t = gl_LocalInvocationID.x, lane = t % LANES, slot = t / LANES;
    uint nch = (pc.nkv + pc.chunk - 1u) / pc.chunk;
    uint g = item / nch, ch = item % nch, G = pc.heads / pc.kvh;
    uint wk = pc.d * BITS / 32u + 2u * pc.d / pc.gk, wv = pc.dv * BITS / 32u + 2u * pc.dv / pc.gv;
    uint first = ch * pc.chunk, last = min(first + pc.chunk, pc.nkv), n = last - first;
    int pq = qpos[pc.off[1]];
    // the queries with the lanes' slices interleaved (value j of lane l at j * LANES + l),
    // so that the eight lanes read eight banks of shared memory, not two
    for (uint i = t; i < G * pc.d; i += 256u) {
        uint h = i / pc.d, e = i % pc.d;
        sq[h * pc.d + (e % LD) * LANES + e / LD] = q[pc.off[0] + g * G * pc.d + i];
    }
    // the first block's values are loaded now; they do not wait for the scores
    uint vbase = pc.off[3] + (g * pc.cap + first) * wv, vcodes = pc.dv * BITS / 32u;
    uint vg = lane * LD / pc.gv;
    uint vcur[LW];
    float vsc = 0.0, vbi = 0.0;
    {
        uint row = vbase + slot * wv;
        bool in_ = slot < n;
        [[unroll]] for (uint k = 0u; k < LW; k++) vcur[k] = in_ ? vs[row + lane * LW + k] : 0u;
        vsc = in_ ? uintBitsToFloat(vs[row + vcodes + vg]) : 0.0;
        vbi = in_ ? uintBitsToFloat(vs[row + vcodes + pc.dv / pc.gv + vg]) : 0.0;
    }
    barrier();
    // the sums of this lane's slice of each query (the biases' share of a dot product)
    float qsum[MAXG];
    [[unroll]] for (uint h = 0u; h < MAXG; h++) {
        qsum[h] = 0.0;
        if (h < G) [[unroll]] for (uint j = 0u; j < LD; j++) qsum[h] += sq[h * pc.d + j * LANES + lane];
    }

    // scores: block b's words are loaded before block b - 1's are used
    uint kbase = pc.off[2] + (g * pc.cap + first) * wk, kcodes = pc.d * BITS / 32u;
    uint kg = lane * LD / pc.gk; // this lane's scale group
    uint cur[LW], nxt[LW];
    float csc = 0.0, cbi = 0.0, nsc = 0.0, nbi = 0.0;
    {
        uint row = kbase + slot * wk;
        bool in_ = slot < n;
        [[unroll]] for (uint k = 0u; k < LW; k++) cur[k] = in_ ? ks[row + lane * LW + k] : 0u;
        csc = in_ ? uintBitsToFloat(ks[row + kcodes + kg]) : 0.0;
        cbi = in_ ? uintBitsToFloat(ks[row + kcodes + pc.d / pc.gk + kg]) : 0.0;
    }
    for (uint b0 = 0u; b0 < n; b0 += SLOTS) {
        uint r = b0 + slot, rn = r + SLOTS, row = kbase + rn * wk;
        bool in_ = rn < n;
        [[unroll]] for (uint k = 0u; k < LW; k++) nxt[k] = in_ ? ks[row + lane * LW + k] : 0u;
        nsc = in_ ? uintBitsToFloat(ks[row + kcodes + kg]) : 0.0;
        nbi = in_ ? uintBitsToFloat(ks[row + kcodes + pc.d / pc.gk + kg]) : 0.0;
        [[unroll]] for (uint h = 0u; h < MAXG; h++) {
            if (h >= G) break;
            float dq = 0.0;
            [[unroll]] for (uint j = 0u; j < LD; j++) dq += sq[h * pc.d + j * LANES + lane] * CODE(cur, j);
            sr[(h * SLOTS + slot) * LANES + lane] = dq * csc + qsum[h] * cbi;
        }
        barrier();
        for (uint e = t; e < G * SLOTS; e += 256u) {
            uint h = e / SLOTS, s_ = e % SLOTS, rr = b0 + s_;
            if (rr >= n) continue;
            float dot = 0.0;
            [[unroll]] for (uint k = 0u; k < LANES; k++) dot += sr[(h * SLOTS + s_) * LANES + k];
            uint j = first + rr;
            int pk = pc.ring != 0u ? int(pc.pos) - 1 - int((pc.pos - 1u - j) % pc.cap) : int(j);
            float sc = -1.0 / 0.0;
            if (pk <= pq && (pc.window == 0 || pq - pk < pc.window)) {
                sc = dot * pc.scale;
                if (pc.softcap > 0.0) sc = pc.softcap * tanh(sc / pc.softcap);
            }
            ss[h * pc.chunk + rr] = sc;
        }
        barrier();
        cur = nxt;
        csc = nsc;
        cbi = nbi;
    }

    // the softmax over the chunk, every head at once: 32 threads a head take every 32nd
    // score, then one thread a head combines their 32 maxima (and sums)
    uint hh = t / SLOTS, k = t % SLOTS;
    if (hh < G) {
        float m = -1.0 / 0.0;
        for (uint r = k; r < n; r += SLOTS) m = max(m, ss[hh * pc.chunk + r]);
        sr[t] = m;
    }
    barrier();
    if (t < G) {
        float m = -1.0 / 0.0;
        for (uint i = 0u; i < SLOTS; i++) m = max(m, sr[t * SLOTS + i]);
        sm[t] = m;
    }
    barrier();
    if (hh < G) {
        float m = sm[hh], l = 0.0;
        for (uint r = k; r < n; r += SLOTS) {
            float w = m == -1.0 / 0.0 ? 0.0 : exp(ss[hh * pc.chunk + r] - m);
            ss[hh * pc.chunk + r] = w;
            l += w;
        }
        sr[t] = l;
    }
    barrier();
    if (t < G) {
        float l = 0.0;
        for (uint i = 0u; i < SLOTS; i++) l += sr[t * SLOTS + i];
        sl[t] = l;
    }
    barrier();

    // values: each lane sums its slice over its slot's rows, then the slots are reduced
    float acc[MAXG * LD];
    [[unroll]] for (uint i = 0u; i < MAXG * LD; i++) acc[i] = 0.0;
    cur = vcur;
    csc = vsc;
    cbi = vbi;
    for (uint b0 = 0u; b0 < n; b0 += SLOTS) {
        uint r = b0 + slot, rn = r + SLOTS, row = vbase + rn * wv;
        bool in_ = rn < n;
        [[unroll]] for (uint k = 0u; k < LW; k++) nxt[k] = in_ ? vs[row + lane * LW + k] : 0u;
        nsc = in_ ? uintBitsToFloat(vs[row + vcodes + vg]) : 0.0;
        nbi = in_ ? uintBitsToFloat(vs[row + vcodes + pc.dv / pc.gv + vg]) : 0.0;
        if (r < n)
            [[unroll]] for (uint h = 0u; h < MAXG; h++) {
                if (h >= G) break;
                float w = ss[h * pc.chunk + r];
                if (w != 0.0)
                    [[unroll]] for (uint j = 0u; j < LD; j++) acc[h * LD + j] += w * (CODE(cur, j) * csc + cbi);
            }
        cur = nxt;
        csc = nsc;
        cbi = nbi;
    }
    // the slots reduced into slot 0, at most 8 of them through shared memory at a time
    // ([8][G][dv], lanes interleaved as in sq): 24..31 into 16..23, 16..23 into 8..15,
    // 8..15 into 0..7, then halves
    uint gdv = G * pc.dv;
    for (uint step = 0u; step < 6u; step++) {
        uint from = step < 3u ? 24u - 8u * step : 8u >> (step - 2u), n_ = step < 3u ? 8u : from;
        if (slot >= from && slot < from + n_)
            [[unroll]] for (uint h = 0u; h < MAXG; h++)
                if (h < G) [[unroll]] for (uint j = 0u; j < LD; j++)
                    sr[(slot - from) * gdv + h * pc.dv + j * LANES + lane] = acc[h * LD + j];
        barrier();
        if (slot + n_ >= from && slot < from)
            [[unroll]] for (uint h = 0u; h < MAXG; h++)
                if (h < G) [[unroll]] for (uint j = 0u; j < LD; j++)
                    acc[h * LD + j] += sr[(slot + n_ - from) * gdv + h * pc.dv + j * LANES + lane];
        barrier();
    }
    if (slot == 0u)
        [[unroll]] for (uint h = 0u; h < MAXG; h++) {
            if (h >= G) break;
            uint at = pc.off[4] + ((g * G + h) * nch + ch) * (pc.dv + 2u);
            [[unroll]] for (uint j = 0u; j < LD; j++) part[at + lane * LD + j] = acc[h * LD + j];
            if (lane == 0u) {
                part[at + pc.dv] = sm[h];
                part[at + pc.dv + 1u] = sl[h];
            }
        }
}
