#version 450
// RoPE of x [head_dim, n_head, n_tokens] (f32), with NORM first an RMS norm over each head times
// w[head_dim] (qwen3's q/k norm), with ROWS the result stored straight into row rows[t] of a
// cache [head_dim, n_cells, n_head] (f32 or f16) as set_rows.comp would. One workgroup per
// (head, token): the norm's sums run in rms_norm.comp's order (same WG, same tree) and each
// pair rotates as in rope.comp, so the result has the bits of the separate kernels. With
// SECTIONS (MROPE / IMROPE) pos holds 4 streams of n_tokens values each, as in rope.comp.
// With STORE_V (and ROWS) the workgroup also copies V's row of its (head, token), laid out as x,
// into the V cache, laid out as y, at the same cell: set_rows.comp's store, in this dispatch.
#include "common.glsl"
#include "rope.glsl"

#ifdef DST_F16
#extension GL_EXT_shader_16bit_storage : require
#define DST_T float16_t
#else
#define DST_T float
#endif

layout(constant_id = 0) const uint WG = 64;
layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) readonly buffer W { float w[]; };
layout(binding = 2) readonly buffer Pos { int pos[]; };
layout(binding = 3) readonly buffer FF { float freq_factors[]; };
layout(binding = 4) writeonly buffer Y { DST_T y[]; };
layout(binding = 5) readonly buffer Rows { int rows[]; };
#ifdef STORE_V
layout(binding = 6) readonly buffer V { float v_src[]; };
layout(binding = 7) writeonly buffer VD { DST_T v_dst[]; };
#endif

layout(push_constant) uniform Push {
    uint head_dim;
    uint n_dims;
    uint n_head;
    uint n_tokens;
    uint x_off;
    uint x_s1;
    uint x_s2;
    uint w_off;
    uint y_off;
    uint y_head;    // elements between heads of y
    uint y_tok;     // between tokens (ROWS: between cache rows)
    uint pos_off;
    uint ff_off;
    uint use_ff;
    uint neox;
    uint rows_off;
    float eps;
    float theta_scale;
    float freq_scale;
    float attn_factor;
    float ext_factor;   // YaRN (0: off) and its correction dims
    float corr_low;
    float corr_high;
    uint interleaved;   // IMROPE rather than MROPE
    uint v_off;         // STORE_V: V's offset (floats) and its cache's (elements)
    uint vd_off;
    float temp_scale;   // ATTN_TEMP: the attention temperature's scale and floor (rope.glsl)
    float temp_floor;
    uvec4 sections;     // pairs per stream t, h, w, e; all 0 without sections
} p;

#include "reduce.glsl"

shared float row_sh[MAX_HEAD];

void main() {
    const uint row = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (row >= p.n_head * p.n_tokens) {
        return;
    }
    const uint h = row % p.n_head, t = row / p.n_head, lid = reduce_lane();
    const uint xb = p.x_off + h * p.x_s1 + t * p.x_s2;
#ifdef NORM
    precise float sum = 0.0;
    for (uint c = lid; c < p.head_dim; c += WG) {
        const float v = x[xb + c];
        sum += v * v;
    }
    sum = workgroup_sum(sum);
    const float scale = inversesqrt(sum / float(p.head_dim) + p.eps);
    for (uint c = lid; c < p.head_dim; c += WG) {
        const float v = x[xb + c] * scale;
        row_sh[c] = v * w[p.w_off + c];
    }
#else
    for (uint c = lid; c < p.head_dim; c += WG) {
        row_sh[c] = x[xb + c];
    }
#endif
    barrier();

#ifdef ROWS
    const uint cell = uint(rows[p.rows_off + t]);
    const uint yb = p.y_off + h * p.y_head + cell * p.y_tok;
#ifdef STORE_V
    const uint vb = p.v_off + h * p.x_s1 + t * p.x_s2, vdb = p.vd_off + h * p.y_head + cell * p.y_tok;
    for (uint c = lid; c < p.head_dim; c += WG) {
        v_dst[vdb + c] = DST_T(v_src[vb + c]);
    }
#endif
#else
    const uint yb = p.y_off + h * p.y_head + t * p.y_tok;
#endif
    const float temp = attn_temperature(pos[p.pos_off + t], p.temp_scale, p.temp_floor);   // rope.glsl
    const uint rot_pairs = p.n_dims / 2u;
    for (uint i = lid; i < p.head_dim / 2u; i += WG) {
        if (i >= rot_pairs) {   // dims past n_dims pass through unchanged
            y[yb + 2u * i] = DST_T(row_sh[2u * i] * temp);
            y[yb + 2u * i + 1u] = DST_T(row_sh[2u * i + 1u] * temp);
            continue;
        }
        const uint a = p.neox != 0u ? i : 2u * i;
        const uint b = p.neox != 0u ? i + rot_pairs : 2u * i + 1u;
        const float ff = p.use_ff != 0u ? freq_factors[p.ff_off + i] : 1.0;
#ifdef SECTIONS
        const uint stream = rope_stream(i, p.sections, p.interleaved != 0u);
#else
        const uint stream = 0u;
#endif
        const vec2 r = rope_pair(row_sh[a], row_sh[b], pos[p.pos_off + t + stream * p.n_tokens], i, p.theta_scale,
                                 p.freq_scale, ff, p.attn_factor, p.ext_factor, vec2(p.corr_low, p.corr_high));
        y[yb + a] = DST_T(r.x * temp);
        y[yb + b] = DST_T(r.y * temp);
    }
}
