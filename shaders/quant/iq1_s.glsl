// IQ1_S: 256 elements in 50 bytes: fp16 d, 32 bytes of low index bits, a 16-bit word per 32
// elements: 4 x 3 high index bits (an 11-bit index into iq1s_grid, 8 values of -1, 0, 1 each), a
// 3-bit scale and the sign of the shift. value = (d * (2 sc + 1)) * (grid +- IQ1S_DELTA), as
// gguf.quants computes it.
#define QK 256
#define QTS 50
#define QR 16
#define QALIGN 2
// runs: half of a 32-element group (2 grid indices) under the group's scale and shift, with its
// high bits shifted down so that a chunk's fields sit at constant shifts
#define IQ_GRID iq1s_grid
#include "iq_common.glsl"
#include "iq1_grid.glsl"

struct QRun { float a; float b; uint q; uint qh; float delta; };

QRun qrun(uint blk, uint r) {
    const uint qh = q16(blk + 34u + 2u * (r >> 1));
    precise float dl = qf16(blk) * u8f(2u * ((qh >> 12) & 7u) + 1u);
    return QRun(dl, 0.0, q16(blk + 2u + 2u * r), qh >> (6u * (r & 1u)),
                (qh & 0x8000u) != 0u ? -IQ1S_DELTA : IQ1S_DELTA);
}

vec4 qraw(QRun s, uint c) {
    const uint e = c >> 1;
    return iq1_grid4(wbyte(s.q, e) | (((s.qh >> (3u * e)) & 7u) << 8), c & 1u, s.delta);
}
