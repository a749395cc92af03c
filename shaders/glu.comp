#version 450
// Gated activation: out[i] = act(g[i]) * u[i]; without GATED: out[i] = act(g[i]). f32, contiguous.
// ACT_SILU: x / (1 + e^-x); ACT_GELU: tanh approximation (as llama.cpp).
#include "common.glsl"
#include "act.glsl"

layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer G { float g[]; };
layout(binding = 1) readonly buffer U { float u[]; };
layout(binding = 2) writeonly buffer Out { float dst[]; };

layout(push_constant) uniform Push {
    uint n;
    uint g_off;
    uint u_off;
    uint d_off;
} p;

void main() {
    const uint i = global_index();
    if (i >= p.n) {
        return;
    }
#if GATED
    dst[p.d_off + i] = glu_fn(g[p.g_off + i], u[p.u_off + i]);
#else
    dst[p.d_off + i] = act_fn(g[p.g_off + i]);
#endif
}
