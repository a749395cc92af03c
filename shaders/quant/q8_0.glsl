// Q8_0: 32 elements in 34 bytes: fp16 d, 32 signed bytes. value = q * d. The raw values are the
// bytes with the sign bit flipped (q + 128), so they convert as unsigned bytes.
#define QK 32
#define QTS 34
#define QR 32
#define QALIGN 2
// units: two words (units32.glsl)
#include "units32.glsl"
#include "access.glsl"

struct QRun { float a; float b; uint q; };

QRun qrun(uint blk, uint r) {
    const float d = qf16(blk);
    return QRun(d, -128.0 * d, blk + 2u);
}

vec4 qraw(QRun s, uint c) { return u8f(bytes4(q32(s.q + 4u * c) ^ 0x80808080u)); }

vec4 qget(QRun s, uint c) {
    precise vec4 v = s8f4(q32(s.q + 4u * c)) * s.a;
    return v;
}
