// Q2_K: 256 elements in 84 bytes: 16 scale bytes (low nibble scale, high nibble min, one per 16
// elements), 64 bytes of 2-bit values, fp16 d, fp16 dmin. Element e: 2-bit field (e % 128) / 32
// of byte 32 * (e / 128) + e % 32. value = (d * sc) * q - (dmin * m), as gguf.quants computes it.
#define QK 256
#define QTS 84
#define QR 16
#define QALIGN 4
// units: 16 bytes of 2-bit values, all four fields (runs r, r + 2, r + 4, r + 6 of a half)
#define QU 4
#define QU_R 4
#define QU_C 4
uint qu_run(uint u, uint i) { return 8u * (u >> 1) + (u & 1u) + 2u * i; }
uint qu_ch(uint u, uint c) { return c; }
#include "access.glsl"

struct QRun { float a; float b; uint q; uint shift; };

QRun qrun(uint blk, uint r) {
    const uint sc = q8(blk + r);
    const vec2 d = unpackHalf2x16(qw(blk + 80u));
    precise float dl = d.x * u8f(sc & 0xFu);
    precise float ml = d.y * u8f(sc >> 4);
    const uint h = r >> 3, rr = r & 7u;
    return QRun(dl, -ml, blk + 16u + 32u * h + 16u * (rr & 1u), 2u * (rr >> 1));
}

vec4 qraw(QRun s, uint c) { return u8f(field4(qw(s.q + 4u * c), s.shift, 3u)); }

vec4 qget(QRun s, uint c) {
    precise vec4 v = s.a * qraw(s, c) + s.b;
    return v;
}
