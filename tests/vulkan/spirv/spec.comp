#version 450
// Sizes from specialization constants (their defaults, as a pipeline without
// specialization info gets them): shared float a[N * 2 + 1], shared int b[N >> 2];
// workgroups of 96 x 1 x 1, specializable (constant 1), so read from the WorkgroupSize
// built-in's composite rather than the execution mode.
layout(local_size_x = 96, local_size_x_id = 1) in;
layout(constant_id = 0) const uint N = 48;
shared float a[N * 2u + 1u];
shared int b[N >> 2u];
layout(binding = 0) buffer B { float o[]; };
void main() {
    uint i = gl_LocalInvocationIndex;
    a[i % (N * 2u + 1u)] = float(i);
    b[i % (N >> 2u)] = int(i);
    barrier();
    o[i] = a[(i + 1u) % (N * 2u + 1u)] + float(b[(i + 1u) % (N >> 2u)]);
}
