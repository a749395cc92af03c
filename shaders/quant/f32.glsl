// F32: plain floats. A "block" is 4 elements so the generic kernels step in vec4s; qelem reads one.
#define QK 4
#define QTS 16
#define QR 4
#define QALIGN 4
#define QPLAIN 1
#include "access.glsl"

struct QRun { float a; float b; uint p; };

QRun qrun(uint blk, uint r) { return QRun(1.0, 0.0, blk); }

vec4 qraw(QRun s, uint c) {
    const uint i = s.p >> 2;
    return uintBitsToFloat(uvec4(QBUF[i], QBUF[i + 1u], QBUF[i + 2u], QBUF[i + 3u]));
}

float qelem(uint row, uint k) { return uintBitsToFloat(qw(row + 4u * k)); }

vec4 qget(QRun s, uint c) { return qraw(s, c); }
