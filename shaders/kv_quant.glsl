// The block types of a quantised KV cache (vkrt/ops/kv_quant.py): 32 elements a block, Q8_0, Q4_0,
// Q4_1, Q5_0, Q5_1 and IQ4_NL in gguf's layouts (shaders/quant/ describes each). set_rows_q.comp
// writes them as ggml's quantize_row_*_ref does (gguf.quants' order of operations and rounding);
// flash_attn.comp reads them 4 elements at a time, or as segments of a block's words, as
// gguf.quants dequantises. A type is a KVQ_*
// constant, passed as a compile-time constant, so every test of it folds away.
// The kernel defines QBUF (a word array, for access.glsl) before including this.
#ifndef VKRT_KV_QUANT_GLSL
#define VKRT_KV_QUANT_GLSL
#include "quant/iq_common.glsl"

const uint KVQ_Q8_0 = 1u;
const uint KVQ_Q4_0 = 2u;
const uint KVQ_Q4_1 = 3u;
const uint KVQ_Q5_0 = 4u;
const uint KVQ_Q5_1 = 5u;
const uint KVQ_IQ4_NL = 6u;

uint kvq_bytes(uint t) {
    return t == KVQ_Q8_0 ? 34u : t == KVQ_Q4_1 ? 20u : t == KVQ_Q5_0 ? 22u : t == KVQ_Q5_1 ? 24u : 18u;
}

// ---- reading: byte offsets in a block, and 4 elements from the words holding them ----

uint kvq_block(uint t, uint e) { return (e >> 5) * kvq_bytes(t); }       // the block of element e
uint kvq_chunk(uint e) { return (e >> 2) & 7u; }                          // its 4-element chunk
// the second header word (Q5's high bits; the others read the first again) and chunk c's data word
uint kvq_hi(uint t) { return t == KVQ_Q5_0 ? 2u : t == KVQ_Q5_1 ? 4u : 0u; }
uint kvq_data(uint t, uint c) {
    return t == KVQ_Q8_0 ? 2u + 4u * c
                         : (t == KVQ_Q4_1 ? 4u : t == KVQ_Q5_0 ? 6u : t == KVQ_Q5_1 ? 8u : 2u) + 4u * (c & 3u);
}

// the 4 bytes at the even byte offset b of the word array BUF (one word for 4-byte blocks)
#define KVQ_W32(BUF, t, b) (kvq_bytes(t) % 4u == 0u ? BUF[(b) >> 2] \
                            : join16(BUF[(b) >> 2], BUF[((b) >> 2) + (((b) >> 1) & 1u)], (b) & 2u))

// elements 4c..4c+3 of a type t block from its first word h (d; m in the high half for Q4_1 and
// Q5_1), the word at kvq_hi (Q5's high bits) and chunk c's data word w
vec4 kvq_dq4(uint t, uint h, uint qh, uint w, uint c) {
    const vec2 dm = unpackHalf2x16(h);
    precise vec4 v;
    if (t == KVQ_Q8_0) {
        v = s8f4(w) * dm.x;
    } else if (t == KVQ_Q4_0) {
        v = dm.x * (u8f(field4(w, 4u * (c >> 2), 0xFu)) - 8.0);
    } else if (t == KVQ_Q4_1) {
        v = dm.x * u8f(field4(w, 4u * (c >> 2), 0xFu)) + dm.y;
    } else if (t == KVQ_Q5_0) {
        v = dm.x * (u8f(q5_bytes(w, qh, c)) - 16.0);
    } else if (t == KVQ_Q5_1) {
        v = dm.x * u8f(q5_bytes(w, qh, c)) + dm.y;
    } else {
        v = dm.x * iq4nl4(field4(w, 4u * (c >> 2), 0xFu));
    }
    return v;
}

// elements e..e+3 (e % 4 == 0, counted from the start of BUF, blocks from there) of type t
#define KVQ_LOAD4(BUF, t, e) kvq_dq4(t, KVQ_W32(BUF, t, kvq_block(t, e)),                             \
                                     KVQ_W32(BUF, t, kvq_block(t, e) + kvq_hi(t)),                    \
                                     KVQ_W32(BUF, t, kvq_block(t, e) + kvq_data(t, kvq_chunk(e))),    \
                                     kvq_chunk(e))

