// F16: plain halves, converted exactly. A "block" is 4 elements; qelem reads one.
#define QTS 8
#define QALIGN 2
#include "plain.glsl"

vec4 qraw(QRun s, uint c) { return vec4(unpackHalf2x16(q32(s.p)), unpackHalf2x16(q32(s.p + 4u))); }

float qelem(uint row, uint k) { return qf16(row + 2u * k); }
