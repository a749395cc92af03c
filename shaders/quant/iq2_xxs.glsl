// IQ2_XXS: 256 elements in 66 bytes: fp16 d, then 8 bytes per 32 elements: 4 indices into
// iq2xxs_grid (8 values each), and a word of 4 x 7 sign bits (indices into ksigns_iq2xs, one per
// 8 elements) under a 4-bit scale. value = ((d * (0.5 + sc)) * 0.25) * grid * sign, as gguf.quants
// computes it (a sign is exact: raw values carry it).
#define QK 256
#define QTS 66
#define QR 16
#define QALIGN 2
// runs: half of a 32-element group (2 grid indices) under the group's scale, its 2 x 7 sign bits
// shifted down so that a chunk's fields sit at constant shifts
#define IQ_GRID iq2xxs_grid
#include "iq_common.glsl"

struct QRun { float a; float b; uint q; uint aux; };

QRun qrun(uint blk, uint r) {
    const uint g = blk + 2u + 8u * (r >> 1), aux = q32(g + 4u);
    precise float db = (qf16(blk) * (0.5 + u8f(aux >> 28))) * 0.25;
    return QRun(db, 0.0, q16(g + 2u * (r & 1u)), aux >> (14u * (r & 1u)));
}

vec4 qraw(QRun s, uint c) {
    const uint l = c >> 1, h = c & 1u;
    const uint signs = QSIGNS((s.aux >> (7u * l)) & 127u) >> (4u * h);
    return flip4(grid4(QGRID(2u * wbyte(s.q, l) + h)), signs);
}
