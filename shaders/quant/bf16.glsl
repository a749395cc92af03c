// BF16: the upper 16 bits of an f32. A "block" is 4 elements; qelem reads one.
#define QTS 8
#define QALIGN 2
#include "plain.glsl"

vec4 qraw(QRun s, uint c) {
    const uint a = q32(s.p), b = q32(s.p + 4u);
    return uintBitsToFloat(uvec4(a << 16, a & 0xFFFF0000u, b << 16, b & 0xFFFF0000u));
}

float qelem(uint row, uint k) { return uintBitsToFloat(q16(row + 2u * k) << 16); }
