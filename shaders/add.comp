#version 450
// out[i] = a[i] + b[i] (f32); offsets in elements
#include "common.glsl"

layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer A { float a[]; };
layout(binding = 1) readonly buffer B { float b[]; };
layout(binding = 2) writeonly buffer Out { float dst[]; };

layout(push_constant) uniform Push {
    uint n;
} p;

void main() {
    const uint i = global_index();
    if (i < p.n) {
        dst[i] = a[i] + b[i];
    }
}
