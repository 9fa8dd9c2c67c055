// The end of matvec.comp and qmatvec.comp: the NR * MAXR sums of each thread (and, with
// FUSED, its share of the sum of squares) reduced over the workgroup, scaled, biased and
// stored for output columns o0.. and the rows drow (nrows of them); then fused.glsl's
// epilogue. Included after the shader's bindings, push constants and helpers.
// Without MOE, x's rows MAXR at a time: a workgroup's output columns o0.. and row group
// (nrows rows from r0). The row groups of a block of columns are adjacent in the grid, so
// that they read its weights at about the same time, all but the first from L2: the
// weights come from memory about once however many groups there are.
#define ROW_GROUP(o0, nrows, xrow, drow)                                                          \
    uint nrg_ = max((pc.nrows + MAXR - 1u) / MAXR, 1u), gi_ = group_index();                 \
    uint r0_ = (gi_ % nrg_) * MAXR;                                                              \
    uint o0 = (gi_ / nrg_) * NR;                                                                 \
    nrows = min(pc.nrows - r0_, MAXR);                                                           \
    [[unroll]] for (uint j = 0; j < MAXR; j++) xrow[j] = drow[j] = r0_ + j

#ifdef FUSED
#include "fused.glsl"
#define NSUM (NR * MAXR + 1u) // the sums, then the sum of squares
#else
#define NSUM (NR * MAXR)
#endif
shared float red[NSUM * WG];

// What the store after the reduction adds to a sum, loaded before the weights: the bias and
// (FUSED, EPI 1) the residual at this thread's output. Loaded there, they would add a
// round trip to memory after the reduction, at the end of every workgroup's time.
float tail_bias = 0.0, tail_r = 0.0;
void tail_early(uint o0) {
    uint l = gl_LocalInvocationID.x;
    if (l >= NR * MAXR) return;
    uint o = o0 + l / MAXR;
    if (o >= pc.out_) return;
    if (pc.has_bias != 0u) tail_bias = LOADF(BIAS, pc.tbias, pc.oc + o);
#ifdef FUSED
    if (EPI == 1u) tail_r = uintBitsToFloat(R[pc.orr + o]);
#endif
}

void reduce_store(float acc[NR][MAXR], uint o0, uint nrows, uint drow[MAXR]) {
    uint l = gl_LocalInvocationID.x;
    // all NR * MAXR sums at once
#ifdef USE_SUBGROUP
    [[unroll]] for (uint r = 0; r < NR; r++)
        [[unroll]] for (uint j = 0; j < MAXR; j++) {
            float s = subgroupAdd(acc[r][j]);
            if (subgroupElect()) red[(r * MAXR + j) * WG + gl_SubgroupID] = s;
        }
#ifdef FUSED
    if (PRO == 1u) {
        float sq = subgroupAdd(ssq);
        if (subgroupElect()) red[NR * MAXR * WG + gl_SubgroupID] = sq;
    }
#endif
    barrier();
    uint parts = gl_NumSubgroups;
#else
    [[unroll]] for (uint r = 0; r < NR; r++)
        [[unroll]] for (uint j = 0; j < MAXR; j++) red[(r * MAXR + j) * WG + l] = acc[r][j];
#ifdef FUSED
    red[NR * MAXR * WG + l] = ssq;
#endif
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1) {
        if (l < s) [[unroll]] for (uint q = 0; q < NSUM; q++) red[q * WG + l] += red[q * WG + l + s];
        barrier();
    }
    uint parts = 1u;
#endif
#ifdef FUSED
    float sum_sq = 0.0;
    for (uint i = 0; i < parts; i++) sum_sq += red[NR * MAXR * WG + i];
    float rs = pro_scale(sum_sq);
#endif
    if (l < NR * MAXR) {
        uint r = l / MAXR, j = l % MAXR, o = o0 + r;
        if (j < nrows && o < pc.out_) {
            float s = 0.0;
            for (uint i = 0; i < parts; i++) s += red[l * WG + i];
#ifdef FUSED
            s *= rs;
#endif
            if (pc.has_bias != 0u) s += tail_bias;
            D[pc.od + drow[j] * pc.out_ + o] = floatBitsToUint(s);
#ifdef FUSED
            epi(o, s, tail_r);
#endif
        }
    }
#ifdef FUSED
    store_norm(rs);
#endif
}
