#version 450
// RoPE of x [head_dim, n_head, n_tokens] (f32), with NORM first an RMS norm over each head times
// w[head_dim] (qwen3's q/k norm), with ROWS the result stored straight into row rows[t] of a
// cache [head_dim, n_cells, n_head] (f32 or f16) as set_rows.comp would. One workgroup per
// (head, token): the norm's sums run in rms_norm.comp's order (same WG, same tree) and each
// pair rotates as in rope.comp, so the result has the bits of the separate kernels. With
// SECTIONS (MROPE / IMROPE) pos holds 4 streams of n_tokens values each, as in rope.comp.
// With STORE_V (and ROWS) the workgroup also copies V's row of its (head, token), laid out as x,
// into the V cache, laid out as y, at the same cell: set_rows.comp's store, in this dispatch.
// With WITH_Q (and ROWS) the first q_n_head * n_tokens workgroups are the queries' (xq, wq into
// yq, laid out by the q_* fields, no cache): q's and K's norm and RoPE in one dispatch, each
// workgroup computing as the separate dispatch would. The rotation's flags and sections are then
// defines (ROPE_NEOX, ROPE_USE_FF, ROPE_INTERLEAVED, ROPE_SECTIONS) to leave room for q's fields.
// With K_ROT the rotated rows (q's too) are Walsh-Hadamard rotated in runs of K_ROT, times
// K_ROT_SCALE, before they are stored, as hadamard.comp rotates them in place (V's by V_ROT
// alike); with DST_Q (ROWS) the caches are quantised, of kv_quant.glsl's type KVQ_TYPE, their
// fields in bytes, each block written as set_rows_q.comp writes it: the bits of rms_norm, rope,
// hadamard and set_rows_q one after another.
#include "common.glsl"
#include "rope.glsl"

#ifdef DST_F16
#extension GL_EXT_shader_16bit_storage : require
#define DST_T float16_t
#else
#define DST_T float
#endif
#ifndef K_ROT
#define K_ROT 0
#endif
#ifndef V_ROT
#define V_ROT 0
#endif
#if defined(DST_Q) && !defined(ROWS)
#error "DST_Q: the quantised store is a cache's"
#endif

layout(constant_id = 0) const uint WG = 64;
layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) readonly buffer W { float w[]; };
layout(binding = 2) readonly buffer Pos { int pos[]; };
layout(binding = 3) readonly buffer FF { float freq_factors[]; };
#ifdef DST_Q
layout(binding = 4) buffer Y { uint y_w[]; };
#define QBUF y_w
#include "kv_quant.glsl"
#else
layout(binding = 4) writeonly buffer Y { DST_T y[]; };
#endif
layout(binding = 5) readonly buffer Rows { int rows[]; };
#if defined(STORE_V) || defined(WITH_Q)
layout(binding = 6) readonly buffer V { float v_src[]; };     // unused by WITH_Q without STORE_V
#ifdef DST_Q
layout(binding = 7) buffer VD { uint vd_w[]; };
#else
layout(binding = 7) writeonly buffer VD { DST_T v_dst[]; };
#endif
#endif
#ifdef WITH_Q
#if !defined(ROWS) || defined(ATTN_TEMP)
#error "WITH_Q: the queries ride in K's cache-storing dispatch, without a temperature"
#endif
layout(binding = 8) readonly buffer XQ { float xq[]; };
layout(binding = 9) readonly buffer WQ { float wq[]; };
layout(binding = 10) writeonly buffer YQ { float yq[]; };
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
#ifndef WITH_Q
    uint use_ff;
    uint neox;
#endif
    uint rows_off;
    float eps;
    float theta_scale;
    float freq_scale;
    float attn_factor;
    float ext_factor;   // YaRN (0: off) and its correction dims
    float corr_low;
    float corr_high;
#ifndef WITH_Q
    uint interleaved;   // IMROPE rather than MROPE
#endif
    uint v_off;         // STORE_V: V's offset (floats) and its cache's (elements)
    uint vd_off;
#ifdef WITH_Q
    uint q_n_head;      // the queries: heads, x's offset and strides, their norm weight, y's layout
    uint q_x_off;
    uint q_x_s1;
    uint q_x_s2;
    uint q_w_off;
    uint q_y_off;
    uint q_y_head;
    uint q_y_tok;
