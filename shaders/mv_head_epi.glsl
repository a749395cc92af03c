// mul_mv.comp's HEAD_EPI: attention's per-head work after the q, k or v projection, done by the
// last workgroup to finish each head's rows instead of a norm_rope dispatch after a barrier:
// EPI_NORM the head's RMS norm times its weight, EPI_ROPE its rotation, then the store (EPI_ROWS:
// into row rows[t] of a cache, DST_F16 as halves; else into a tensor laid out [head, tokens]).
// Each step is norm_rope.comp's, bit for bit: the norm's sums run as its workgroup of EPI_WG
// invocations runs them (SG_BUTTERFLY, EPI_SG-wide subgroups: this workgroup's first EPI_WG
// invocations are those subgroups, the others add nothing and their subgroups' sums are left
// out), and each pair rotates through rope.glsl. Included after mul_mv's bindings and push
// constants; `e_hb` rows of y make a head's block (its first EPI_HD are normed and stored; a
// gated query's other half stays in y). A workgroup's rows lie in one block (the last of the
// block's workgroups does the head) or are whole blocks (it does their heads itself).
#ifndef VKRT_MV_HEAD_EPI_GLSL
#define VKRT_MV_HEAD_EPI_GLSL
#include "rope.glsl"
#if EPI_NORM
#define BUTTERFLY_SG EPI_SG
#include "butterfly.glsl"
shared float epi_sums[EPI_WG / EPI_SG];
#endif
shared float epi_row[EPI_HD];

// y's token t of head h, stored where norm_rope stores it (after the norm and rotation)
void head_epilogue(uint h, uint ybase, uint ycol) {
    for (uint t = 0u; t < NC; t++) {
        const uint yb = ybase + t * ycol + h * p.e_hb;
#if EPI_NORM
        const uint lid = gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID;
        precise float sum = 0.0;
        if (lid < EPI_WG) {
            for (uint c = lid; c < EPI_HD; c += EPI_WG) {
                const float v = y_data[yb + c];
                sum += v * v;
            }
        }
        sum = subgroup_butterfly(sum);
        if (subgroupElect() && gl_SubgroupID < EPI_WG / EPI_SG) {
            epi_sums[gl_SubgroupID] = sum;
        }
        barrier();
        float total = 0.0;
        for (uint i = 0u; i < EPI_WG / EPI_SG; i++) {
            total += epi_sums[i];
        }
        precise float mean_eps = total / float(EPI_HD) + p.e_eps;   // as rms_norm.comp
        const float scale = inversesqrt(mean_eps);
        for (uint c = gl_LocalInvocationID.x; c < EPI_HD; c += WG) {
            const float v = y_data[yb + c] * scale;
            epi_row[c] = v * hw_data[p.e_w_off + c];
        }
#else
        for (uint c = gl_LocalInvocationID.x; c < EPI_HD; c += WG) {
            epi_row[c] = y_data[yb + c];
        }
#endif
        barrier();
#if EPI_ROWS
        const uint db = p.e_d_off + h * p.e_d_head + uint(epi_rows[p.e_rows_off + t]) * p.e_d_tok;
#else
        const uint db = p.e_d_off + h * p.e_d_head + t * p.e_d_tok;
#endif
#if EPI_ROPE
        const uint rot_pairs = p.e_n_dims / 2u;
        for (uint i = gl_LocalInvocationID.x; i < EPI_HD / 2u; i += WG) {
            if (i >= rot_pairs) {   // dims past n_dims pass through unchanged
                epi_dst[db + 2u * i] = DST_T(epi_row[2u * i]);
                epi_dst[db + 2u * i + 1u] = DST_T(epi_row[2u * i + 1u]);
                continue;
            }
            const uvec2 ab = rope_dims(i, rot_pairs, ROPE_NEOX != 0);
            const uint a = ab.x, b = ab.y;
            const float ff = ROPE_USE_FF != 0 ? epi_ff[p.e_ff_off + i] : 1.0;
            const uint stream = rope_stream_defined(i);
            const vec2 r = rope_pair(epi_row[a], epi_row[b], epi_pos[p.e_pos_off + t + stream * p.e_n_tok], i,
                                     p.e_theta_scale, p.e_freq_scale, ff, p.e_attn_factor, p.e_ext_factor,
                                     vec2(p.e_corr_low, p.e_corr_high));
            epi_dst[db + a] = DST_T(r.x);
            epi_dst[db + b] = DST_T(r.y);
        }
#else
        for (uint c = gl_LocalInvocationID.x; c < EPI_HD; c += WG) {
            epi_dst[db + c] = DST_T(epi_row[c]);
        }
#endif
        barrier();   // epi_row and epi_sums serve the next token
    }
}

#endif
