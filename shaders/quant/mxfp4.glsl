// MXFP4: 32 elements in 17 bytes: an e8m0 scale byte e, 16 bytes of 4-bit indices into
// kvalues_mxfp4 (e2m1 values doubled; low nibbles = elements 0..15). value = d * kvalue with d =
// 2^(e - 128) (half the e8m0 scale, for the doubled values), built from its bits as gguf.quants'
// e8m0_to_fp32_half does (e < 2: a subnormal). Blocks are byte-aligned.
#define QK 32
#define QTS 17
#define QR 32
#define QALIGN 1
// units: one word of nibbles, both nibbles, as Q4_0 (units32.glsl)
#include "units32.glsl"
#define IQ_CODEBOOK kvalues_mxfp4
#include "iq_common.glsl"

struct QRun { float a; float b; uint q; };

QRun qrun(uint blk, uint r) {
    const uint e = q8(blk);
    return QRun(uintBitsToFloat(e < 2u ? 0x00200000u << e : (e - 1u) << 23), 0.0, blk + 1u);
}

vec4 qraw(QRun s, uint c) { return mxfp4_4(field4(q32(s.q + 4u * (c & 3u)), 4u * (c >> 2), 0xFu)); }
