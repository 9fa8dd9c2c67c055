#version 450
// No shared memory; workgroups of 256.
layout(local_size_x = 256) in;
layout(binding = 0) buffer B { float o[]; };
void main() { o[gl_GlobalInvocationID.x] *= 2.0; }
