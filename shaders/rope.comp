#version 450
// Rotary position embedding on x [head_dim, n_head, n_tokens] (f32), positions pos[n_tokens] (i32).
// NORMAL rotates pairs (2i, 2i+1), NEOX pairs (i, i + n_dims/2); dims >= n_dims pass through.
// theta = pos * freq_base^(-2i/n_dims) * freq_scale / freq_factor[i]; with ext_factor YaRN
// (rope.glsl's rope_pair)
// With SECTIONS (MROPE / IMROPE, NEOX pairs) pos holds 4 streams of n_tokens values each and
// pair i reads the stream rope_stream picks; without it the section fields are unused.
// With ATTN_TEMP every output (rotated or not) is multiplied by the token's attention
// temperature (rope.glsl's attn_temperature).
#include "common.glsl"
#include "rope.glsl"

layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) readonly buffer Pos { int pos[]; };
layout(binding = 2) readonly buffer FF { float freq_factors[]; };
layout(binding = 3) writeonly buffer Y { float y[]; };

layout(push_constant) uniform Push {
    uint head_dim;
    uint n_dims;
    uint n_head;
    uint n_tokens;
    uint x_off;
    uint x_s1;
    uint x_s2;
    uint y_off;
    uint y_s1;
    uint y_s2;
    uint pos_off;
    uint ff_off;
    uint use_ff;
    uint neox;
    float theta_scale;
    float freq_scale;
    float attn_factor;
    float ext_factor;   // YaRN (0: off) and its correction dims
    float corr_low;
    float corr_high;
    uint interleaved;   // IMROPE rather than MROPE
    uvec4 sections;     // pairs per stream t, h, w, e; all 0 without sections
    float temp_scale;   // ATTN_TEMP: the attention temperature's scale and floor (rope.glsl)
    float temp_floor;
} p;

void main() {
    const uint half_dim = p.head_dim / 2;
    const uint idx = global_index();
    if (idx >= half_dim * p.n_head * p.n_tokens) {
        return;
    }
    const uint i = idx % half_dim;
    const uint h = (idx / half_dim) % p.n_head;
    const uint t = idx / (half_dim * p.n_head);
    const uint xb = p.x_off + h * p.x_s1 + t * p.x_s2;
    const uint yb = p.y_off + h * p.y_s1 + t * p.y_s2;

    const float temp = attn_temperature(pos[p.pos_off + t], p.temp_scale, p.temp_floor);
    const uint rot_pairs = p.n_dims / 2;
    if (i >= rot_pairs) {  // dims past n_dims pass through unchanged
        y[yb + 2 * i] = x[xb + 2 * i] * temp;
        y[yb + 2 * i + 1] = x[xb + 2 * i + 1] * temp;
        return;
    }
    const uvec2 ab = rope_dims(i, rot_pairs, p.neox != 0);
    const uint a = ab.x, b = ab.y;
    const float ff = p.use_ff != 0 ? freq_factors[p.ff_off + i] : 1.0;
#ifdef SECTIONS
    const uint stream = rope_stream(i, p.sections, p.interleaved != 0);
#else
    const uint stream = 0;
#endif
    const vec2 r = rope_pair(x[xb + a], x[xb + b], pos[p.pos_off + t + stream * p.n_tokens], i, p.theta_scale,
                             p.freq_scale, ff, p.attn_factor, p.ext_factor, vec2(p.corr_low, p.corr_high));
    y[yb + a] = r.x * temp;
    y[yb + b] = r.y * temp;
}
