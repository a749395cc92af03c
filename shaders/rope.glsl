// RoPE helpers shared by rope.comp and norm_rope.comp, so both give the same bits.
#ifndef VKRT_ROPE_GLSL
#define VKRT_ROPE_GLSL

// The rotation of one pair. `precise` keeps compilers from contracting it into FMAs
// differently in the two kernels. theta = pos * theta_scale^i * freq_scale / ff (ff = 1 without
// frequency factors). With ext_factor != 0, YaRN as ggml's rope_yarn: the interpolated angle
// (times freq_scale) and the extrapolated one (without) mixed by a ramp that falls from 1 to 0
// over the pairs between the correction dims corr, and the magnitude scaled by
// 1 + 0.1 ln(1 / freq_scale).
vec2 rope_pair(float x0, float x1, int pos, uint i, float theta_scale, float freq_scale, float ff,
               float attn_factor, float ext_factor, vec2 corr) {
    precise float theta;
    float mscale = attn_factor;
    if (ext_factor != 0.0) {
        precise float extrap = float(pos) * pow(theta_scale, float(i));
        extrap = extrap / ff;
        precise float interp = freq_scale * extrap;
        const float ramp = (1.0 - clamp((float(i) - corr.x) / max(0.001, corr.y - corr.x), 0.0, 1.0)) * ext_factor;
        theta = interp * (1.0 - ramp) + extrap * ramp;
        mscale *= 1.0 + 0.1 * log(1.0 / freq_scale);
    } else {
        theta = float(pos) * pow(theta_scale, float(i)) * freq_scale;
        theta = theta / ff;
    }
    precise float c = cos(theta) * mscale;
    precise float s = sin(theta) * mscale;
    precise float y0 = x0 * c - x1 * s;
    precise float y1 = x0 * s + x1 * c;
    return vec2(y0, y1);
}

// The attention temperature of Llama 4's scaling as Ministral 3 applies it (mistral3's
// attention.temperature_scale): with ATTN_TEMP the queries at position pos are multiplied, after
// their rotation, by log(floor(pos / floor_scale) + 1) * scale + 1 (1 below floor_scale);
// without it by 1, which the compilers fold away
float attn_temperature(int pos, float scale, float floor_scale) {
#ifdef ATTN_TEMP
    return log(floor(float(pos) / floor_scale) + 1.0) * scale + 1.0;
#else
    return 1.0;
#endif
}

// The dims pair i (< rot_pairs, the rotated dims' pairs) rotates: (i, i + rot_pairs) with NEOX
// pairing, else (2i, 2i + 1)
uvec2 rope_dims(uint i, uint rot_pairs, bool neox) {
    return neox ? uvec2(i, i + rot_pairs) : uvec2(2u * i, 2u * i + 1u);
}

// The position stream (0 t, 1 h, 2 w, 3 e) that rotates pair i under multi-section RoPE with
// `sections` pairs per stream (ggml's rope_multi); all sections 0: stream 0 (plain RoPE).
// The sector is i % sum(sections). MROPE: consecutive sector ranges. IMROPE (interleaved):
// stream sector % 3 while the sector is below 3 * sections[sector % 3], else stream 3.
uint rope_stream(uint i, uvec4 sections, bool interleaved) {
    const uint n = sections.x + sections.y + sections.z + sections.w;
    if (n == 0u) {
        return 0u;
    }
    const uint sector = i % n;
    if (interleaved) {
        const uint k = sector % 3u;
        return sector < 3u * sections[k] ? k : 3u;
    }
    const uint end_t = sections.x, end_h = end_t + sections.y, end_w = end_h + sections.z;
    return sector < end_t ? 0u : sector < end_h ? 1u : sector < end_w ? 2u : 3u;
}

// The stream pair i takes where the rotation's flags are defines (ROPE_SECTIONS,
// ROPE_INTERLEAVED; plain RoPE without ROPE_SECTIONS)
uint rope_stream_defined(uint i) {
#ifdef ROPE_SECTIONS
    return rope_stream(i, uvec4(ROPE_SECTIONS), ROPE_INTERLEAVED != 0);
#else
    return 0u;
#endif
}

#endif
