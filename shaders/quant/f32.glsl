// F32: plain floats. A "block" is 4 elements so the generic kernels step in vec4s; qelem reads one.
#define QTS 16
#define QALIGN 4
#include "plain.glsl"

vec4 qraw(QRun s, uint c) {
    const uint i = s.p >> 2;
    return uintBitsToFloat(uvec4(QBUF[i], QBUF[i + 1u], QBUF[i + 2u], QBUF[i + 3u]));
}

float qelem(uint row, uint k) { return uintBitsToFloat(qw(row + 4u * k)); }