#else
    float temp_scale;   // ATTN_TEMP: the attention temperature's scale and floor (rope.glsl)
    float temp_floor;
    uvec4 sections;     // pairs per stream t, h, w, e; all 0 without sections
#endif
} p;

#ifdef WITH_Q
#define P_NEOX ROPE_NEOX
#define P_USE_FF ROPE_USE_FF
#define P_INTERLEAVED ROPE_INTERLEAVED
#define P_SECTIONS uvec4(ROPE_SECTIONS)
#define X_AT(i) (is_q ? xq[i] : x[i])
#define W_AT(i) (is_q ? wq[i] : w[i])
#else
#define P_NEOX p.neox
#define P_USE_FF p.use_ff
#define P_INTERLEAVED p.interleaved
#define P_SECTIONS p.sections
#define X_AT(i) x[i]
#define W_AT(i) w[i]
#endif

#include "reduce.glsl"
#include "hadamard_runs.glsl"

shared float row_sh[MAX_HEAD];
#if K_ROT || defined(DST_Q)
#define HELD 1   // the rotated row is held in shared memory, then rotated and stored
shared float out_sh[MAX_HEAD];
#endif
#if defined(DST_Q) && defined(STORE_V)
shared float v_sh[MAX_HEAD];
#endif

#ifdef DST_Q
// the row of head_dim values in buf (times scale) quantised into the words of BUF from byte b0,
// a block an invocation
#define QUANT_ROW(BUF, buf, scale, head_dim, b0, lid)                                           \
    for (uint g_ = (lid); g_ < (head_dim) / 32u; g_ += WG) {                                   \
        float x_[32];                                                                          \
        [[unroll]] for (uint j_ = 0u; j_ < 32u; ++j_) {                                        \
            x_[j_] = buf[32u * g_ + j_] * (scale);                                             \
        }                                                                                      \
        KVQ_STORE_BLOCK(BUF, KVQ_TYPE, x_, (b0) + g_ * kvq_bytes(KVQ_TYPE))                    \
    }
#endif

