// F16: plain halves, converted exactly. A "block" is 4 elements; qelem reads one.
#define QK 4
#define QTS 8
#define QR 4
#define QALIGN 2
#define QPLAIN 1
#include "access.glsl"

struct QRun { float a; float b; uint p; };

QRun qrun(uint blk, uint r) { return QRun(1.0, 0.0, blk); }

vec4 qraw(QRun s, uint c) { return vec4(unpackHalf2x16(q32(s.p)), unpackHalf2x16(q32(s.p + 4u))); }

float qelem(uint row, uint k) { return qf16(row + 2u * k); }

vec4 qget(QRun s, uint c) { return qraw(s, c); }
