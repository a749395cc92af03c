// The 6-bit (scale, min) pair of sub-block r (0..7) from the 12 packed bytes, read as words w0, w1,
// w2 (Q4_K and Q5_K; gguf.quants Q4_K.get_scale_min). Without a branch: the three
// bytes r & 3, 4 + (r & 3) and 8 + (r & 3) serve both halves, and lanes of one wave take
// different sub-blocks (a branch ran both sides, each waiting on its own loads).
#ifndef VKRT_KSCALE_GLSL
#define VKRT_KSCALE_GLSL

uvec2 kscale_w(uint w0, uint w1, uint w2, uint r) {
    const uint sh = (r & 3u) * 8u;
    const uvec2 lo = uvec2(w0 >> sh, w1 >> sh) & 0xFFu;   // bytes r & 3, 4 + (r & 3)
    const uint hi = (w2 >> sh) & 0xFFu;                    // byte 8 + (r & 3)
    const uvec2 high = uvec2(hi & 0xFu, hi >> 4) | ((lo >> 2) & 0x30u);
    return r < 4u ? lo & 63u : high;
}

// A block's 16 header bytes (fp16 d and dmin, then the 12 bytes) as words, and from them
// (d * scale, dmin * min) of sub-block r
uvec4 khdr(uint blk) { return uvec4(qw(blk), qw(blk + 4u), qw(blk + 8u), qw(blk + 12u)); }

vec2 kscale_dm(uvec4 h, uint r) {
    const vec2 d = unpackHalf2x16(h.x);
    const uvec2 sm = kscale_w(h.y, h.z, h.w, r);
    precise float dl = d.x * u8f(sm.x);
    precise float ml = d.y * u8f(sm.y);
    return vec2(dl, ml);
}

#endif
