// Byte-level reads from the 32-bit word array QBUF (the kernel defines QBUF before including).
// Raw words work on every device, with or without 8/16-bit storage. `b` is a byte offset.
#ifndef VKRT_QUANT_ACCESS_GLSL
#define VKRT_QUANT_ACCESS_GLSL

uint qw(uint b) { return QBUF[b >> 2]; }                                      // b % 4 == 0
uint q8(uint b) { return (QBUF[b >> 2] >> ((b & 3u) * 8u)) & 0xFFu; }
uint q16(uint b) { return (QBUF[b >> 2] >> ((b & 2u) * 8u)) & 0xFFFFu; }      // b % 2 == 0
float qf16(uint b) { return unpackHalf2x16(q16(b)).x; }                        // exact fp16 -> fp32

// the 4 bytes at an even byte offset from the word holding it (lo) and the next (hi); odd: nonzero
// where the offset's bit 1 is set
uint join16(uint lo, uint hi, uint odd) { return odd == 0u ? lo : (lo >> 16) | (hi << 16); }

// 4 bytes at an even offset (QALIGN 1: any offset): one word when the block layout keeps it
// 4-aligned, else pieces of two. Both loads are unconditional (the second repeats the first when
// aligned, never past the data), so invocations with different alignments do not diverge.
uint q32(uint b) {
#if QALIGN == 4
    return QBUF[b >> 2];
#elif QALIGN == 1
    const uint i = b >> 2, sh = (b & 3u) * 8u;
    const uint lo = QBUF[i], hi = QBUF[i + min(sh, 1u)];
    return (lo >> sh) | ((hi << 1u) << (31u - sh));   // a funnel shift; hi's part is 0 when aligned
#else
    const uint i = b >> 2, odd = (b >> 1) & 1u;
    return join16(QBUF[i], QBUF[i + odd], odd);
#endif
}

// The 4 bytes at b + 4c (b even, c a constant once unrolled) where the word after them is still
// in the block (fields followed by scales in the same block): both words are read whatever the
// alignment, so a run's consecutive words share their loads (5 for 4 words, not 8) and its
// alignment test, which depends on b only
// (not for QALIGN 1 layouts, whose offsets may be odd)
#if QALIGN != 1
uint q32n(uint b, uint c) {
#if QALIGN == 4
    return QBUF[(b >> 2) + c];
#else
    const uint i = (b >> 2) + c;
    return join16(QBUF[i], QBUF[i + 1u], b & 2u);
#endif
}
#endif

// the four bytes of a word as uvec4 (byte 0 in x), and the bit field (shift, mask) of each byte;
// written as byte extracts so compilers can use byte-to-float conversions
uint wbyte(uint w, uint i) { return (w >> (8u * i)) & 0xFFu; }                          // byte i of a word
uvec4 bytes4(uint w) { return uvec4(w, w >> 8, w >> 16, w >> 24) & 0xFFu; }
// the four signed bytes of a word as floats, exactly (byte 0 in x; a sign-extending extract and a
// conversion: on the RX 580's compiler fewer instructions than converting the bytes offset by 128)
vec4 s8f4(uint w) {
    const int i = int(w);
    return vec4(bitfieldExtract(i, 0, 8), bitfieldExtract(i, 8, 8), bitfieldExtract(i, 16, 8), bitfieldExtract(i, 24, 8));
}
uint fieldw(uint w, uint shift, uint mask) { return (w >> shift) & (mask * 0x01010101u); }   // in place
// bits 0..3 of v as the lowest bits of bytes 0..3 (the copies x << 7i do not overlap, so the
// product is their union)
uint bits4(uint v) { return ((v & 0xFu) * 0x00204081u) & 0x01010101u; }
// chunk c (4 elements) of a 32-element run of 5-bit values (Q5_0, Q5_1), put together a word at a
// time: the nibbles of word w (low ones for c < 4, high after), bit 4c + i of qh as element i's bit 4
uvec4 q5_bytes(uint w, uint qh, uint c) { return bytes4(fieldw(w, 4u * (c >> 2), 0xFu) | (bits4(qh >> (4u * c)) << 4)); }
uvec4 field4(uint w, uint shift, uint mask) { return bytes4(fieldw(w, shift, mask)); }

// Small unsigned integers as floats by conversion (GCN: v_cvt_f32_ubyte, full rate); building
// them from their bits lost on NVIDIA too (docs/results/2026-12-07-h200-verify-profile-staging.md)
vec4 u8f(uvec4 v) { return vec4(v); }
float u8f(uint v) { return float(v); }

#endif
