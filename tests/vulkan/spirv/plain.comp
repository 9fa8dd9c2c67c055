#version 450
// Shared variables of fixed sizes: 100 floats, 10 vec4, a struct of a float and a vec3,
// 3 x 2 uvec2; workgroups of 64 x 2.
layout(local_size_x = 64, local_size_y = 2) in;
struct S { float x; vec3 v; };
shared float a[100];
shared vec4 b[10];
shared S s;
shared uvec2 c[3][2];
layout(binding = 0) buffer B { float o[]; };
void main() {
    uint i = gl_LocalInvocationIndex;
    if (i < 100u) a[i] = float(i);
    if (i < 10u) b[i] = vec4(i);
    if (i == 0u) { s.x = 1.0; s.v = vec3(2.0); }
    if (i < 6u) c[i / 2u][i % 2u] = uvec2(i);
    barrier();
    o[i] = a[i % 100u] + b[i % 10u].x + s.x + s.v.y + float(c[i % 3u][i % 2u].x);
}
