// Q4_0: 32 elements in 18 bytes: fp16 d, 16 bytes of nibbles (low nibbles = elements 0..15).
// value = d * (q - 8), as gguf.quants computes it.
#define QK 32
#define QTS 18
#define QR 32
#define QALIGN 2
// units: one word of nibbles, both nibbles (units32.glsl)
#include "units32.glsl"
#include "access.glsl"

struct QRun { float a; float b; uint q; };

QRun qrun(uint blk, uint r) {
    const float d = qf16(blk);
    return QRun(d, -8.0 * d, blk + 2u);
}

vec4 qraw(QRun s, uint c) { return u8f(field4(q32(s.q + 4u * (c & 3u)), 4u * (c >> 2), 0xFu)); }

vec4 qget(QRun s, uint c) {
    precise vec4 v = s.a * (qraw(s, c) - 8.0);
    return v;
}
