// Q3_K: 256 elements in 110 bytes: 32 bytes of high bits (bit e / 32 of byte e % 32), 64 bytes of
// 2-bit low values (laid out as in Q2_K), 12 bytes of 6-bit scales (one per 16 elements, stored
// plus 32), fp16 d. q = low - 4 * (1 - high) = (low | high << 2) - 4;
// value = (d * (sc - 32)) * q, as gguf.quants computes it.
#define QK 256
#define QTS 110
#define QR 16
#define QALIGN 2
// units: 16 bytes of 2-bit low values, all four fields (runs r, r + 2, r + 4, r + 6 of a half)
#define QU 4
#define QU_R 4
#define QU_C 4
uint qu_run(uint u, uint i) { return 8u * (u >> 1) + (u & 1u) + 2u * i; }
uint qu_ch(uint u, uint c) { return c; }
#include "access.glsl"

struct QRun { float a; float b; uint q; uint shift; uint h; uint hbit; };

QRun qrun(uint blk, uint r) {
    const uint lo = (q8(blk + 96u + (r & 7u)) >> (4u * (r >> 3))) & 0xFu;
    const uint hi = (q8(blk + 104u + (r & 3u)) >> (2u * (r >> 2))) & 3u;
    const int sc = int(lo | (hi << 4)) - 32;
    precise float dl = qf16(blk + 108u) * float(sc);
    const uint h = r >> 3, rr = r & 7u;
    return QRun(dl, -4.0 * dl, blk + 32u + 32u * h + 16u * (rr & 1u), 2u * (rr >> 1), blk + 16u * (r & 1u), r >> 1);
}

vec4 qraw(QRun s, uint c) {
    // qs is followed by the scales, hmask by qs; the 3-bit values are put together a word at a time
    return u8f(bytes4(fieldw(q32n(s.q, c), s.shift, 3u) | (fieldw(q32n(s.h, c), s.hbit, 1u) << 2)));
}

vec4 qget(QRun s, uint c) {
    precise vec4 v = s.a * (qraw(s, c) - 4.0);
    return v;
}
