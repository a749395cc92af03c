// Q8_0: 32 elements in 34 bytes: fp16 d, 32 signed bytes. value = q * d. The raw values are the
// bytes with the sign bit flipped (q + 128), so they convert as unsigned bytes.
#define QK 32
#define QTS 34
#define QR 32
#define QALIGN 2
// units: two words (chunks u and u + 4: 4 lanes read 16 bytes of a block and 16 floats of x at once)
#define QU 4
#define QU_R 1
#define QU_C 2
uint qu_run(uint u, uint i) { return 0u; }
uint qu_ch(uint u, uint c) { return u + 4u * c; }
#include "access.glsl"

struct QRun { float a; float b; uint q; };

QRun qrun(uint blk, uint r) {
    const float d = qf16(blk);
    return QRun(d, -128.0 * d, blk + 2u);
}

vec4 qraw(QRun s, uint c) { return u8f(bytes4(q32(s.q + 4u * c) ^ 0x80808080u)); }

vec4 qget(QRun s, uint c) {
    precise vec4 v = (qraw(s, c) - 128.0) * s.a;
    return v;
}
