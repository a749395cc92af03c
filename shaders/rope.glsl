// The rotation of one RoPE pair, shared by rope.comp and norm_rope.comp. `precise` keeps
// compilers from contracting it into FMAs differently in the two kernels, so both give the
// same bits. theta = pos * theta_scale^i * freq_scale / ff (ff = 1 without frequency factors).
#ifndef VKRT_ROPE_GLSL
#define VKRT_ROPE_GLSL

vec2 rope_pair(float x0, float x1, int pos, uint i, float theta_scale, float freq_scale, float ff,
               float attn_factor) {
    precise float theta = float(pos) * pow(theta_scale, float(i)) * freq_scale;
    theta = theta / ff;
    precise float c = cos(theta) * attn_factor;
    precise float s = sin(theta) * attn_factor;
    precise float y0 = x0 * c - x1 * s;
    precise float y1 = x0 * s + x1 * c;
    return vec2(y0, y1);
}

#endif
