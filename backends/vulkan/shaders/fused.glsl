// Decode's neighbours of a one-row matrix-vector product, fused into it (vk_fuse.c),
// included by matvec.comp and qmatvec.comp when built with FUSED (and MAXR 1), after their
// push constants (which end with FUSED_PC). They remove steps from a layer's chain of
// dependent dispatches:
// PRO 1: the input is RMSNorm(X) with weight P. The norm's 1/rms is a factor of every
//   output, so the products run on X * P, X's sum of squares is gathered on the way, and
//   1/rms scales the reduced sums; with write_hn the workgroups also store the normalized
//   row in HN (where the norm's result was to go, for readers other than products), each
//   a slice of it, so that no workgroup's time grows.
// PRO 2: the input is silu(X) * P (SwiGLU of gate X and up P), computed per element.
// EPI 1: R += the result (the residual add that follows the product; R read and written).
layout(constant_id = 6) const uint PRO = 0;
layout(constant_id = 7) const uint EPI = 0;
layout(constant_id = 8) const uint PVEC = 0; // P's elements i..i+3 (i a multiple of 4) in one load

RBUF(4, P)
RBUF4(4, P)
layout(binding = 4) readonly buffer P_b2 { uvec2 P2[]; };
BUF(5, R)
BUF(6, HN)

float ssq = 0.0; // PRO 1: this thread's share of sum(X^2)

// the norm's weight at element i of the row, (w + off) as rms_norm.comp applies it
float norm_w(uint i) { return pc.has_pw != 0u ? LOADF(P, pc.tp, pc.oe + i) + pc.poff : 1.0; }

float silu_f(float v) { return v / (1.0 + exp(-v)); } // eltwise.comp's silu

// P's elements i..i+3 as f32: one load where aligned (as many scalar loads would cost
// the product more than the arithmetic they feed)
vec4 p4(uint i, uint dt) {
    uint e = pc.oe + i;
    if (PVEC != 0u) {
        if (dt == DT_F32) return uintBitsToFloat(P4[e / 4u]);
        uvec2 h = P2[e / 4u];
        return vec4(cvt16(h.x & 0xffffu, dt), cvt16(h.x >> 16, dt), cvt16(h.y & 0xffffu, dt),
                    cvt16(h.y >> 16, dt));
    }
    return vec4(LOADF(P, dt, e), LOADF(P, dt, e + 1u), LOADF(P, dt, e + 2u), LOADF(P, dt, e + 3u));
}

// the product's input at elements i..i+3 of the row from X's values there
vec4 pro4(vec4 xv, uint i) {
    if (PRO == 1u) {
        ssq += dot(xv, xv);
        return pc.has_pw != 0u ? xv * (p4(i, pc.tp) + pc.poff) : xv;
    }
    if (PRO == 2u)
        return vec4(silu_f(xv.x), silu_f(xv.y), silu_f(xv.z), silu_f(xv.w)) * p4(i, DT_F32);
    return xv;
}

float pro1(float x, uint i) {
    if (PRO == 1u) {
        ssq += x * x;
        return x * norm_w(i);
    }
    if (PRO == 2u) return silu_f(x) * uintBitsToFloat(P[pc.oe + i]);
    return x;
}

// 1/rms from the reduced sum of squares (PRO 1), else 1
float pro_scale(float sum_sq) {
    return PRO == 1u ? 1.0 / sqrt(sum_sq / float(pc.in_) + pc.eps) : 1.0;
}

// after the result s of output o is stored: the residual add, R[o] = r + s, r being R[o]
// as tail_early loaded it (only this thread reads or writes it)
void epi(uint o, float s, float r) {
    if (EPI == 1u) R[pc.orr + o] = floatBitsToUint(r + s);
}


// PRO 1 with write_hn: this workgroup's slice of the normalized row (all threads call this)
void store_norm(float rs) {
    if (PRO != 1u || pc.write_hn == 0u) return;
    uint stride = gl_NumWorkGroups.x * gl_NumWorkGroups.y * WG;
    for (uint i = group_index() * WG + gl_LocalInvocationID.x; i < pc.in_; i += stride)
        HN[pc.ohn + i] = floatBitsToUint(uintBitsToFloat(X[pc.oa + i]) * rs * norm_w(i));
}
