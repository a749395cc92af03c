// TQ1_0: 256 elements in 54 bytes: 48 bytes and 4 bytes of base-3 digits, fp16 d. Digit m of
// byte b is ((b * 3^m mod 256) * 3) >> 8; elements 32 m + i (m < 5) are digit m of byte i < 32,
// 160 + 16 m + i of byte 32 + i < 48, 240 + 4 m + i of byte 48 + i. value = d * (digit - 1), as
// gguf.quants computes it. Four neighbouring elements are one digit of four neighbouring bytes.
#define QK 256
#define QTS 54
#define QR 16
#define QALIGN 2
// units: a run (16 elements: the same digit of 16 bytes, or of 4 bytes 4 times)
#include "access.glsl"

struct QRun { float a; float b; uint blk; uint j; };

QRun qrun(uint blk, uint r) {
    const float d = qf16(blk + 52u);
    return QRun(d, -d, blk, 4u * r);
}

vec4 qraw(QRun s, uint c) {
    const uint j = s.j + c;   // elements 4j .. 4j + 3 of the block
    const uint m = j < 40u ? j >> 3 : j < 60u ? (j - 40u) >> 2 : j - 60u;
    const uint off = j < 40u ? 4u * (j & 7u) : j < 60u ? 32u + 4u * (j & 3u) : 48u;
    const uint pow3 = m < 4u ? (0x1B090301u >> (8u * m)) & 0xFFu : 81u;
    return u8f((((bytes4(q32(s.blk + off)) * pow3) & 0xFFu) * 3u) >> 8);
}

vec4 qget(QRun s, uint c) {
    precise vec4 v = s.a * (qraw(s, c) - 1.0);
    return v;
}
