// Shared by the plain (unquantised) types: a "block" is 4 elements with no scale; the including
// type defines QTS, QALIGN, qraw (4 elements) and qelem (one element) after including this.
#define QK 4
#define QR 4
#define QPLAIN 1
#include "access.glsl"

struct QRun { float a; float b; uint p; };

QRun qrun(uint blk, uint r) { return QRun(1.0, 0.0, blk); }

vec4 qraw(QRun s, uint c);

vec4 qget(QRun s, uint c) { return qraw(s, c); }
