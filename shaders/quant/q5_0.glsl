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

// the 5-bit values put together a word at a time: the nibbles, and bit e of qh in byte e's bit 4
vec4 qraw(QRun s, uint c) {
    return u8f(bytes4(fieldw(q32(s.q + 4u * (c & 3u)), 4u * (c >> 2), 0xFu) | (bits4(s.qh >> (4u * c)) << 4)));
}

vec4 qget(QRun s, uint c) {
    precise vec4 v = s.a * (qraw(s, c) - 16.0);
    return v;
}
