#version 450
// Scatter rows into a cache: dst[e, idx[t], h] = src[e, h, t]   (src f32; dst f32 or f16)
// src [ne0, n_head, n_tokens]; dst rows addressed as d_off + idx[t] * d_s1 + h * d_s2 (elements).
#include "common.glsl"

#if DST_F16
#extension GL_EXT_shader_16bit_storage : require
#define DST_T float16_t
#else
#define DST_T float
#endif

layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer Src { float src[]; };
layout(binding = 1) readonly buffer Idx { int idx[]; };
layout(binding = 2) writeonly buffer Dst { DST_T dst[]; };

layout(push_constant) uniform Push {
    uint ne0;
    uint n_head;
    uint n_tokens;
    uint s_off;
    uint s_s1;
    uint s_s2;
    uint idx_off;
    uint d_off;
    uint d_s1;
    uint d_s2;
} p;

void main() {
    const uint i = global_index();
    if (i >= p.ne0 * p.n_head * p.n_tokens) {
        return;
    }
    const uint e = i % p.ne0;
    const uint h = (i / p.ne0) % p.n_head;
    const uint t = i / (p.ne0 * p.n_head);
    const float v = src[p.s_off + e + h * p.s_s1 + t * p.s_s2];
    dst[p.d_off + e + uint(idx[p.idx_off + t]) * p.d_s1 + h * p.d_s2] = DST_T(v);
}
