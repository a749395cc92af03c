// IQ2_XS: 256 elements in 74 bytes: fp16 d, 32 16-bit codes (9-bit index into iq2xs_grid, 7-bit
// index into ksigns_iq2xs; 8 elements each), 8 bytes of 4-bit scales (one per 16 elements).
// value = ((d * (0.5 + sc)) * 0.25) * grid * sign, as gguf.quants computes it.
#define QK 256
#define QTS 74
#define QR 16
#define QALIGN 2
// units: a run (its two codes, 4 bytes)
#define IQ_GRID iq2xs_grid
#include "iq_common.glsl"

struct QRun { float a; float b; uint q; };

QRun qrun(uint blk, uint r) {
    const uint sc = (q8(blk + 66u + (r >> 1)) >> (4u * (r & 1u))) & 0xFu;
    precise float db = (qf16(blk) * (0.5 + u8f(sc))) * 0.25;
    return QRun(db, 0.0, q32(blk + 2u + 4u * r));
}

vec4 qraw(QRun s, uint c) {
    const uint code = (s.q >> (16u * (c >> 1))) & 0xFFFFu, h = c & 1u;
    return flip4(grid4(QGRID(2u * (code & 511u) + h)), QSIGNS(code >> 9) >> (4u * h));
}