// ---- reading segments: chunks c0..c0+n-1 of one block (n divides 8, c0 a multiple of n) ----
// A segment is held as the words loaded (KVQ_SEG_WORDS of them) and dequantised at use: a whole
// block (n >= 4; Q8_0 n = 8) as the words covering it, a part as its header words (d, m; Q5's
// qh) and a window over its chunks' data. Blocks of 18, 22 and 34 bytes (KVQ_A2) start 2 bytes
// into a word every other block (half their size is odd: blocks of odd index), so a field may
// straddle two words, joined at use (kvq_field).
#define KVQ_A2(t) ((t) == KVQ_Q8_0 || (t) == KVQ_Q4_0 || (t) == KVQ_Q5_0 || (t) == KVQ_IQ4_NL)
#define KVQ_SPAN(t, n) ((t) == KVQ_Q8_0 ? (n) == 8u : (n) >= 4u)
#define KVQ_HW(t) ((t) == KVQ_Q5_0 || (t) == KVQ_Q5_1 ? 2u : 1u)
#define KVQ_SEG_WORDS(t, n) (KVQ_SPAN(t, n) ? ((t) == KVQ_Q8_0 ? 9u : (t) == KVQ_Q5_0 || (t) == KVQ_Q5_1 ? 6u : 5u) \
                                            : KVQ_HW(t) + (n) + (KVQ_A2(t) ? 1u : 0u))

// 1 where the block of element e starts 2 bytes into a word
uint kvq_odd(uint t, uint e) { return KVQ_A2(t) ? (e >> 5) & 1u : 0u; }
// word j of a segment starting at chunk c0, counted from the block's first word
uint kvq_seg_word(uint t, uint n, uint c0, uint j) {
    return KVQ_SPAN(t, n) || j < KVQ_HW(t) ? j : kvq_data(t, 0u) / 4u + (t == KVQ_Q8_0 ? c0 : c0 & 3u) + j - KVQ_HW(t);
}
// chunk i's data: its byte from the segment's first data word (even; the block as if 4-aligned)
uint kvq_seg_f(uint t, uint n, uint i) {
    return KVQ_SPAN(t, n) ? kvq_data(t, 0u) + 4u * (t == KVQ_Q8_0 ? i : i & 3u) : kvq_data(t, 0u) % 4u + 4u * i;
}
// ... and the segment word holding its first byte
uint kvq_seg_lo(uint t, uint n, uint i) { return (KVQ_SPAN(t, n) ? 0u : KVQ_HW(t)) + kvq_seg_f(t, n, i) / 4u; }
// the 4 bytes at byte f (even) of the words lo, hi, the block starting `odd` x 2 bytes later
uint kvq_field(uint lo, uint hi, uint f, uint odd) {
    return (((f >> 1) ^ odd) & 1u) != 0u ? (lo >> 16) | (hi << 16) : (odd != 0u ? hi : lo);
}
// chunk c0 + i from the segment's words r0, r1 (its first two) and lo, hi (at kvq_seg_lo)
vec4 kvq_seg_dq4(uint t, uint n, uint i, uint c0, uint odd, uint r0, uint r1, uint lo, uint hi) {
    const uint h = odd != 0u ? r0 >> 16 : r0;
    const uint qh = t == KVQ_Q5_0 ? kvq_field(r0, r1, 2u, odd) : r1;
    const uint w = KVQ_A2(t) ? kvq_field(lo, hi, kvq_seg_f(t, n, i), odd) : lo;
    return kvq_dq4(t, h, qh, w, c0 + i);
}

// the segment of n chunks at element e into R (SZ = KVQ_SEG_WORDS words), and its chunk i;
// KVQ_SEG_LOAD_AT from a copy of the words from word w0 on (BUF[0] holding word w0)
#define KVQ_SEG_LOAD_AT(BUF, w0, t, n, e, R, SZ)                                                \
    [[unroll]] for (uint j_ = 0u; j_ < SZ; ++j_) {                                             \
        R[j_] = BUF[(kvq_block(t, e) >> 2) - (w0) + kvq_seg_word(t, n, kvq_chunk(e), j_)];    \
    }
#define KVQ_SEG_LOAD(BUF, t, n, e, R, SZ) KVQ_SEG_LOAD_AT(BUF, 0u, t, n, e, R, SZ)
#define KVQ_SEG_DQ4(t, n, R, SZ, i, e)                                                         \
    kvq_seg_dq4(t, n, i, kvq_chunk(e), kvq_odd(t, e), R[0], R[min(1u, SZ - 1u)],               \
                R[kvq_seg_lo(t, n, i)], R[min(kvq_seg_lo(t, n, i) + 1u, SZ - 1u)])

// ---- writing: one block of 32 floats as ggml's reference quantisers write it ----
#ifdef KVQ_WORDS   // the words an invocation writes (the kernel's output array)

// a / b correctly rounded, as C's division (a compiler may lower `/` to a product with the
// reciprocal): the reciprocal's quotient and one fma correction
float kvq_div(float a, float b) {
    const float r = 1.0 / b;
    precise float q = a * r;
    precise float res = fma(fma(-q, b, a), r, q);
    return res;
}

