#version 450
// dst[i] = value for i < n (32-bit words)
#include "common.glsl"

layout(local_size_x_id = 0) in;

layout(binding = 0) writeonly buffer Dst { uint dst[]; };

layout(push_constant) uniform Push {
    uint n;
    uint value;
} p;

void main() {
    const uint i = global_index();
    if (i < p.n) {
        dst[i] = p.value;
    }
}
