// IQ3_S: 256 elements in 110 bytes: fp16 d, 64 bytes of low index bits, 8 bytes of high index
// bits (bit j % 8 of byte j / 8; a 9-bit index into iq3s_grid, 4 values each), 32 sign bytes (one
// per 8 elements), 4 bytes of 4-bit scales (one per 32 elements).
// value = (d * (1 + 2 sc)) * grid * sign, as gguf.quants computes it.
#define QK 256
#define QTS 110
#define QR 16
#define QALIGN 2
// runs: half of a 32-element group (4 grid indices) under the group's scale, with its high bits
// and signs shifted down so that a chunk's fields sit at constant shifts
#define IQ_GRID iq3s_grid
#include "iq_common.glsl"

struct QRun { float a; float b; uint q; uint qh; uint signs; };

QRun qrun(uint blk, uint r) {
    const uint g = r >> 1, h = r & 1u;
    const uint sc = (q8(blk + 106u + (g >> 1)) >> (4u * (g & 1u))) & 0xFu;
    precise float db = qf16(blk) * u8f(1u + 2u * sc);
    return QRun(db, 0.0, q32(blk + 2u + 4u * r), q8(blk + 66u + g) >> (4u * h), q16(blk + 74u + 2u * r));
}

vec4 qraw(QRun s, uint c) {
    const uint gi = wbyte(s.q, c) | (((s.qh >> c) & 1u) << 8);
    return flip4(grid4(QGRID(gi)), s.signs >> (4u * c));
}
