// Q6_K: 256 elements in 210 bytes: 128 bytes of low nibbles, 64 bytes of 2-bit high parts,
// 16 signed scales (one per 16 elements), fp16 d. Element e (h = e / 128, r = e % 128): low
// nibble (r / 64) of byte 64 h + r % 64, high field (r / 32) of byte 128 + 32 h + r % 32.
// value = (d * sc) * (q - 32), as gguf.quants computes it.
#define QK 256
#define QTS 210
#define QR 16
#define QALIGN 2
// units: 16 bytes of low nibbles, both nibbles (runs r, r + 4 of a 128-element half)
#define QU 8
#define QU_R 2
#define QU_C 4
uint qu_run(uint u, uint i) { return 8u * (u >> 2) + (u & 3u) + 4u * i; }
uint qu_ch(uint u, uint c) { return c; }
#include "access.glsl"

struct QRun { float a; float b; uint q; uint qshift; uint h; uint hshift; };

QRun qrun(uint blk, uint r) {
    const int sc = int(q8(blk + 192u + r) << 24) >> 24;
    precise float dl = qf16(blk + 208u) * float(sc);
    const uint h = r >> 3, rr = r & 7u;
    return QRun(dl, -32.0 * dl, blk + 64u * h + 16u * (rr & 3u), 4u * (rr >> 2),
                blk + 128u + 32u * h + 16u * (rr & 1u), 2u * (rr >> 1));
}

vec4 qraw(QRun s, uint c) {
    // ql and qh are followed by the scales; the 6-bit values are put together a word at a time
    return u8f(bytes4(fieldw(q32n(s.q, c), s.qshift, 0xFu) | (fieldw(q32n(s.h, c), s.hshift, 3u) << 4)));
}

vec4 qget(QRun s, uint c) {
    precise vec4 v = s.a * (qraw(s, c) - 32.0);
    return v;
}