void main() {
    uint row = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
#ifdef WITH_Q
    const bool is_q = row < p.q_n_head * p.n_tokens;
    row -= is_q ? 0u : p.q_n_head * p.n_tokens;
    const uint n_head = is_q ? p.q_n_head : p.n_head;
    const uint x_off = is_q ? p.q_x_off : p.x_off, x_s1 = is_q ? p.q_x_s1 : p.x_s1, x_s2 = is_q ? p.q_x_s2 : p.x_s2;
    const uint w_off = is_q ? p.q_w_off : p.w_off;
#else
    const uint n_head = p.n_head, x_off = p.x_off, x_s1 = p.x_s1, x_s2 = p.x_s2, w_off = p.w_off;
#endif
    if (row >= n_head * p.n_tokens) {
        return;
    }
    const uint h = row % n_head, t = row / n_head, lid = reduce_lane();
    const uint xb = x_off + h * x_s1 + t * x_s2;
#ifdef NORM
    precise float sum = 0.0;
    for (uint c = lid; c < p.head_dim; c += WG) {
        const float v = X_AT(xb + c);
        sum += v * v;
    }
    sum = workgroup_sum(sum);
    // precise, as in rms_norm.comp: the same bits in every kernel
    precise float mean_eps = sum / float(p.head_dim) + p.eps;
    const float scale = inversesqrt(mean_eps);
    for (uint c = lid; c < p.head_dim; c += WG) {
        const float v = X_AT(xb + c) * scale;
        row_sh[c] = v * W_AT(w_off + c);
    }
#else
    for (uint c = lid; c < p.head_dim; c += WG) {
        row_sh[c] = X_AT(xb + c);
    }
#endif
    barrier();

#ifdef HELD
#define STORE(at, v) out_sh[at] = (v);
#ifdef WITH_Q
    const uint qyb = p.q_y_off + h * p.q_y_head + t * p.q_y_tok;
#endif
#elif defined(WITH_Q)
#define STORE(at, v) if (is_q) { yq[qyb + (at)] = (v); } else { y[yb + (at)] = DST_T(v); }
    const uint qyb = p.q_y_off + h * p.q_y_head + t * p.q_y_tok;
#else
#define STORE(at, v) y[yb + (at)] = DST_T(v);
#endif
#ifdef ROWS
    const uint cell = uint(rows[p.rows_off + t]);
    const uint yb = p.y_off + h * p.y_head + cell * p.y_tok;
#ifdef STORE_V
#ifdef WITH_Q
    if (!is_q) {
#else
    {
#endif
        const uint vb = p.v_off + h * p.x_s1 + t * p.x_s2, vdb = p.vd_off + h * p.y_head + cell * p.y_tok;
#ifdef DST_Q
        for (uint c = lid; c < p.head_dim; c += WG) {
            v_sh[c] = v_src[vb + c];
        }
#if V_ROT
        HADAMARD_RUNS(v_sh, V_ROT, p.head_dim, lid)
#endif   // quantised with K's blocks, at the end
#else
        for (uint c = lid; c < p.head_dim; c += WG) {
            v_dst[vdb + c] = DST_T(v_src[vb + c]);
        }
#endif
    }
#endif
#else
    const uint yb = p.y_off + h * p.y_head + t * p.y_tok;
#endif
#ifdef WITH_Q
    const float temp = 1.0;
#else
    const float temp = attn_temperature(pos[p.pos_off + t], p.temp_scale, p.temp_floor);   // rope.glsl
#endif
    const uint rot_pairs = p.n_dims / 2u;
    for (uint i = lid; i < p.head_dim / 2u; i += WG) {
        if (i >= rot_pairs) {   // dims past n_dims pass through unchanged
            STORE(2u * i, row_sh[2u * i] * temp)
            STORE(2u * i + 1u, row_sh[2u * i + 1u] * temp)
            continue;
        }
        const uvec2 ab = rope_dims(i, rot_pairs, P_NEOX != 0u);
        const uint a = ab.x, b = ab.y;
        const float ff = P_USE_FF != 0u ? freq_factors[p.ff_off + i] : 1.0;
#ifdef SECTIONS
        const uint stream = rope_stream(i, P_SECTIONS, P_INTERLEAVED != 0u);
#else
        const uint stream = 0u;
#endif
        const vec2 r = rope_pair(row_sh[a], row_sh[b], pos[p.pos_off + t + stream * p.n_tokens], i, p.theta_scale,
                                 p.freq_scale, ff, p.attn_factor, p.ext_factor, vec2(p.corr_low, p.corr_high));
        STORE(a, r.x * temp)
        STORE(b, r.y * temp)
    }
#ifdef HELD
#if K_ROT
    HADAMARD_RUNS(out_sh, K_ROT, p.head_dim, lid)
    const float rs = K_ROT_SCALE;
#else
    barrier();
    const float rs = 1.0;
#endif
#ifdef WITH_Q
    if (is_q) {
        for (uint c = lid; c < p.head_dim; c += WG) {
            yq[qyb + c] = out_sh[c] * rs;
        }
        return;
    }
#endif
#if defined(DST_Q) && defined(STORE_V)
    // K's blocks and V's in one pass, a block an invocation, each quantised by the same code
    {
        const uint nb = p.head_dim / 32u;
        const uint vdb = p.vd_off + h * p.y_head + cell * p.y_tok;
#if V_ROT
        const float vs = V_ROT_SCALE;
#else
        const float vs = 1.0;
#endif
        for (uint g = lid; g < 2u * nb; g += WG) {
            const bool is_v = g >= nb;
            const uint gb = is_v ? g - nb : g;
            float x[32];
            [[unroll]] for (uint j = 0u; j < 32u; ++j) {
                x[j] = is_v ? v_sh[32u * gb + j] * vs : out_sh[32u * gb + j] * rs;
            }
            const uint b0 = (is_v ? vdb : yb) + gb * kvq_bytes(KVQ_TYPE);
            uint ow[KVQ_WORDS];
            KVQ_BLOCK_WORDS(KVQ_TYPE, x, b0, ow)
            if (is_v) {
                KVQ_WRITE_WORDS(vd_w, KVQ_TYPE, ow, b0)
            } else {
                KVQ_WRITE_WORDS(y_w, KVQ_TYPE, ow, b0)
            }
        }
    }
#elif defined(DST_Q)
    QUANT_ROW(y_w, out_sh, rs, p.head_dim, yb, lid)
#else
    for (uint c = lid; c < p.head_dim; c += WG) {
        y[yb + c] = DST_T(out_sh[c] * rs);
    }
#endif
#endif
}
