// Q4_1: 32 elements in 20 bytes: fp16 d, fp16 m, 16 bytes of nibbles (low nibbles = elements 0..15).
// value = (d * q) + m, two roundings (no fused multiply-add), as gguf.quants computes it.
#define QK 32
#define QTS 20
#define QR 32
#define QALIGN 4
// units: one word of nibbles, both nibbles (chunks u and u + 4: 4 lanes read 16 bytes of a block
// and x in two runs of 16 floats)
#define QU 4
#define QU_R 1
#define QU_C 2
uint qu_run(uint u, uint i) { return 0u; }
uint qu_ch(uint u, uint c) { return u + 4u * c; }
#include "access.glsl"

struct QRun { float a; float b; uint q; };

QRun qrun(uint blk, uint r) {
    const vec2 dm = unpackHalf2x16(qw(blk));
    return QRun(dm.x, dm.y, blk + 4u);
}

vec4 qraw(QRun s, uint c) { return u8f(field4(qw(s.q + 4u * (c & 3u)), 4u * (c >> 2), 0xFu)); }

vec4 qget(QRun s, uint c) {
    precise vec4 v = s.a * qraw(s, c) + s.b;
    return v;
}
