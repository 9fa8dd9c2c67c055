// LMH_UNARY_* (ops.h) and the recurrent ops' softplus and sigmoid, as the CPU backend
// computes them (backends/cpu/recurrent.c). Needs common.glsl (tanh_safe).

// log(1 + exp(v)), v past 20 as is (torch's threshold). log1p's accuracy for small exp(v):
// u - 1 is the part of e that 1 + e kept, so log(u) * e / (u - 1) loses none of e's bits
// (the CPU uses log1pf; log(1 + e) alone would give 0 for e < 2^-24).
float softplus_f(float v) {
    if (v > 20.0) return v;
    float e = exp(v);
    precise float u = 1.0 + e;
    precise float m = u - 1.0;
    return m == 0.0 ? e : log(u) * (e / m);
}

float sigmoid_f(float v) { return 1.0 / (1.0 + exp(-v)); }

#define UNARY_SILU 1u
#define UNARY_RELU 2u
#define UNARY_RELU2 3u
#define UNARY_SIGMOID 4u
#define UNARY_SOFTPLUS 5u
#define UNARY_GELU_TANH 6u

float unary_f(uint fn, float v) {
    if (fn == UNARY_SILU) return v / (1.0 + exp(-v));
    if (fn == UNARY_RELU) return v > 0.0 ? v : 0.0;
    if (fn == UNARY_RELU2) return v > 0.0 ? v * v : 0.0;
    if (fn == UNARY_SIGMOID) return sigmoid_f(v);
    if (fn == UNARY_SOFTPLUS) return softplus_f(v);
    if (fn == UNARY_GELU_TANH)
        return 0.5 * v * (1.0 + tanh_safe(0.7978845608028654 * (v + 0.044715 * v * v * v)));
    return v;
}
