// Shared by the attention kernels: f16 access through uint arrays, ALiBi slopes, mask block codes.
#ifndef VKRT_ATTN_COMMON_GLSL
#define VKRT_ATTN_COMMON_GLSL

// Element i of an f16 array stored as uints (works without 16-bit storage).
#define attn_half_bits(arr, i) ((arr[(i) >> 1] >> (((i) & 1u) << 4)) & 0xFFFFu)
#define attn_half(arr, i) unpackHalf2x16(attn_half_bits(arr, i)).x

#define ATTN_NEG_INF uintBitsToFloat(0xFF800000u)

// Start of every flash-attention running max: finite, so exp(old - new) is 1, never NaN, while a
// row is fully masked.
#define FA_NEG_BIG (-1.7014117e38)

// mask_opt: 2 bits per Br x Bc mask block, 16 blocks per uint (fa_mask_opt.comp writes them)
#define FA_MIXED 0u
#define FA_ALL_NEG_INF 1u
#define FA_ALL_ZERO 2u

// ALiBi slope of head h (ggml): heads below the largest power of two n2 <= n_head get m0^(h+1),
// the rest m1^(2(h-n2)+1), with m0 = 2^(-max_bias/n2), m1 = 2^(-max_bias/(2 n2)).
float alibi_slope(uint h, uint n_head, float max_bias) {
    const uint n2 = 1u << findMSB(n_head);
    const float m0 = exp2(-max_bias / float(n2));
    const float m1 = exp2(-(max_bias / 2.0) / float(n2));
    return h < n2 ? pow(m0, float(h + 1u)) : pow(m1, float(2u * (h - n2) + 1u));
}

// The factor on a row's O and its sum L once an attention sink of score `sink` (no value)
// joins the row's softmax of running max m and sum l (the max moves to the sink where larger).
float attn_sink_factor(float m, inout float l, float sink) {
    if (sink > m) {
        const float ms = exp(m - sink);
        l = l * ms + 1.0;
        return ms;
    }
    l += exp(sink - m);
    return 1.0;
}

#endif
