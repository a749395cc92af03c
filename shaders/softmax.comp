#version 450
// Masked softmax over dim 0 of f32 rows (ggml soft_max_ext, plus softcap):
//   x = s * scale; x = softcap * tanh(x) when softcap != 0 (scale then already divided by it);
//   x += slope_i2 * mask[i3 % nem3][i2 % nem2][i1][:];  out = exp(x - max) / sum
// Rows whose every x is -inf come out as zeros. With SINKS (attention sinks, gpt-oss) row i2's
// sink value joins the max and adds exp(sink - max) to the sum, with no output of its own (as
// ggml's soft_max with sinks). One workgroup per row (x: i1, y: i2, z: i3); out is contiguous
// and may be the input itself. Defines: WG (a power of two), HAS_MASK, SINKS.
#include "common.glsl"
#include "attn_common.glsl"

layout(local_size_x = WG) in;

layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) buffer Out { float dst[]; };         // each invocation rereads only its own
#if HAS_MASK
layout(binding = 2) readonly buffer Mask { uint m_u32[]; };  // f16
#endif
#if SINKS
layout(binding = 2 + HAS_MASK) readonly buffer Sinks { float sinks[]; };   // one a head (i2)
#endif

layout(push_constant) uniform Push {
    uint ne0; uint x_off; uint x_nb1; uint x_nb2;
    uint x_nb3; uint o_off; uint m_off; uint m_nb1;
    uint m_nb2; uint m_nb3; uint nem2; uint nem3;
    float scale; float softcap; float max_bias;
    uint s_off;
} p;

shared float red[WG];

float reduce_max(float v) {
    red[gl_LocalInvocationID.x] = v;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1u) {
        if (gl_LocalInvocationID.x < s) {
            red[gl_LocalInvocationID.x] = max(red[gl_LocalInvocationID.x], red[gl_LocalInvocationID.x + s]);
        }
        barrier();
    }
    const float r = red[0];
    barrier();
    return r;
}

float reduce_sum(float v) {
    red[gl_LocalInvocationID.x] = v;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1u) {
        if (gl_LocalInvocationID.x < s) {
            red[gl_LocalInvocationID.x] += red[gl_LocalInvocationID.x + s];
        }
        barrier();
    }
    const float r = red[0];
    barrier();
    return r;
}

void main() {
    const uint t = gl_LocalInvocationID.x;
    const uint i1 = gl_WorkGroupID.x, i2 = gl_WorkGroupID.y, i3 = gl_WorkGroupID.z;
    const uint src = p.x_off + i3 * p.x_nb3 + i2 * p.x_nb2 + i1 * p.x_nb1;
    const uint dst_row = p.o_off + ((i3 * gl_NumWorkGroups.y + i2) * gl_NumWorkGroups.x + i1) * p.ne0;
#if HAS_MASK
    const uint m_row = p.m_off + (i3 % p.nem3) * p.m_nb3 + (i2 % p.nem2) * p.m_nb2 + i1 * p.m_nb1;
    const float slope = p.max_bias > 0.0 ? alibi_slope(i2, gl_NumWorkGroups.y, p.max_bias) : 1.0;
#endif

    float mx = ATTN_NEG_INF;
    for (uint i = t; i < p.ne0; i += WG) {
        float v = x[src + i] * p.scale;
        if (p.softcap != 0.0) {
            v = p.softcap * tanh(clamp(v, -15.0, 15.0));
        }
#if HAS_MASK
        v += slope * attn_half(m_u32, m_row + i);
#endif
        dst[dst_row + i] = v;
        mx = max(mx, v);
    }
    mx = reduce_max(mx);
#if SINKS
    const float sink = sinks[p.s_off + i2];
    mx = max(mx, sink);
#endif
    if (mx == ATTN_NEG_INF) {
        for (uint i = t; i < p.ne0; i += WG) {
            dst[dst_row + i] = 0.0;
        }
        return;
    }
    float sum = 0.0;
    for (uint i = t; i < p.ne0; i += WG) {
        const float e = exp(dst[dst_row + i] - mx);
        dst[dst_row + i] = e;
        sum += e;
    }
    sum = reduce_sum(sum);
#if SINKS
    sum += exp(sink - mx);
#endif
    const float inv = 1.0 / sum;
    for (uint i = t; i < p.ne0; i += WG) {
        dst[dst_row + i] *= inv;
    }
}
