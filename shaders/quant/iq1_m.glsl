// IQ1_M: 256 elements in 56 bytes: 32 bytes of low index bits, 16 bytes of 4-bit fields (one per
// 8 elements: 3 high index bits, an 11-bit index into iq1s_grid, and the sign of the shift), four
// 16-bit words of 3-bit scales (one per 16 elements) whose top nibbles together are the fp16 d.
// value = (d * (2 sc + 1)) * (grid +- IQ1S_DELTA), as gguf.quants computes it.
#define QK 256
#define QTS 56
#define QR 16
#define QALIGN 4
// units: a run (2 index bytes and their fields)
#define IQ_GRID iq1s_grid
#include "iq_common.glsl"
#include "iq1_grid.glsl"

struct QRun { float a; float b; uint q; uint qh; };

QRun qrun(uint blk, uint r) {
    const uint s01 = qw(blk + 48u), s23 = qw(blk + 52u);
    const uint d = ((s01 >> 12) & 0xFu) | ((s01 >> 24) & 0xF0u) | ((s23 >> 4) & 0xF00u) | ((s23 >> 16) & 0xF000u);
    const uint sc = (q16(blk + 48u + 2u * (r >> 2)) >> (3u * (r & 3u))) & 7u;
    precise float dl = unpackHalf2x16(d).x * u8f(2u * sc + 1u);
    return QRun(dl, 0.0, q16(blk + 2u * r), q8(blk + 32u + r));
}

vec4 qraw(QRun s, uint c) {
    const uint e = c >> 1, f = (s.qh >> (4u * e)) & 0xFu;
    return iq1_grid4(wbyte(s.q, e) | ((f & 7u) << 8), c & 1u, (f & 8u) != 0u ? -IQ1S_DELTA : IQ1S_DELTA);
}
