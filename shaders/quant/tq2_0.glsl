// TQ2_0: 256 elements in 66 bytes: 64 bytes of 2-bit values q (element e: field (e % 128) / 32 of
// byte 32 (e / 128) + e % 32, as Q2_K), fp16 d. value = d * (q - 1), as gguf.quants computes it.
#define QK 256
#define QTS 66
#define QR 32
#define QALIGN 2
// units: 16 bytes, all four fields (chunks 4 (u % 2) .. + 3 of runs 4 (u / 2) .. + 3)
#define QU 4
#define QU_R 4
#define QU_C 4
uint qu_run(uint u, uint i) { return 4u * (u >> 1) + i; }
uint qu_ch(uint u, uint c) { return 4u * (u & 1u) + c; }
#include "access.glsl"

struct QRun { float a; float b; uint q; uint shift; };

QRun qrun(uint blk, uint r) {
    const float d = qf16(blk + 64u);
    return QRun(d, -d, blk + 32u * (r >> 2), 2u * (r & 3u));
}

vec4 qraw(QRun s, uint c) { return u8f(field4(q32(s.q + 4u * c), s.shift, 3u)); }

vec4 qget(QRun s, uint c) {
    precise vec4 v = s.a * (qraw(s, c) - 1.0);
    return v;
}
