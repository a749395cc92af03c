// Q5_K: 256 elements in 176 bytes: fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins (as Q4_K),
// 32 bytes of high bits (bit e / 32 of byte e % 32), 128 bytes of low nibbles (as Q4_K).
// value = (d * sc) * q - (dmin * m), as gguf.quants computes it.
#define QK 256
#define QTS 176
#define QR 32
#define QALIGN 4
// units: 16 bytes of low nibbles, both nibbles (chunks 4 (u % 2) .. + 3 of runs 2 (u / 2), + 1): the
// scales are decoded once for 32 elements
#define QU 8
#define QU_R 2
#define QU_C 4
uint qu_run(uint u, uint i) { return 2u * (u >> 1) + i; }
uint qu_ch(uint u, uint c) { return 4u * (u & 1u) + c; }
#include "access.glsl"
#include "kscale.glsl"

struct QRun { float a; float b; uint q; uint shift; uint h; uint hbit; };

// run r of the block at byte blk from its 16 header bytes (fp16 d and dmin, the 12 scale bytes)
QRun qrun_hdr(uvec4 h, uint blk, uint r) {
    const vec2 dm = kscale_dm(h, r);
    return QRun(dm.x, -dm.y, blk + 48u + 32u * (r >> 1), 4u * (r & 1u), blk + 16u, r);
}

QRun qrun(uint blk, uint r) { return qrun_hdr(khdr(blk), blk, r); }

// the 5-bit values put together a word at a time
uint q5k_word(QRun s, uint q, uint h) { return fieldw(q, s.shift, 0xFu) | (fieldw(h, s.hbit, 1u) << 4); }

vec4 qraw(QRun s, uint c) { return u8f(bytes4(q5k_word(s, qw(s.q + 4u * c), qw(s.h + 4u * c)))); }

// Wide loads (as Q4_K's): unit u's 16 bytes of low nibbles and the 16 bytes of high bits its
// chunks take (bytes 16 (u % 2) .. + 15 of the 32), one load each; the header in one load
#define QWIDE_OK 1
#define QHDR16 1
#ifdef QWIDE
struct QWide { uvec4 q; uvec4 h; };
QWide qwide16(uint blk, uint u) {
    return QWide(w16_data[(blk + 48u + 16u * u) >> 4], w16_data[(blk + 16u + 16u * (u & 1u)) >> 4]);
}
vec4 qraw16(QRun s, QWide w, uint c) { return u8f(bytes4(q5k_word(s, w.q[c], w.h[c]))); }
#endif

vec4 qget(QRun s, uint c) {
    precise vec4 v = s.a * qraw(s, c) + s.b;
    return v;
}
