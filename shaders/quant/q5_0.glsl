// Q5_0: 32 elements in 22 bytes: fp16 d, 32 high bits (bit i of element i), 16 bytes of low
// nibbles (low nibbles = elements 0..15). value = d * (q - 16), as gguf.quants computes it.
#define QK 32
#define QTS 22
#define QR 32
#define QALIGN 2
// units: one word of nibbles, both nibbles (units32.glsl)
#include "units32.glsl"
#include "access.glsl"

struct QRun { float a; float b; uint qh; uint q; };

QRun qrun(uint blk, uint r) {
    const float d = qf16(blk);
    return QRun(d, -16.0 * d, q32(blk + 2u), blk + 6u);
}

vec4 qraw(QRun s, uint c) { return u8f(q5_bytes(q32(s.q + 4u * (c & 3u)), s.qh, c)); }

vec4 qget(QRun s, uint c) {
    precise vec4 v = s.a * (qraw(s, c) - 16.0);
    return v;
}
