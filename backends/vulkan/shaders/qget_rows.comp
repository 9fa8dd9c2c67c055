#version 450
#extension GL_GOOGLE_include_directive : require
// dst f32 [n, d] = table[ids[i], :] with the table quantized (see quant.glsl): only the
// gathered rows are dequantized, one value per thread (one or two 32-bit loads of the
// row's words, then s * q + b). An id outside [0, V) gives a row of zeros.
layout(constant_id = 0) const uint WG = 256;
layout(constant_id = 2) const uint SDT = 0;
layout(constant_id = 4) const uint BITS = 4;
layout(constant_id = 5) const uint GROUP = 64;
layout(local_size_x_id = 0) in;
#include "common.glsl"
#include "quant.glsl"

BUF(0, D)
RBUF(1, T)
RBUF(2, IDS)

layout(push_constant) uniform PC {
    PC_OFFSETS
    uint total; // n * d
    uint d;
    uint V;
    uint wpr;
    uint gpr;
    uint sc;
    uint bi;
} pc;

void main() {
    uint i = group_index() * WG + gl_LocalInvocationID.x;
    if (i >= pc.total) return;
    uint r = i / pc.d, c = i - r * pc.d;
    int id = int(IDS[pc.ob + r]);
    float v = 0.0;
    if (id >= 0 && uint(id) < pc.V) {
        uint row = uint(id), g = row * pc.gpr + c / GROUP;
        float q = QVAL(QCODE_AT(T, pc.oa + row * pc.wpr, c));
        v = QSB(T, pc.oa + pc.sc, g) * q + QBI(T, pc.oa + pc.bi, g);
    }
    D[pc.od + i] = floatBitsToUint(v);
}
