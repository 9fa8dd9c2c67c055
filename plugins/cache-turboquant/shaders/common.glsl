// Shared by the TurboQuant cache's shaders: the tables of tq_codec.h (sign streams,
// codebooks, 1/sqrt(m), kappa), fp16 as tq_half/tq_float compute it, and division and
// square root rounded correctly (the encoder's codes must be the C codec's bit for bit,
// and Vulkan lets a driver's x / y and sqrt be off by a few ulp). Buffers are arrays of
// 32-bit words; f16 tensors are read as halves of a word, so no 16-bit storage feature is
// needed. Blocks are of m = 64 or 128 values.
#include "tables.glsl"

// word w (0..m/32-1) of sign stream s (0: D1, 1: D2, 2: D3, 3: D4)
uint tq_sign_word(uint m, uint s, uint w) {
    return m == 64u ? TQ_SIGNS64[s * 2u + w] : TQ_SIGNS128[s * 4u + w];
}

// the sign of stream s at i as +-1
float tq_sign(uint m, uint s, uint i) {
    return ((tq_sign_word(m, s, i >> 5) >> (i & 31u)) & 1u) != 0u ? -1.0 : 1.0;
}

// codebook entry c (ascending) for blocks of m and codes of `bits`
float tq_cb(uint m, uint bits, uint c) {
    if (m == 64u) return bits == 3u ? TQ_CB64_3[c & 7u] : TQ_CB64_4[c & 15u];
    return bits == 3u ? TQ_CB128_3[c & 7u] : TQ_CB128_4[c & 15u];
}

// float(1 / sqrt(m)) and float(sqrt(pi / 2) / sqrt(m)) as tq_tables_for rounds them
float tq_rs(uint m) { return m == 64u ? 0.125 : uintBitsToFloat(0x3db504f3u); }
float tq_kappa(uint m) { return uintBitsToFloat(m == 64u ? 0x3e206c99u : 0x3de2dfc5u); }

// the block size of a head of hd values (tq_block): 64, 128, or 0 where codes do not fit
uint tq_block(uint hd) { return hd == 64u ? 64u : (hd > 0u && hd % 128u == 0u) ? 128u : 0u; }

// ---- fp16 (tq_half, tq_float): round to nearest even, subnormals kept, +-65504 clamp ----
uint tq_half(float f) {
    uint x = floatBitsToUint(f);
    uint sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u; // NaN
    if (a >= 0x477ff000u) return sign | 0x7bffu; // rounds past 65504: clamp
    if (a < 0x38800000u) {                        // subnormal or zero in half
        if (a < 0x33000000u) return sign;
        uint e = a >> 23, mant = (a & 0x7fffffu) | 0x800000u, sh = 126u - e; // 14..24
        uint h = mant >> sh, rem = mant & ((1u << sh) - 1u), half_ = 1u << (sh - 1u);
        if (rem > half_ || (rem == half_ && (h & 1u) != 0u)) h++;
        return sign | h;
    }
    uint h = (a - 0x38000000u) >> 13, rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u) != 0u)) h++;
    return sign | h;
}

// by hand rather than unpackHalf2x16, so that subnormal halves are never flushed
float tq_float(uint h) {
    uint sign = (h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 0x3ffu;
    if (e == 0u) {
        float f = float(m) * uintBitsToFloat(0x33800000u); // m * 2^-24, exact
        return sign != 0u ? -f : f;
    }
    if (e == 31u) return uintBitsToFloat(sign | 0x7f800000u | (m << 13));
    return uintBitsToFloat(sign | ((e + 112u) << 23) | (m << 13));
}

// the 16 bits of f16 element i of a word buffer, i counted in halves
#define TQ_LOAD16(BUF, i) ((BUF[(i) >> 1] >> (((i)&1u) << 4)) & 0xffffu)

// ---- correctly rounded division and square root ----
// a * b = p + e exactly (Veltkamp's split, Dekker's product): each step a single
// rounding, so no fused multiply-add is needed (Vulkan does not promise one)
void tq_two_prod(float a, float b, out float p, out float e) {
    precise float ca = 4097.0 * a, ah = ca - (ca - a), al = a - ah;
    precise float cb = 4097.0 * b, bh = cb - (cb - b), bl = b - bh;
    precise float pp = a * b;
    precise float ee = ((ah * bh - pp) + ah * bl + al * bh) + al * bl;
    p = pp;
    e = ee;
}

// x - c * y, exact but for its last rounding while c is within a few ulp of x / y
// (x - p then has no rounding at all)
float tq_resid(float x, float y, float c) {
    float p, e;
    tq_two_prod(c, y, p, e);
    precise float r = (x - p) - e;
    return r;
}

// x / y for y > 0 rounded to nearest: the driver's quotient, then moved an ulp at a time
// to the neighbour with the smaller remainder (the exact quotient is never a tie)
float tq_div(float x, float y) {
    float q = abs(x) / y, ax = abs(x);
    if (!(q > 0.0) || isinf(q) || isnan(q)) return x / y;
    for (int it = 0; it < 4; it++) {
        uint b = floatBitsToUint(q);
        float up = uintBitsToFloat(b + 1u), dn = uintBitsToFloat(b - 1u);
        float r0 = abs(tq_resid(ax, y, q));
        if (abs(tq_resid(ax, y, up)) < r0)
            q = up;
        else if (b > 1u && abs(tq_resid(ax, y, dn)) < r0)
            q = dn;
        else
            break;
    }
    return x < 0.0 ? -q : q;
}

// sqrt(x) rounded to nearest, likewise (x - c * c the remainder)
float tq_sqrt(float x) {
    float s = sqrt(x);
    if (!(s > 0.0) || isinf(s) || isnan(s)) return s;
    for (int it = 0; it < 4; it++) {
        uint b = floatBitsToUint(s);
        float up = uintBitsToFloat(b + 1u), dn = uintBitsToFloat(b - 1u);
        float r0 = abs(tq_resid(x, s, s));
        // x - c * c through tq_resid(x, c, c): the same product
        if (abs(tq_resid(x, up, up)) < r0)
            s = up;
        else if (b > 1u && abs(tq_resid(x, dn, dn)) < r0)
            s = dn;
        else
            break;
    }
    return s;
}

// code i (bits wide) of a block's LSB-first bit stream, given the two words around it
// (lo holds bit bits * i; hi the next word, read only where the code runs into it)
uint tq_code_at(uint lo, uint hi, uint bits, uint i) {
    uint sh = (bits * i) & 31u, v = lo >> sh;
    if (sh + bits > 32u) v |= hi << (32u - sh);
    return v & ((1u << bits) - 1u);
}
