// Shared by every shader of the Vulkan backend.
//
// Buffers are bound as arrays of 32-bit words whatever their dtype: f32 through
// uintBitsToFloat, f16 and bf16 as halves of a word (bf16 by shifting, f16 through
// unpackHalf2x16), so no 16-bit storage feature is needed. Bindings 0..4 are the op's
// dst, src0..src3; the push constants start with their element offsets (a view whose
// byte offset is not aligned for a descriptor is bound at its aligned base), then the
// op's parameters. The recurrent ops' src4..src7 are bindings 5..8, their element offsets
// push constant words 5..8 (vk_ops.c's bind_more).
#extension GL_EXT_control_flow_attributes : enable
#ifdef USE_SUBGROUP
#extension GL_KHR_shader_subgroup_basic : enable
#extension GL_KHR_shader_subgroup_arithmetic : enable
#endif

#define DT_F32 0u
#define DT_F16 1u
#define DT_BF16 2u

#define BUF(B, NAME) layout(binding = B) buffer NAME##_b { uint NAME[]; };
#define RBUF(B, NAME) layout(binding = B) readonly buffer NAME##_b { uint NAME[]; };
// The same binding again as 16-byte words, for vector loads.
#define RBUF4(B, NAME) layout(binding = B) readonly buffer NAME##_b4 { uvec4 NAME##4[]; };

#define PC_OFFSETS uint od, oa, ob, oc, oe;
// fused.glsl's push constants, at word 18 in both matrix-vector shaders: element offsets
// of bindings 5 and 6, then the fused ops' parameters
#define FUSED_PC uint orr, ohn, has_pw, tp; float eps, poff; uint write_hn;

float cvt16(uint h, uint dt) { return dt == DT_F16 ? unpackHalf2x16(h).x : uintBitsToFloat(h << 16); }
// Element i (in units of the dtype) of buffer BUF holding dtype dt, as f32.
#define LOADF(BUF, dt, i)                                                                       \
    ((dt) == DT_F32 ? uintBitsToFloat(BUF[i])                                                   \
                    : cvt16((BUF[(i) >> 1] >> (((i)&1u) << 4)) & 0xffffu, dt))
// The raw 16 bits of element i.
#define LOAD16(BUF, i) ((BUF[(i) >> 1] >> (((i)&1u) << 4)) & 0xffffu)

// A 16-byte word of dtype dt as f32: its 4 values (f32) or 8 (f16, bf16), the first four in
// a and the next four in b (0 for f32).
void unpack_word(uvec4 w, uint dt, out vec4 a, out vec4 b) {
    if (dt == DT_F32) {
        a = uintBitsToFloat(w);
        b = vec4(0.0);
    } else if (dt == DT_F16) {
        a = vec4(unpackHalf2x16(w.x), unpackHalf2x16(w.y));
        b = vec4(unpackHalf2x16(w.z), unpackHalf2x16(w.w));
    } else {
        a = uintBitsToFloat(uvec4(w.x << 16, w.x & 0xffff0000u, w.y << 16, w.y & 0xffff0000u));
        b = uintBitsToFloat(uvec4(w.z << 16, w.z & 0xffff0000u, w.w << 16, w.w & 0xffff0000u));
    }
}

// Round to nearest even, like the CPU backend (the rounding of packHalf2x16 is not
// specified); overflow gives inf, NaN stays NaN.
uint f32_to_f16(float f) {
    uint x = floatBitsToUint(f);
    uint sign = (x >> 16) & 0x8000u;
    uint ax = x & 0x7fffffffu;
    if (ax >= 0x47800000u) return sign | (ax > 0x7f800000u ? 0x7e00u : 0x7c00u);
    if (ax < 0x38800000u) { // f16 subnormal or zero: let an f32 add do the rounding
        precise float r = uintBitsToFloat(ax) + 0.5;
        return sign | (floatBitsToUint(r) - 0x3f000000u);
    }
    uint odd = (ax >> 13) & 1u;
    ax += 0xc8000fffu + odd;
    return sign | (ax >> 13);
}

uint f32_to_bf16(float f) {
    uint x = floatBitsToUint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (x >> 16) | 0x40u;
    return (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
}

// a - 2 pi k exactly enough for |a| up to about 1e5: 2 pi in three parts, the first two
// short enough that k times them is exact (Cody and Waite), so the cos/sin of the f32
// angle the reference computes is what we get even where the hardware reduces poorly.
float reduce_2pi(float a) {
    precise float k = round(a * 0.15915494309189535);
    precise float r = a - k * 6.28125;
    r = r - k * 0.001934051513671875;
    r = r - k * 1.2556658930407139e-06;
    return r;
}

// A rope pair's (cos, sin) * af at position pos for inverse frequency inv (rope.comp and
// rms_norm.comp's fused rope: one formula, so that both give the same bits).
vec2 rope_cos_sin(int pos, float inv, float af) {
    precise float a = float(pos) * inv;
    float ar = reduce_2pi(a);
    return vec2(cos(ar), sin(ar)) * af;
}

// Large grids are 2D (65535 groups a dimension is all a device must offer).
uint group_index() { return gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x; }

// tanh that stays finite however large |x| is (some implementations divide inf by inf).
float tanh_safe(float x) { return tanh(clamp(x, -15.0, 15.0)); }

#ifdef NEED_WG_SUM
// Sum over the workgroup (all invocations must call it). Needs WG, a power of two.
shared float wg_red[WG];
float wg_sum(float v) {
#ifdef USE_SUBGROUP
    v = subgroupAdd(v);
    if (subgroupElect()) wg_red[gl_SubgroupID] = v;
    barrier();
    float s = 0.0;
    for (uint i = 0; i < gl_NumSubgroups; i++) s += wg_red[i];
    barrier();
    return s;
#else
    uint l = gl_LocalInvocationID.x;
    wg_red[l] = v;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1) {
        if (l < s) wg_red[l] += wg_red[l + s];
        barrier();
    }
    float r = wg_red[0];
    barrier();
    return r;
#endif
}
#endif
