#version 450
// out[i] = a[i] OP b[i % nb]   (b broadcast by repetition), f32, contiguous; OP_SCALE: a[i] * scale
#include "common.glsl"

#define OP_ADD 0
#define OP_MUL 1
#define OP_SCALE 2

layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer A { float a[]; };
layout(binding = 1) readonly buffer B { float b[]; };
layout(binding = 2) writeonly buffer Out { float dst[]; };

layout(push_constant) uniform Push {
    uint n;
    uint nb;
    uint a_off;
    uint b_off;
    uint d_off;
    float scale;
} p;

void main() {
    const uint i = global_index();
    if (i >= p.n) {
        return;
    }
    const float x = a[p.a_off + i];
#if OP == OP_ADD
    dst[p.d_off + i] = x + b[p.b_off + i % p.nb];
#elif OP == OP_MUL
    dst[p.d_off + i] = x * b[p.b_off + i % p.nb];
#else
    dst[p.d_off + i] = x * p.scale;
#endif
}
