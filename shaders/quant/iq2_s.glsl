// IQ2_S: 256 elements in 82 bytes: fp16 d, 32 bytes of low index bits, 32 sign bytes (one per 8
// elements), 8 bytes of 2-bit high index bits (index j: bits 2 (j % 4) of byte j / 4; a 10-bit
// index into iq2s_grid, 8 values each), 8 bytes of 4-bit scales (one per 16 elements).
// value = ((d * (0.5 + sc)) * 0.25) * grid * sign, as gguf.quants computes it.
#define QK 256
#define QTS 82
#define QR 16
#define QALIGN 2
// units: a run (2 index bytes, 2 sign bytes)
#define IQ_GRID iq2s_grid
#include "iq_common.glsl"

// q: the run's two low index bytes, their high bits from bit 16; signs: its two sign bytes
struct QRun { float a; float b; uint q; uint signs; };

QRun qrun(uint blk, uint r) {
    const uint sh = 4u * (r & 1u);
    const uint sc = (q8(blk + 74u + (r >> 1)) >> sh) & 0xFu;
    precise float db = (qf16(blk) * (0.5 + u8f(sc))) * 0.25;
    const uint qh = (q8(blk + 66u + (r >> 1)) >> sh) & 0xFu;
    return QRun(db, 0.0, q16(blk + 2u + 2u * r) | (qh << 16), q16(blk + 34u + 2u * r));
}

vec4 qraw(QRun s, uint c) {
    const uint e = c >> 1, h = c & 1u;
    const uint gi = wbyte(s.q, e) | (((s.q >> (16u + 2u * e)) & 3u) << 8);
    return flip4(grid4(QGRID(2u * gi + h)), s.signs >> (8u * e + 4u * h));
}
