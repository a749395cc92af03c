// Q5_K: 256 elements in 176 bytes: fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins (as Q4_K),
// 32 bytes of high bits (bit e / 32 of byte e % 32), 128 bytes of low nibbles (as Q4_K).
// value = (d * sc) * q - (dmin * m), as gguf.quants computes it.
#define QK 256
#define QTS 176
#define QR 32
#define QALIGN 4
// units: 16 bytes of low nibbles, both nibbles (chunks 4 (u % 2) .. + 3 of runs 2 (u / 2), + 1): the
// scales are decoded once for 32 elements
#define QU 8
#define QU_R 2
#define QU_C 4
uint qu_run(uint u, uint i) { return 2u * (u >> 1) + i; }
uint qu_ch(uint u, uint c) { return 4u * (u & 1u) + c; }
#include "access.glsl"
#include "kscale.glsl"

struct QRun { float a; float b; uint q; uint shift; uint h; uint hbit; };

QRun qrun(uint blk, uint r) {
    const vec2 d = unpackHalf2x16(qw(blk));
    const uvec2 sm = kscale(blk + 4u, r);
    precise float dl = d.x * u8f(sm.x);
    precise float ml = d.y * u8f(sm.y);
    return QRun(dl, -ml, blk + 48u + 32u * (r >> 1), 4u * (r & 1u), blk + 16u, r);
}

vec4 qraw(QRun s, uint c) {
    const uvec4 lo = field4(qw(s.q + 4u * c), s.shift, 0xFu);
    const uvec4 hi = field4(qw(s.h + 4u * c), s.hbit, 1u);
    return u8f(lo | (hi << 4));
}

vec4 qget(QRun s, uint c) {
    precise vec4 v = s.a * qraw(s, c) + s.b;
    return v;
}
