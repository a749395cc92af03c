// IQ3_S: 256 elements in 110 bytes: fp16 d, 64 bytes of low index bits, 8 bytes of high index
// bits (bit j % 8 of byte j / 8; a 9-bit index into iq3s_grid, 4 values each), 32 sign bytes (one
// per 8 elements), 4 bytes of 4-bit scales (one per 32 elements).
// value = (d * (1 + 2 sc)) * grid * sign, as gguf.quants computes it.
#define QK 256
#define QTS 110
#define QR 32
#define QALIGN 2
// units: half a run (4 grid indices, 16 elements) with the run's high bits, signs and scale
#define QU 16
#define QU_R 1
#define QU_C 4
uint qu_run(uint u, uint i) { return u >> 1; }
uint qu_ch(uint u, uint c) { return 4u * (u & 1u) + c; }
#define IQ_GRID iq3s_grid
#include "iq_common.glsl"

struct QRun { float a; float b; uint q; uint qh; uint signs; };

QRun qrun(uint blk, uint r) {
    const uint sc = (q8(blk + 106u + (r >> 1)) >> (4u * (r & 1u))) & 0xFu;
    precise float db = qf16(blk) * u8f(1u + 2u * sc);
    return QRun(db, 0.0, blk + 2u + 8u * r, q8(blk + 66u + r), q32(blk + 74u + 4u * r));
}

vec4 qraw(QRun s, uint c) {
    const uint gi = q8(s.q + c) | (((s.qh >> c) & 1u) << 8);
    return flip4(grid4(QGRID(gi)), s.signs >> (4u * c));
}
