// Q5_1: 32 elements in 24 bytes: fp16 d, fp16 m, 32 high bits, 16 bytes of low nibbles.
// value = (d * q) + m, two roundings (no fused multiply-add), as gguf.quants computes it.
#define QK 32
#define QTS 24
#define QR 32
#define QALIGN 4
// units: one word of nibbles, both nibbles (units32.glsl)
#include "units32.glsl"
#include "access.glsl"

struct QRun { float a; float b; uint qh; uint q; };

QRun qrun(uint blk, uint r) {
    const vec2 dm = unpackHalf2x16(qw(blk));
    return QRun(dm.x, dm.y, qw(blk + 4u), blk + 8u);
}

vec4 qraw(QRun s, uint c) { return u8f(q5_bytes(qw(s.q + 4u * (c & 3u)), s.qh, c)); }

vec4 qget(QRun s, uint c) {
    precise vec4 v = s.a * qraw(s, c) + s.b;
    return v;
}
