// IQ3_XXS: 256 elements in 98 bytes: fp16 d, 64 indices into iq3xxs_grid (4 values each), then a
// word per 32 elements: 4 x 7 sign bits (indices into ksigns_iq2xs, one per 8 elements) under a
// 4-bit scale. value = ((d * (0.5 + sc)) * 0.5) * grid * sign, as gguf.quants computes it.
#define QK 256
#define QTS 98
#define QR 16
#define QALIGN 2
// runs: half of a 32-element group (4 grid indices) under the group's scale, its 2 x 7 sign bits
// shifted down so that a chunk's fields sit at constant shifts
#define IQ_GRID iq3xxs_grid
#include "iq_common.glsl"

struct QRun { float a; float b; uint q; uint aux; };

QRun qrun(uint blk, uint r) {
    const uint aux = q32(blk + 66u + 4u * (r >> 1));
    precise float db = (qf16(blk) * (0.5 + u8f(aux >> 28))) * 0.5;
    return QRun(db, 0.0, q32(blk + 2u + 4u * r), aux >> (14u * (r & 1u)));
}

vec4 qraw(QRun s, uint c) {
    const uint signs = QSIGNS((s.aux >> (7u * (c >> 1))) & 127u) >> (4u * (c & 1u));
    return flip4(grid4(QGRID(wbyte(s.q, c))), signs);
}
