#version 450
// Combine flash-attention splits along KV: out = sum_s O_s * exp(M_s - M) / sum_s L_s * exp(M_s - M)
// with M = max_s M_s; zeros where every split was fully masked (L = 0). One thread per output
// element; `rows` = batch * N * n_head output rows of HSV values each, split s at s * rows.
#include "common.glsl"
#include "attn_common.glsl"

layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer Part { float part[]; };
layout(binding = 1) readonly buffer ML { vec2 ml[]; };
layout(binding = 2) writeonly buffer Out { float dst[]; };

layout(push_constant) uniform Push {
    uint rows; uint hsv; uint n_split; uint o_off;
} p;

void main() {
    const uint i = global_index();
    if (i >= p.rows * p.hsv) {
        return;
    }
    const uint row = i / p.hsv;
    float mx = FA_NEG_BIG;
    for (uint s = 0; s < p.n_split; ++s) {
        mx = max(mx, ml[s * p.rows + row].x);
    }
    float l = 0.0;
    float acc = 0.0;
    for (uint s = 0; s < p.n_split; ++s) {
        const vec2 m_l = ml[s * p.rows + row];
        const float w = exp(m_l.x - mx);
        l += m_l.y * w;
        acc += part[s * p.rows * p.hsv + i] * w;
    }
    dst[p.o_off + i] = l > 0.0 ? acc / l : 0.0;
}
