#version 450
#extension GL_GOOGLE_include_directive : require
// dst i32 [rows] = the lowest index of the largest value of each row of src0 f32 [rows, n]
// (LMH_OP_ARGMAX, the host sampler's greedy rule: NaNs never win, a NaN first gives 0). A
// workgroup a row: each thread keeps the best of its values (the first it sees on ties:
// its indices only grow), eight 16-byte words loaded together where the row is aligned,
// then a tree over the workgroup takes the larger value, and the lower index on ties.
// Decode reads one row of about 600 KB that the head product has just written (in L2): with
// 1024 threads that is five rounds of loads (256 threads and four words: 28 us on an H100).
layout(constant_id = 0) const uint WG = 256;
layout(constant_id = 1) const uint VEC = 0; // the row starts on 16 bytes and n % 4 == 0
layout(local_size_x_id = 0) in;
#include "common.glsl"

BUF(0, D)
RBUF(1, X)
RBUF4(1, X)

layout(push_constant) uniform PC {
    PC_OFFSETS
    uint n;
    uint rows;
} pc;

const uint NONE = 0xffffffffu;
shared float sv[WG];
shared uint si[WG];

// the better of (m, i) and (v, j) when j > i or i is NONE; NaN never wins
void take(inout float m, inout uint i, float v, uint j) {
    if (v > m || (i == NONE && v == v)) {
        m = v;
        i = j;
    }
}

void main() {
    uint l = gl_LocalInvocationID.x, row = group_index(), base = pc.oa + row * pc.n;
    if (row >= pc.rows) return; // the whole workgroup: no barrier is left waiting
    float m = 0.0;
    uint mi = NONE;
    if (VEC != 0u) {
        uint n4 = pc.n / 4u, b4 = base / 4u, c = l;
        for (; c + 7u * WG < n4; c += 8u * WG) {
            vec4 w[8];
            [[unroll]] for (uint u = 0; u < 8u; u++) w[u] = uintBitsToFloat(X4[b4 + c + u * WG]);
            [[unroll]] for (uint u = 0; u < 8u; u++)
                [[unroll]] for (uint e = 0; e < 4u; e++) take(m, mi, w[u][e], (c + u * WG) * 4u + e);
        }
        for (; c < n4; c += WG) {
            vec4 w = uintBitsToFloat(X4[b4 + c]);
            [[unroll]] for (uint e = 0; e < 4u; e++) take(m, mi, w[e], c * 4u + e);
        }
    } else {
        for (uint i = l; i < pc.n; i += WG) take(m, mi, uintBitsToFloat(X[base + i]), i);
    }
    sv[l] = m;
    si[l] = mi;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1) {
        if (l < s) {
            float v = sv[l + s];
            uint j = si[l + s];
            float a = sv[l];
            uint i = si[l];
            if (j != NONE && (i == NONE || v > a || (v == a && j < i))) {
                sv[l] = v;
                si[l] = j;
            }
        }
        barrier();
    }
    if (l == 0u) {
        float first = uintBitsToFloat(X[base]);
        D[pc.od + row] = first != first || si[0] == NONE ? 0u : si[0];
    }
}
