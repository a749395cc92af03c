// IQ4_XS: 256 elements in 136 bytes: fp16 d, 16 bits of 2-bit high scale parts, 4 bytes of 4-bit
// low scale parts (one 6-bit scale, stored plus 32, per 32 elements), 128 bytes of 4-bit indices
// into kvalues_iq4nl (16 bytes a sub-block: low nibbles its elements 0..15, high 16..31).
// value = (d * (sc - 32)) * kvalue, as gguf.quants computes it.
#define QK 256
#define QTS 136
#define QR 32
#define QALIGN 4
// units: 8 of a sub-block's 16 bytes, both nibbles (chunks 2h, 2h + 1, 2h + 4, 2h + 5 of run u / 2,
// h = u % 2)
#define QU 16
#define QU_R 1
#define QU_C 4
uint qu_run(uint u, uint i) { return u >> 1; }
uint qu_ch(uint u, uint c) { return 2u * (u & 1u) + (c & 1u) + 4u * (c >> 1); }
#define IQ_CODEBOOK kvalues_iq4nl
#include "iq_common.glsl"

struct QRun { float a; float b; uint q; };

QRun qrun(uint blk, uint r) {
    const uint lo = (q8(blk + 4u + (r >> 1)) >> (4u * (r & 1u))) & 0xFu;
    const uint hi = (q16(blk + 2u) >> (2u * r)) & 3u;
    precise float dl = qf16(blk) * float(int(lo | (hi << 4)) - 32);
    return QRun(dl, 0.0, blk + 8u + 16u * r);
}

vec4 qraw(QRun s, uint c) { return iq4nl4(field4(qw(s.q + 4u * (c & 3u)), 4u * (c >> 2), 0xFu)); }
