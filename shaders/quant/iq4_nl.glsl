// IQ4_NL: 32 elements in 18 bytes: fp16 d, 16 bytes of 4-bit indices into the codebook
// kvalues_iq4nl (low nibbles = elements 0..15). value = d * kvalue, as gguf.quants computes it.
#define QK 32
#define QTS 18
#define QR 32
#define QALIGN 2
// units: one word of nibbles, both nibbles, as Q4_0 (units32.glsl)
#include "units32.glsl"
#define IQ_CODEBOOK kvalues_iq4nl
#include "iq_common.glsl"

struct QRun { float a; float b; uint q; };

QRun qrun(uint blk, uint r) { return QRun(qf16(blk), 0.0, blk + 2u); }

vec4 qraw(QRun s, uint c) { return iq4nl4(field4(q32(s.q + 4u * (c & 3u)), 4u * (c >> 2), 0xFu)); }
