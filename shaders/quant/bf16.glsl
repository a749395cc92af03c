// BF16: the upper 16 bits of an f32. A "block" is 4 elements; qelem reads one.
#define QK 4
#define QTS 8
#define QR 4
#define QALIGN 2
#define QPLAIN 1
#include "access.glsl"

struct QRun { float a; float b; uint p; };

QRun qrun(uint blk, uint r) { return QRun(1.0, 0.0, blk); }

vec4 qraw(QRun s, uint c) {
    const uint a = q32(s.p), b = q32(s.p + 4u);
    return uintBitsToFloat(uvec4(a << 16, a & 0xFFFF0000u, b << 16, b & 0xFFFF0000u));
}

float qelem(uint row, uint k) { return uintBitsToFloat(q16(row + 2u * k) << 16); }

vec4 qget(QRun s, uint c) { return qraw(s, c); }
