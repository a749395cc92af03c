// The 6-bit (scale, min) pair of sub-block r (0..7) from the 12 packed bytes at byte `b`
// (Q4_K and Q5_K; gguf.quants Q4_K.get_scale_min).
#ifndef VKRT_KSCALE_GLSL
#define VKRT_KSCALE_GLSL

uvec2 kscale(uint b, uint r) {
    if (r < 4u) {
        return uvec2(q8(b + r) & 63u, q8(b + r + 4u) & 63u);
    }
    const uint md = q8(b + r + 4u);
    return uvec2((md & 0xFu) | ((q8(b + r - 4u) >> 2) & 0x30u), (md >> 4) | ((q8(b + r) >> 2) & 0x30u));
}

#endif
