#version 450
// Gated activation: out[i] = act(g[i]) * u[i]; without GATED: out[i] = act(g[i]). f32.
// ACT_SILU: x / (1 + e^-x); ACT_GELU: tanh approximation (as llama.cpp); ACT_SIGMOID: 1 / (1 + e^-x).
// u and out are contiguous (out may alias u: each element is read, then written, by one
// invocation). g is contiguous too, or with G_STRIDED a 4-D view of out's shape whose dim 0 is
// contiguous (e.g. the gate half of each head in a [query, gate] projection).
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
#if G_STRIDED
    uint ne0;       // g's shape (dims 0..2; dim 3 follows) and element strides
    uint ne1;
    uint ne2;
    uint g_s1;
    uint g_s2;
    uint g_s3;
#endif
} p;

uint g_index(const uint i) {
#if G_STRIDED
    const uint i0 = i % p.ne0;
    const uint r1 = i / p.ne0;
    const uint i1 = r1 % p.ne1;
    const uint r2 = r1 / p.ne1;
    const uint i2 = r2 % p.ne2;
    const uint i3 = r2 / p.ne2;
    return p.g_off + i0 + i1 * p.g_s1 + i2 * p.g_s2 + i3 * p.g_s3;
#else
    return p.g_off + i;
#endif
}

void main() {
    const uint i = global_index();
    if (i >= p.n) {
        return;
    }
#if GATED
    dst[p.d_off + i] = glu_fn(g[g_index(i)], u[p.u_off + i]);
#else
    dst[p.d_off + i] = act_fn(g[g_index(i)]);
#endif
}