// roundf: half away from zero (gguf.quants' np_roundf)
float kvq_round(float x) {
    const float a = abs(x), f = floor(a);
    precise float b = f + floor(2.0 * (a - f));
    return sign(x) * b;
}

uint kvq_f16(float x) { return packHalf2x16(vec2(x, 0.0)) & 0xFFFFu; }

void kvq_put8(inout uint ow[KVQ_WORDS], uint b, uint v) { ow[b >> 2] |= (v & 0xFFu) << (8u * (b & 3u)); }
void kvq_put16(inout uint ow[KVQ_WORDS], uint b, uint v) { kvq_put8(ow, b, v); kvq_put8(ow, b + 1u, v >> 8); }
void kvq_put32(inout uint ow[KVQ_WORDS], uint b, uint v) { kvq_put16(ow, b, v); kvq_put16(ow, b + 2u, v >> 16); }

// 16 low-nibble bytes (elements j and j + 16) at byte b
void kvq_put_nibbles(inout uint ow[KVQ_WORDS], uint b, uint q[32]) {
    [[unroll]] for (uint j = 0u; j < 16u; ++j) {
        kvq_put8(ow, b + j, (q[j] & 0xFu) | ((q[j + 16u] & 0xFu) << 4));
    }
}

// bit 4 of each element, element j in bit j
uint kvq_high_bits(uint q[32]) {
    uint qh = 0u;
    [[unroll]] for (uint j = 0u; j < 32u; ++j) {
        qh |= (q[j] >> 4) << j;
    }
    return qh;
}

float kvq_iq4(uint i) { return float(int(TBYTE(kvalues_iq4nl, i) << 24) >> 24); }

