#version 450
// Bandwidth probe: the invocations of the grid read src (n uvec4s) grid-strided, UNROLL loads in
// flight an invocation, and store the xor of what each read in dst[invocation] (so no read is
// dead code): the rate a compute shader streams memory, the peer of the mat-vec's weight reads.
#include "common.glsl"

layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer Src { uvec4 src[]; };
layout(binding = 1) writeonly buffer Dst { uint dst[]; };

layout(push_constant) uniform Push {
    uint n;
} p;

void main() {
    const uint total = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    uint i = gl_GlobalInvocationID.x;
    uvec4 acc = uvec4(0u);
    for (; i + (UNROLL - 1u) * total < p.n; i += UNROLL * total) {
        uvec4 v[UNROLL];
        [[unroll]] for (uint u = 0u; u < UNROLL; u++) {
            v[u] = src[i + u * total];
        }
        [[unroll]] for (uint u = 0u; u < UNROLL; u++) {
            acc ^= v[u];
        }
    }
    for (; i < p.n; i += total) {
        acc ^= src[i];
    }
    dst[gl_GlobalInvocationID.x] = acc.x ^ acc.y ^ acc.z ^ acc.w;
}
