// IQ2_XXS: 256 elements in 66 bytes: fp16 d, then 8 bytes per 32 elements: 4 indices into
// iq2xxs_grid (8 values each), and a word of 4 x 7 sign bits (indices into ksigns_iq2xs, one per
// 8 elements) under a 4-bit scale. value = ((d * (0.5 + sc)) * 0.25) * grid * sign, as gguf.quants
// computes it (a sign is exact: raw values carry it).
#define QK 256
#define QTS 66
#define QR 32
#define QALIGN 2
// units: half a run (2 grid indices, 16 elements) with the run's signs and scale
#define QU 16
#define QU_R 1
#define QU_C 4
uint qu_run(uint u, uint i) { return u >> 1; }
uint qu_ch(uint u, uint c) { return 4u * (u & 1u) + c; }
#define IQ_GRID iq2xxs_grid
#include "iq_common.glsl"

struct QRun { float a; float b; uint q; uint aux; };

QRun qrun(uint blk, uint r) {
    const uint aux = q32(blk + 6u + 8u * r);
    precise float db = (qf16(blk) * (0.5 + u8f(aux >> 28))) * 0.25;
    return QRun(db, 0.0, blk + 2u + 8u * r, aux);
}

vec4 qraw(QRun s, uint c) {
    const uint l = c >> 1, h = c & 1u;
    const uint signs = QSIGNS((s.aux >> (7u * l)) & 127u) >> (4u * h);
    return flip4(grid4(QGRID(2u * q8(s.q + l) + h)), signs);
}
