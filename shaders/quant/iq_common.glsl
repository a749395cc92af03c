// Shared by the IQ quants and MXFP4: their lookup tables (iq_tables.glsl, generated from gguf's)
// and the reads of them. Grid entries and codebook values are exact small numbers; signs flip
// the float's sign bit, exactly as gguf's multiplication by -1.
#ifndef VKRT_QUANT_IQ_COMMON_GLSL
#define VKRT_QUANT_IQ_COMMON_GLSL
#include "access.glsl"
#include "iq_tables.glsl"

// byte i of a table of words
#define TBYTE(t, i) (((t)[(i) >> 2] >> (8u * ((i) & 3u))) & 0xFFu)

// the four byte values of a grid word as floats
vec4 grid4(uint w) { return u8f(bytes4(w)); }

// v with the sign of element i flipped where bit i of s is set (higher bits of s are ignored)
vec4 flip4(vec4 v, uint s) {
    return uintBitsToFloat(floatBitsToUint(v) ^ ((uvec4(s) >> uvec4(0u, 1u, 2u, 3u)) << 31));
}

// signed bytes as floats
vec4 sbytes4(uvec4 b) { return vec4(ivec4(b << 24) >> 24); }

// the codebook values at four 4-bit indices
vec4 iq4nl4(uvec4 i) {
    return sbytes4(uvec4(TBYTE(kvalues_iq4nl, i.x), TBYTE(kvalues_iq4nl, i.y), TBYTE(kvalues_iq4nl, i.z),
                         TBYTE(kvalues_iq4nl, i.w)));
}
vec4 mxfp4_4(uvec4 i) {
    return sbytes4(uvec4(TBYTE(kvalues_mxfp4, i.x), TBYTE(kvalues_mxfp4, i.y), TBYTE(kvalues_mxfp4, i.z),
                         TBYTE(kvalues_mxfp4, i.w)));
}

// IQ1_S / IQ1_M: grid entry gi's elements 4h .. 4h + 3 (-1, 0 or 1) plus delta, as gguf's grid + delta
vec4 iq1_grid4(uint gi, uint h, float delta) {
    return (u8f(field4(iq1s_grid[gi], 4u * h, 0xFu)) - 1.0) + delta;
}

#endif
