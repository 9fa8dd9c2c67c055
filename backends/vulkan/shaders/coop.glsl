// Shared by the matrix-core shaders (matmul_coop.comp, attn_coop.comp): their operands go
// to shared memory as f16, in 16-byte words of 8 halves. Included after common.glsl, with
// GL_EXT_shader_explicit_arithmetic_types_float16 enabled.

// two values as f16, saturated at the f16 range (a large value is clipped, never made
// infinite)
uint h2(float a, float b) {
    vec2 v = clamp(vec2(a, b), -65504.0, 65504.0);
    return packFloat2x16(f16vec2(v));
}

// 8 f32 values (two words) as one word of 8 halves
uvec4 f32_word(uvec4 a, uvec4 b) {
    vec4 x = uintBitsToFloat(a), y = uintBitsToFloat(b);
    return uvec4(h2(x.x, x.y), h2(x.z, x.w), h2(y.x, y.y), h2(y.z, y.w));
}

// a word of 8 bf16 values as one of 8 halves
uvec4 bf16_word(uvec4 w) {
    uvec4 r;
    [[unroll]] for (uint e = 0; e < 4u; e++)
        r[e] = h2(uintBitsToFloat(w[e] << 16), uintBitsToFloat(w[e] & 0xffff0000u));
    return r;
}
