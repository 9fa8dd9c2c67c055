#version 450
#extension GL_GOOGLE_include_directive : require
// LMH_OP_CONV1D: causal depthwise convolution over one sequence's n rows, with the K - 1
// rows before them (the state) kept. xx = the state's rows then x's:
//   y[t, c] = act(bias[c] + sum_{j < K} w[c, j] xx[t + j, c]),
// then the state becomes xx's last K - 1 rows. The state is read while outputs are made
// and rewritten after, so no thread may overwrite a row another still reads:
//   MODE 0: a thread a channel makes all n outputs of it, then rewrites the channel's state
//           rows in increasing order (row i takes xx[n + i], a later row: never one written);
//   MODE 1: a thread an output (many rows), the state left alone;
//   MODE 2: then a thread a state value, from x alone (recorded only where n >= K - 1).
layout(constant_id = 0) const uint WG = 256;
layout(constant_id = 1) const uint MODE = 0;
layout(local_size_x_id = 0) in;
#include "common.glsl"
#include "unary.glsl"

BUF(0, Y)
RBUF(1, X)
RBUF(2, W)
RBUF(3, BIAS)
BUF(4, ST)

layout(push_constant) uniform PC {
    PC_OFFSETS
    uint n; // rows
    uint C; // channels
    uint K; // taps
    uint has_bias;
    uint tw; // dtypes of w and bias
    uint tb;
    uint act; // LMH_UNARY_*
} pc;

float xx(uint i, uint c) {
    uint S = pc.K - 1u;
    return i < S ? uintBitsToFloat(ST[pc.oe + i * pc.C + c])
                 : uintBitsToFloat(X[pc.oa + (i - S) * pc.C + c]);
}

float conv_at(uint t, uint c) {
    float acc = pc.has_bias != 0u ? LOADF(BIAS, pc.tb, pc.oc + c) : 0.0;
    for (uint j = 0; j < pc.K; j++) acc += LOADF(W, pc.tw, pc.ob + c * pc.K + j) * xx(t + j, c);
    return unary_f(pc.act, acc);
}

void main() {
    uint i = group_index() * WG + gl_LocalInvocationID.x;
    uint S = pc.K - 1u;
    if (MODE == 0u) {
        uint c = i;
        if (c >= pc.C) return;
        for (uint t = 0; t < pc.n; t++) Y[pc.od + t * pc.C + c] = floatBitsToUint(conv_at(t, c));
        for (uint r = 0; r < S; r++) ST[pc.oe + r * pc.C + c] = floatBitsToUint(xx(pc.n + r, c));
    } else if (MODE == 1u) {
        if (i >= pc.n * pc.C) return;
        uint t = i / pc.C, c = i - t * pc.C;
        Y[pc.od + i] = floatBitsToUint(conv_at(t, c));
    } else {
        if (i >= S * pc.C) return;
        uint r = i / pc.C, c = i - r * pc.C;
        ST[pc.oe + i] = X[pc.oa + (pc.n - S + r) * pc.C + c];
    }
}
