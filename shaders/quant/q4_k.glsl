// Q4_K: 256 elements in 144 bytes: fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins (one pair
// per 32 elements), 128 bytes of nibbles (64-element chunks: low nibbles of 32 bytes, then high).
// value = (d * sc) * q - (dmin * m), as gguf.quants computes it.
#define QK 256
#define QTS 144
#define QR 32
#define QALIGN 4
// units: 16 bytes of nibbles, both nibbles (chunks 4 (u % 2) .. + 3 of runs 2 (u / 2), + 1): the
// scales are decoded once for 32 elements
#define QU 8
#define QU_R 2
#define QU_C 4
uint qu_run(uint u, uint i) { return 2u * (u >> 1) + i; }
uint qu_ch(uint u, uint c) { return 4u * (u & 1u) + c; }
#include "access.glsl"
#include "kscale.glsl"

struct QRun { float a; float b; uint q; uint shift; };

// run r of the block at byte blk from its 16 header bytes (fp16 d and dmin, the 12 scale bytes)
QRun qrun_hdr(uvec4 h, uint blk, uint r) {
    const vec2 dm = kscale_dm(h, r);
    return QRun(dm.x, -dm.y, blk + 16u + 32u * (r >> 1), 4u * (r & 1u));
}

QRun qrun(uint blk, uint r) { return qrun_hdr(khdr(blk), blk, r); }

vec4 qraw(QRun s, uint c) { return u8f(field4(qw(s.q + 4u * c), s.shift, 0xFu)); }

// Wide loads (the mat-vec's QWIDE, w16_data the weights as uvec4): unit u's 16 bytes in one load
// (16-byte aligned when the block is), and qraw16 takes the unit's chunk c (< QU_C, a constant once
// unrolled: chunk qu_ch(u, c) of the run is word c of the 16 bytes) from them; the 16 header bytes
// are one load too (qrun_hdr)
#define QWIDE_OK 1
#define QHDR16 1
#ifdef QWIDE
struct QWide { uvec4 q; };
QWide qwide16(uint blk, uint u) { return QWide(w16_data[(blk + 16u + 16u * u) >> 4]); }
vec4 qraw16(QRun s, QWide w, uint c) { return u8f(field4(w.q[c], s.shift, 0xFu)); }
#endif

vec4 qget(QRun s, uint c) {
    precise vec4 v = s.a * qraw(s, c) + s.b;
    return v;
}