// ggml's best_index_int8 over the IQ4_NL codebook
uint kvq_iq4_index(float x) {
    if (x <= kvq_iq4(0u)) {
        return 0u;
    }
    if (x >= kvq_iq4(15u)) {
        return 15u;
    }
    uint ml = 0u, mu = 15u;
    while (mu - ml > 1u) {
        const uint mav = (ml + mu) / 2u;
        if (x < kvq_iq4(mav)) {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    return x - kvq_iq4(mu - 1u) < kvq_iq4(mu) - x ? mu - 1u : mu;
}

// sum of w*q*x and of w*q*q (w = x*x) over a block rounded to the IQ4_NL codebook at inverse scale id
vec2 kvq_iq4_sums(float x[32], float id) {
    precise float sumqx = 0.0, sumq2 = 0.0;
    for (uint j = 0u; j < 32u; ++j) {
        precise float al = id * x[j];
        const float q = kvq_iq4(kvq_iq4_index(al));
        precise float w = x[j] * x[j];
        precise float wq = w * q;
        sumqx += wq * x[j];
        sumq2 += wq * q;
    }
    return vec2(sumqx, sumq2);
}

// ggml's quantize_row_iq4_nl_impl for one block, no importance weights, ntry 7: the scale
float kvq_iq4_scale(float x[32], float amax, float mx) {
    if (amax < 1e-15) {
        return 0.0;
    }
    float d = kvq_div(-mx, kvq_iq4(0u));
    vec2 sums = kvq_iq4_sums(x, kvq_div(1.0, d));
    precise float sumqx = sums.x, sumq2 = sums.y;
    d = kvq_div(sumqx, sumq2);
    precise float best = d * sumqx;
    for (int itry = -7; itry <= 7; ++itry) {
        sums = kvq_iq4_sums(x, kvq_div(float(itry) + kvq_iq4(0u), mx));
        sumqx = sums.x;
        sumq2 = sums.y;
        precise float lhs = sumqx * sumqx;
        precise float rhs = best * sumq2;
        if (sumq2 > 0.0 && lhs > rhs) {
            d = kvq_div(sumqx, sumq2);
            best = d * sumqx;
        }
    }
    return d;
}

// the type t block of x at byte b of ow (ow's bytes there zero)
void kvq_quantize(uint t, float x[32], inout uint ow[KVQ_WORDS], uint b) {
    float amax = abs(x[0]), mx = x[0], hi = x[0], lo = x[0];   // the first largest |x|, and max, min
    [[unroll]] for (uint j = 1u; j < 32u; ++j) {
        if (abs(x[j]) > amax) {
            amax = abs(x[j]);
            mx = x[j];
        }
        hi = max(hi, x[j]);
        lo = min(lo, x[j]);
    }
    uint q[32];
    if (t == KVQ_Q8_0) {
        const float d = kvq_div(amax, 127.0);
        const float id = d != 0.0 ? kvq_div(1.0, d) : 0.0;
        kvq_put16(ow, b, kvq_f16(d));
        [[unroll]] for (uint j = 0u; j < 32u; ++j) {
            precise float v = x[j] * id;
            kvq_put8(ow, b + 2u + j, uint(int(kvq_round(v))));
        }
        return;
    }
    if (t == KVQ_IQ4_NL) {
        const float d = kvq_iq4_scale(x, amax, mx);
        const float id = d != 0.0 ? kvq_div(1.0, d) : 0.0;
        kvq_put16(ow, b, kvq_f16(d));
        [[unroll]] for (uint j = 0u; j < 32u; ++j) {
            precise float v = id * x[j];
            q[j] = kvq_iq4_index(v);
        }
        kvq_put_nibbles(ow, b + 2u, q);
        return;
    }
    const bool with_min = t == KVQ_Q4_1 || t == KVQ_Q5_1;
    const uint top = t == KVQ_Q4_0 || t == KVQ_Q4_1 ? 15u : 31u;
    // Q4_0/Q5_0: d = max / -half (8 or 16: exact), q = trunc(x / d + half + 0.5);
    // Q4_1/Q5_1: d = (max - min) / top, q = trunc((x - min) / d + 0.5)
    const float half_ = float((top + 1u) / 2u);
    const float d = with_min ? kvq_div(hi - lo, float(top)) : mx / -half_;
    const float id = d != 0.0 ? kvq_div(1.0, d) : 0.0;
    const float add = with_min ? 0.5 : half_ + 0.5;
    [[unroll]] for (uint j = 0u; j < 32u; ++j) {
        precise float s = with_min ? x[j] - lo : x[j];
        precise float v = s * id + add;
        q[j] = min(top, uint(trunc(v)));
    }
    kvq_put16(ow, b, kvq_f16(d));
    uint at = b + 2u;
    if (with_min) {
        kvq_put16(ow, at, kvq_f16(lo));
        at += 2u;
    }
    if (top == 31u) {
        kvq_put32(ow, at, kvq_high_bits(q));
        at += 4u;
    }
    kvq_put_nibbles(ow, at, q);
}

// x's block quantised as the words it covers from byte b0 (2-byte aligned) into ow_: quantised
// from a word's first byte (every byte index a constant, so the words stay in registers; at a
// run-time byte the compilers indexed a scratch array, ~30 us a block on an H100), moved up 2
// bytes where b0 is 2 into a word
#define KVQ_BLOCK_WORDS(t, x, b0, ow_)                                                          \
    {                                                                                          \
        uint q_[KVQ_WORDS];                                                                    \
        [[unroll]] for (uint w_ = 0u; w_ < KVQ_WORDS; ++w_) {                                  \
            q_[w_] = 0u;                                                                       \
        }                                                                                      \
        kvq_quantize(t, x, q_, 0u);                                                            \
        const bool odd_ = ((b0) & 2u) != 0u;                                                   \
        [[unroll]] for (uint w_ = 0u; w_ < KVQ_WORDS; ++w_) {                                  \
            ow_[w_] = odd_ ? (q_[w_] << 16) | (w_ > 0u ? q_[max(w_, 1u) - 1u] >> 16 : 0u) : q_[w_]; \
        }                                                                                      \
    }
// ow_ (KVQ_BLOCK_WORDS') written into the word array BUF: a block that shares its first or last
// word with a neighbour's writes its own bytes of that word atomically
#define KVQ_WRITE_WORDS(BUF, t, ow_, b0)                                                        \
    {                                                                                          \
        const uint sh_ = (b0) & 2u, end_ = sh_ + kvq_bytes(t);                                 \
        [[unroll]] for (uint w_ = 0u; w_ < KVQ_WORDS; ++w_) {                                  \
            const uint lo_ = max(4u * w_, sh_), hi_ = min(4u * w_ + 4u, end_);                 \
            const uint d_ = ((b0) >> 2) + w_;                                                  \
            if (hi_ - lo_ == 4u) {                                                             \
                BUF[d_] = ow_[w_];                                                             \
            } else if (lo_ < hi_) {   /* 2 of the word's bytes are this block's */             \
                const uint mask_ = 0xFFFFu << (8u * (lo_ - 4u * w_));                          \
                atomicAnd(BUF[d_], ~mask_);                                                    \
                atomicOr(BUF[d_], ow_[w_] & mask_);                                            \
            }                                                                                  \
        }                                                                                      \
    }
#define KVQ_STORE_BLOCK(BUF, t, x, b0)                                                          \
    {                                                                                          \
        uint ow_b_[KVQ_WORDS];                                                                 \
        KVQ_BLOCK_WORDS(t, x, b0, ow_b_)                                                       \
        KVQ_WRITE_WORDS(BUF, t, ow_b_, b0)                                                     \
    }

#endif
#endif
