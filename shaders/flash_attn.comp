#version 450
// Flash attention, scalar path, all arithmetic in fp32 (vkrt/ops/flash_attn.py).
//
// One workgroup: BR query rows of one head (x: query tile, y: head, z: batch * n_split + split).
// Threads = RG row groups x COLS column lanes x DS dot lanes. A thread owns RPT = BR/RG rows and,
// in each KV tile of BC columns, the columns col_tid + c*COLS; the DS lanes of a column split the
// head dimension (vec4 d4 = d_tid + k*DS, or KD4(k)) and add their partial dot products with
// subgroup shuffles. Every thread keeps its own online softmax (max M, sum L, unnormalised O over
// its dims) for its columns, so the KV loop has no barriers; the COLS column streams of a row are
// merged once at the end. A thread skips a KV tile where its own mask values are all -inf. With
// mask_opt (flags bit 0) the 2-bit code of each Br x Bc mask block skips the block for the whole
// workgroup before any mask read (all -inf), or the mask read and add (all zero). With
// n_split > 1 the splits share the (live) KV tiles evenly, at least SPLIT_MIN tiles each; each
// writes its unnormalised O with (M, L) per row, and the last split of a row tile to finish (an
// atomic count per tile) combines them. Where the live tiles leave one split used (a short
// context in a dispatch recorded for a longer one) it writes the output itself, as unsplit.
// With SINKS (attention sinks, gpt-oss) each query head's sink value counts in the final
// normalisation as a key of score `sink` with a zero value would (ggml's flash_attn_ext sinks).
//
// GQA_PACK > 1 (grouped-query attention, one mask plane, no ALiBi): a workgroup's rows are the
// GQA_PACK query heads of one KV head (y) for BR / GQA_PACK tokens, so K and V are read once per KV
// head; row vr is token vr / GQA_PACK of head y * GQA_PACK + vr % GQA_PACK. Every row is computed
// by the same arithmetic as unpacked. With KV_USED the number of live cells comes from a buffer
// written each step: tiles past it (masked padding) are not visited.
//
// The score's mask term, the dot products and O's update are explicit fmas: a compiler free to
// contract a*b+c (NVIDIA's) then rounds them alike whatever the tile's shape, so packed and
// unpacked rows keep the same bits there too.
//
// With LOADS_FIRST (decode-sized calls: few rows, short tiles) a thread issues a tile's mask, K
// and V loads together before it uses any of them: a tile costs one memory round trip, not
// three one after another, and the same arithmetic runs on the same values. LOADS_FIRST 2 issues
// the next tile's loads (the mask's as words) before this tile's arithmetic, so the round trip
// overlaps it. LOADS_FIRST 3 loads a tile's K and V once a workgroup into shared memory as floats
// (each thread a share of it, the next tile's share in flight while this one computes) and every
// row group reads them there: with 2 each row group loaded the whole tile itself. The queries are
// loaded before the live cells are read, in the same round trip.
//
// With NORM_ROPE_IN (decode: one token) the prologue does norm_rope's work: the queries come as
// projected and are normed and rotated into the Q tile; the K and V of the new cell are normed,
// rotated and stored into the caches by the split holding the cell (fa_norm_rope.glsl), a
// quantised cache's rows Walsh-Hadamard rotated (K_ROT, V_ROT, the queries with K) and quantised.
//
// With MASK_ZERO a word written each step says whether the mask is 0 on every live cell of every
// row (one sequence's decode): the KV loop (flash_attn_loop.glsl) is compiled twice, and a flagged
// step runs the copy that reads no mask, with the same result (x + 0 is x). A branch around the
// mask's loads in one loop cost more than the loads (H100, head 128 f16: 46.7 -> 53.5 us).
//
// With OUT_ROT (a cache whose V is stored Walsh-Hadamard rotated, ops/hadamard.py) each output row
// is rotated back in runs of OUT_ROT in shared memory before it is written, times OUT_ROT_SCALE:
// the bits of hadamard() run on the output after.
//
// Defines: HSK, HSV (head sizes), BR, BC, DS, COLS, RG, K_F16, V_F16, K_Q, V_Q, HAS_MASK, UNROLL (0: loops
// stay rolled, for compilers where unrolled tiles take seconds), GQA_PACK, KV_USED, SINKS,
// LOADS_FIRST, SPLIT_MIN, SCATTER (dot_sums), MASK_ZERO, NORM_ROPE_IN (and fa_norm_rope.glsl's).
#include "common.glsl"
#include "attn_common.glsl"
#if DS > 1
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
#ifndef LOADS_FIRST
#define LOADS_FIRST 0
#endif
#ifndef K_Q
#define K_Q 0
#endif
#ifndef V_Q
#define V_Q 0
#endif
#ifndef MERGE_AT
#define MERGE_AT 8
#endif
#ifndef SPLIT_MIN
#define SPLIT_MIN 1
#endif
#ifndef OUT_ROT
#define OUT_ROT 0
#endif
#ifndef SCATTER
#define SCATTER 0
#endif
#ifndef MASK_ZERO
#define MASK_ZERO 0
#endif

layout(local_size_x_id = 0) in;

#if UNROLL
#define FA_UNROLL [[unroll]]
#else
#define FA_UNROLL [[dont_unroll]]
#endif

const uint WG = RG * COLS * DS;
const uint RPT = BR / RG;          // query rows per thread
const uint CPT = BC / COLS;        // KV columns per thread per tile
const uint HSK4 = HSK / 4;
const uint HSV4 = HSV / 4;
const uint KD = HSK4 / DS;         // vec4s of a K row per dot lane
const uint VD = HSV4 / DS;         // vec4s of an O row per dot lane
const uint TILE4 = BR * (HSK4 > HSV4 ? HSK4 : HSV4);
// token rows of one mask_opt block: BR, or with packing the tokens of a workgroup (at least 1)
const uint MO_BR = GQA_PACK > 1 ? (BR > GQA_PACK ? BR / GQA_PACK : 1u) : BR;

layout(binding = 0) readonly buffer Q { float q[]; };
// K and V: 4 elements from element e as stored (K_RAW / V_RAW: f16 caches keep their halves
// packed until used) and as floats. A lane's vec4s of a K row are KD4(k), k < KD, held in KR raw
// values (raw value k from vec4 KCH(k)); V's alike.
// K_Q / V_Q: a quantised cache's kv_quant.glsl type (its offsets and strides count elements as
// blocks of 32 do), dequantised as loaded; where a tile is held in registers (K_SEG / V_SEG:
// LOADS_FIRST 1, 2) a lane's vec4s are consecutive instead, in KR segments of KG within one block,
// each held as the words loaded and dequantised where used: from head 128 on fewer words than
// f16's 2 a vec4 (dequantised vec4s took 4, and joining a block's words waited for their loads)
#if K_Q || V_Q
#if K_Q
layout(binding = 1) readonly buffer K { uint k_w[]; };
#define QBUF k_w
#else
layout(binding = 2) readonly buffer V { uint v_w[]; };
#define QBUF v_w
#endif
#include "kv_quant.glsl"
#endif
#define K_SEG (K_Q && LOADS_FIRST > 0 && LOADS_FIRST < 3)
#define V_SEG (V_Q && LOADS_FIRST > 0 && LOADS_FIRST < 3)
#if K_SEG
const uint KG = KD % 8u == 0u ? 8u : KD % 4u == 0u ? 4u : KD % 2u == 0u ? 2u : 1u;
const uint KR = KD / KG, KSW = KVQ_SEG_WORDS(K_Q, KG);
struct KSeg { uint w[KSW]; };
#define K_RAW KSeg
#define KD4(k) d_tid * KD + (k)
#define KCH(k) (d_tid * KD + (k) * KG)
K_RAW raw_k(uint e) { K_RAW r; KVQ_SEG_LOAD(k_w, K_Q, KG, e, r.w, KSW) return r; }
// vec4 k of column c from the raw values kt[KR][CPT] (the column's row at element e0)
#define UNPACK_K(kt, k, c, e0) KVQ_SEG_DQ4(K_Q, KG, kt[(k) / KG][c].w, KSW, (k) % KG, (e0) + 4u * KCH((k) / KG))
#else
#if K_Q
#define K_RAW vec4
K_RAW raw_k(uint e) { return KVQ_LOAD4(k_w, K_Q, e); }
K_RAW raw_k4(uint i4) { return raw_k(i4 << 2u); }
vec4 unpack_k(K_RAW h) { return h; }
#elif K_F16
layout(binding = 1) readonly buffer K { uvec2 k_h4[]; };  // 4 halves
#define K_RAW uvec2
K_RAW raw_k4(uint i4) { return k_h4[i4]; }
vec4 unpack_k(K_RAW h) { return vec4(unpackHalf2x16(h.x), unpackHalf2x16(h.y)); }
#else
layout(binding = 1) readonly buffer K { vec4 k_v4[]; };
#define K_RAW vec4
K_RAW raw_k4(uint i4) { return k_v4[i4]; }
vec4 unpack_k(K_RAW h) { return h; }
#endif
#define KR KD
#define KD4(k) d_tid + (k) * DS
#define KCH(k) (d_tid + (k) * DS)
#define UNPACK_K(kt, k, c, e0) unpack_k(kt[k][c])
#endif
#if V_Q && K_Q
layout(binding = 2) readonly buffer V { uint v_w[]; };
#endif
#if V_SEG
const uint VG = VD % 8u == 0u ? 8u : VD % 4u == 0u ? 4u : VD % 2u == 0u ? 2u : 1u;
const uint VR = VD / VG, VSW = KVQ_SEG_WORDS(V_Q, VG);
struct VSeg { uint w[VSW]; };
#define V_RAW VSeg
#define VD4(v) d_tid * VD + (v)
#define VCH(v) (d_tid * VD + (v) * VG)
V_RAW raw_v(uint e) { V_RAW r; KVQ_SEG_LOAD(v_w, V_Q, VG, e, r.w, VSW) return r; }
#define UNPACK_V(vt, c, v, e0) KVQ_SEG_DQ4(V_Q, VG, vt[c][(v) / VG].w, VSW, (v) % VG, (e0) + 4u * VCH((v) / VG))
#else
#if V_Q
#define V_RAW vec4
V_RAW raw_v(uint e) { return KVQ_LOAD4(v_w, V_Q, e); }
V_RAW raw_v4(uint i4) { return raw_v(i4 << 2u); }
vec4 unpack_v(V_RAW h) { return h; }
#elif V_F16
layout(binding = 2) readonly buffer V { uvec2 v_h4[]; };
#define V_RAW uvec2
V_RAW raw_v4(uint i4) { return v_h4[i4]; }
vec4 unpack_v(V_RAW h) { return vec4(unpackHalf2x16(h.x), unpackHalf2x16(h.y)); }
#else
layout(binding = 2) readonly buffer V { vec4 v_v4[]; };
#define V_RAW vec4
V_RAW raw_v4(uint i4) { return v_v4[i4]; }
vec4 unpack_v(V_RAW h) { return h; }
#endif
#define VR VD
#define VD4(v) d_tid + (v) * DS
#define VCH(v) (d_tid + (v) * DS)
#define UNPACK_V(vt, c, v, e0) unpack_v(vt[c][v])
#endif
// K's raw values by row: K_ROW(e) this lane's place in the row at element e (a multiple of 4),
// once a row, and K_ROW_AT(r, k) its raw value k from there; K_AT(e, ch) the vec4 ch of the row
// (the shared tile's loads). Outside the segments those are vec4 indices, so a row's loads are
// one address and constant offsets (e + 4 ch, shifted, cost 3 instructions a load on GCN). V's
// alike.
#if K_SEG
#define K_ROW(e) (e)
#define K_ROW_AT(r, k) raw_k((r) + 4u * KCH(k))
#else
#define K_AT(e, ch) raw_k4(((e) >> 2u) + (ch))
#define K_ROW(e) (((e) >> 2u) + d_tid)
#define K_ROW_AT(r, k) raw_k4((r) + (k) * DS)
#endif
#if V_SEG
#define V_ROW(e) (e)
#define V_ROW_AT(r, v) raw_v((r) + 4u * VCH(v))
#else
#define V_AT(e, ch) raw_v4(((e) >> 2u) + (ch))
#define V_ROW(e) (((e) >> 2u) + d_tid)
#define V_ROW_AT(r, v) raw_v4((r) + (v) * DS)
#endif
layout(binding = 3) writeonly buffer O { float o[]; };        // output
// split along KV: each split's unnormalised O and (M, L) per row, and per workgroup row tile the
// number of splits done (the last one merges them and resets the count)
layout(binding = 4) coherent buffer Part { vec4 part4[]; };   // HSV / 4 a row
layout(binding = 5) coherent buffer ML { vec2 ml[]; };
layout(binding = 6) coherent buffer Done { uint done[]; };
#if HAS_MASK
layout(binding = 7) readonly buffer Mask { uint m_u32[]; };   // f16
layout(binding = 8) readonly buffer MaskOpt { uint mo[]; };   // block codes (fa_mask_opt.comp)
#endif
#if KV_USED
layout(binding = 7 + 2 * HAS_MASK) readonly buffer KvUsed { uint kv_used; };  // live cells (the rest are masked)
#endif
#if SINKS
layout(binding = 7 + 2 * HAS_MASK + KV_USED) readonly buffer Sinks { float sinks[]; };   // one a query head
#endif
#if MASK_ZERO
// nonzero in a step whose mask is 0 on every live cell of every row: the mask is not read
layout(binding = 7 + 2 * HAS_MASK + KV_USED + SINKS) readonly buffer MaskZero { uint mask_zero; };
#endif

// element offsets and strides (K and V ones multiples of 4); scale already divided by softcap
// when softcap != 0
#if NORM_ROPE_IN
// one token of one sequence, one mask plane, no ALiBi: those fields are constants, and the
// prologue's take their room (fa_norm_rope.glsl)
layout(push_constant) uniform Push {
    uint KV; uint n_head; uint gqa;
    uint q_off; uint q_nb2;
    uint k_off; uint k_nb1; uint k_nb2;
    uint v_off; uint v_nb1; uint v_nb2;
    uint m_off; uint o_off; uint flags;
    uint n_split;
    float scale; float softcap;
    uint s_off;
    uint pos_off; uint ff_off; uint rows_off; uint qw_off; uint kw_off; uint ks_off; uint vs_off;
    float eps; float theta_scale; float freq_scale; float ext_factor; float corr_low; float corr_high;
} p;
#define P_N 1u
#define P_Q_NB1 0u
#define P_Q_NB3 0u
#define P_K_NB3 0u
#define P_V_NB3 0u
#define P_M_NB1 0u
#define P_M_NB2 0u
#define P_M_NB3 0u
#define P_NEM2 1u
#define P_NEM3 1u
#define P_MAX_BIAS 0.0
#else
layout(push_constant) uniform Push {
    uint N; uint KV; uint n_head; uint gqa;
    uint q_off; uint q_nb1; uint q_nb2; uint q_nb3;
    uint k_off; uint k_nb1; uint k_nb2; uint k_nb3;
    uint v_off; uint v_nb1; uint v_nb2; uint v_nb3;
    uint m_off; uint m_nb1; uint m_nb2; uint m_nb3;
    uint nem2; uint nem3; uint o_off; uint flags;
    uint n_split;
    float scale; float softcap; float max_bias;
    uint s_off;
} p;
#define P_N p.N
#define P_Q_NB1 p.q_nb1
#define P_Q_NB3 p.q_nb3
#define P_K_NB3 p.k_nb3
#define P_V_NB3 p.v_nb3
#define P_M_NB1 p.m_nb1
#define P_M_NB2 p.m_nb2
#define P_M_NB3 p.m_nb3
#define P_NEM2 p.nem2
#define P_NEM3 p.nem3
#define P_MAX_BIAS p.max_bias
#endif

shared vec4 tile[TILE4];           // the Q rows during the KV loop, then the merged O rows
#if LOADS_FIRST == 3
// the KV tile's K and V rows as floats (an F16 or quantised tile converted as it is stored), a
// row padded by one element (shared-memory banks)
const uint KSTR = HSK4 + 1u, VSTR = HSV4 + 1u;
const uint KSH = (BC * HSK4 + WG - 1u) / WG, VSH = (BC * HSV4 + WG - 1u) / WG;   // a thread's share
shared vec4 k_sh[BC * KSTR];   // as floats: an f16 tile converted once a workgroup
shared vec4 v_sh[BC * VSTR];
#endif
shared float m_sh[BR * COLS];
shared float l_sh[BR * COLS];
shared bool last_split;

#if GQA_PACK > 1
uint row_token(uint vr) { return vr / GQA_PACK; }
uint row_head(uint vr) { return gl_WorkGroupID.y * GQA_PACK + vr % GQA_PACK; }
#else
uint row_token(uint vr) { return vr; }
uint row_head(uint vr) { return gl_WorkGroupID.y; }
#endif
#if NORM_ROPE_IN
#include "fa_norm_rope.glsl"
#endif

// attn_sink_factor for this head's sink: 1 without sinks.
float sink_factor(float m, inout float l, uint head) {
#if SINKS
    return attn_sink_factor(m, l, sinks[p.s_off + head]);
#else
    return 1.0;
#endif
}

// this thread's mask value of tile j at its row r, column c: its index, the value, and the word
// holding it (LOADS_FIRST > 1 holds the words a tile ahead and takes their halves where used: a
// compiler that waits for a load where its value is first used then waits for none too early)
#define MASK_IDX(j, r, c) (m_base + min(row_token(row0 + rg * RPT + (r)), P_N - 1u) * P_M_NB1 \
                           + min((j) * BC + (c) * COLS + col_tid, p.KV - 1u))
#define MASK_AT(j, r, c) attn_half(m_u32, MASK_IDX(j, r, c))
#define MASK_WORD(j, r, c) m_u32[MASK_IDX(j, r, c) >> 1]
#define MASK_OF(w, j, r, c) unpackHalf2x16(((w) >> ((MASK_IDX(j, r, c) & 1u) << 4)) & 0xFFFFu).x
// a tile's K and V values as stored (LOADS_FIRST), and its mask values
#define LOAD_KV(j, kt, vt)                                                              \
    FA_UNROLL for (uint c = 0; c < CPT; ++c) {                                          \
        const uint col = min((j) * BC + c * COLS + col_tid, p.KV - 1u);                 \
        const uint kr_ = K_ROW(k_base + col * p.k_nb1), vr_ = V_ROW(v_base + col * p.v_nb1); \
        FA_UNROLL for (uint k = 0; k < KR; ++k) {                                       \
            kt[k][c] = K_ROW_AT(kr_, k);                                                \
        }                                                                               \
        FA_UNROLL for (uint v = 0; v < VR; ++v) {                                       \
            vt[c][v] = V_ROW_AT(vr_, v);                                                \
        }                                                                               \
    }
// this thread's share of tile j's K and V (cells clamped to the last, as LOAD_KV's), and its
// store. A quantised cache's share is whole blocks (K's from the first thread up, V's from the
// last down), held as the words loaded (kv_quant.glsl's segments of 8 chunks) and dequantised
// into the shared tile: a block's 5-9 word loads, not 3-6 for each of its 8 vec4s
#define BLOCK_SHARE_LOAD(j, sh, BUF, QT, BPR, NBLK, NSH, NW, base, nb1, B)                   \
    FA_UNROLL for (uint i = 0; i < NSH; ++i) {                                             \
        const uint b = B;                                                                  \
        if (b < NBLK) {                                                                    \
            sh[i].e = (base) + min((j) * BC + b / BPR, p.KV - 1u) * (nb1) + 32u * (b % BPR); \
            KVQ_SEG_LOAD(BUF, QT, 8u, sh[i].e, sh[i].w, NW)                                \
        }                                                                                  \
    }
#define BLOCK_SHARE_STORE(sh, dst, STR, QT, BPR, NBLK, NSH, NW, B)                          \
    FA_UNROLL for (uint i = 0; i < NSH; ++i) {                                             \
        const uint b = B;                                                                  \
        if (b < NBLK) {                                                                    \
            FA_UNROLL for (uint c = 0; c < 8u; ++c) {                                      \
                dst[(b / BPR) * STR + (b % BPR) * 8u + c] = KVQ_SEG_DQ4(QT, 8u, sh[i].w, NW, c, sh[i].e); \
            }                                                                              \
        }                                                                                  \
    }
#define VEC4_SHARE_LOAD(j, sh, NSH, N4, AT, base, nb1)                                      \
    FA_UNROLL for (uint i = 0; i < NSH; ++i) {                                             \
        const uint e = min(t + i * WG, BC * N4 - 1u);                                      \
        sh[i] = AT((base) + min((j) * BC + e / N4, p.KV - 1u) * (nb1), e % N4);            \
    }
#define VEC4_SHARE_STORE(sh, dst, STR, NSH, N4, unpack)                                     \
    FA_UNROLL for (uint i = 0; i < NSH; ++i) {                                             \
        const uint e = t + i * WG;                                                         \
        if (e < BC * N4) {                                                                 \
            dst[(e / N4) * STR + e % N4] = unpack(sh[i]);                                  \
        }                                                                                  \
    }
#if LOADS_FIRST == 3 && K_Q
const uint KBPR = HSK / 32u, KBLK = BC * KBPR, KBSH = (KBLK + WG - 1u) / WG, KBW = KVQ_SEG_WORDS(K_Q, 8u);
struct KBlock { uint w[KBW]; uint e; };
#define K_SHARE KBlock
#define K_SHARES KBSH
#define LOAD_K_SHARE(j, ks) BLOCK_SHARE_LOAD(j, ks, k_w, K_Q, KBPR, KBLK, KBSH, KBW, k_base, p.k_nb1, t + i * WG)
#define STORE_K_SHARE(ks) BLOCK_SHARE_STORE(ks, k_sh, KSTR, K_Q, KBPR, KBLK, KBSH, KBW, t + i * WG)
#else
#define K_SHARE K_RAW
#define K_SHARES KSH
#define LOAD_K_SHARE(j, ks) VEC4_SHARE_LOAD(j, ks, KSH, HSK4, K_AT, k_base, p.k_nb1)
#define STORE_K_SHARE(ks) VEC4_SHARE_STORE(ks, k_sh, KSTR, KSH, HSK4, unpack_k)
#endif
#if LOADS_FIRST == 3 && V_Q
const uint VBPR = HSV / 32u, VBLK = BC * VBPR, VBSH = (VBLK + WG - 1u) / WG, VBW = KVQ_SEG_WORDS(V_Q, 8u);
struct VBlock { uint w[VBW]; uint e; };
#define V_SHARE VBlock
#define V_SHARES VBSH
#define LOAD_V_SHARE(j, vs) BLOCK_SHARE_LOAD(j, vs, v_w, V_Q, VBPR, VBLK, VBSH, VBW, v_base, p.v_nb1, WG - 1u - t + i * WG)
#define STORE_V_SHARE(vs) BLOCK_SHARE_STORE(vs, v_sh, VSTR, V_Q, VBPR, VBLK, VBSH, VBW, WG - 1u - t + i * WG)
#else
#define V_SHARE V_RAW
#define V_SHARES VSH
#define LOAD_V_SHARE(j, vs) VEC4_SHARE_LOAD(j, vs, VSH, HSV4, V_AT, v_base, p.v_nb1)
#define STORE_V_SHARE(vs) VEC4_SHARE_STORE(vs, v_sh, VSTR, VSH, HSV4, unpack_v)
#endif
#define LOAD_KV_SHARE(j, ks, vs) LOAD_K_SHARE(j, ks) LOAD_V_SHARE(j, vs)
#define STORE_KV_SHARE(ks, vs) STORE_K_SHARE(ks) STORE_V_SHARE(vs)
#define LOAD_MASK(j, mt)                                                                \
    FA_UNROLL for (uint r = 0; r < RPT; ++r) {                                          \
        FA_UNROLL for (uint c = 0; c < CPT; ++c) {                                      \
            mt[r][c] = MASK_WORD(j, r, c);                                              \
        }                                                                               \
    }

// K and V values of the tile's column c (cell col), dot lane share k or v: from the loads issued
// at the tile's start (LOADS_FIRST), else loaded where they are used
#if LOADS_FIRST == 3
#define TILE_K_(k, c, col) k_sh[((c) * COLS + col_tid) * KSTR + KD4(k)]
#define TILE_V_(c, v, col) v_sh[((c) * COLS + col_tid) * VSTR + VD4(v)]
#elif LOADS_FIRST
#define TILE_K_(k, c, col) UNPACK_K(kt, k, c, k_base + (col) * p.k_nb1)
#define TILE_V_(c, v, col) UNPACK_V(vt, c, v, v_base + (col) * p.v_nb1)
#else
// K's place (K_ROW) of this thread's column c of tile j: its first column's place plus the tile's
// and column's uniform step (K and V offsets and strides are whole vec4s), a cell past the last
// read as the last, as a clamp to it would: an add and a select a column, where the clamped cell's
// multiply took about ten instructions (RX 580 compiler: prompt tiles' loop 14-16 fewer, the same
// registers). V's alike. Decode-sized calls load a tile at once (LOADS_FIRST) and keep the clamp:
// held a tile ahead, these places took ACO to 156 VGPRs (1 wave) at head 128, 120 (2) at 256
#define CELL_LIVE(j, c) ((j) * BC + (c) * COLS + col_tid < p.KV)
#define K_ROW_OF(j, c) (CELL_LIVE(j, c) ? k_row0 + ((((j) * BC + (c) * COLS) * p.k_nb1) >> 2u) : k_row_last)
#define V_ROW_OF(j, c) (CELL_LIVE(j, c) ? v_row0 + ((((j) * BC + (c) * COLS) * p.v_nb1) >> 2u) : v_row_last)
#define TILE_K_(k, c, col) unpack_k(K_ROW_AT(K_ROW_OF(j, c), k))
#define TILE_V_(c, v, col) unpack_v(V_ROW_AT(V_ROW_OF(j, c), v))
#endif
// The new cell (nr_col) as the prologue stored it: a tile held a tile ahead (LOADS_FIRST 2; the
// segments as the words stored, copied by the prologue) or in shared memory (3) takes it once, in
// the tile holding it (NR_PATCH); otherwise each value read is chosen (with one tile loaded at
// its start, 1, patching it would hold the whole tile at once: the RX 580's compiler took F16 at
// head 256 from 60 VGPRs to 128)
#if NORM_ROPE_IN && LOADS_FIRST >= 2
#define NR_PATCH 1
#else
#define NR_PATCH 0
#endif
#if NORM_ROPE_IN && !NR_PATCH
#define TILE_K(k, c, col) ((col) == nr_col ? nk_sh[KD4(k)] : TILE_K_(k, c, col))
#define TILE_V(c, v, col) ((col) == nr_col ? nv_sh[VD4(v)] : TILE_V_(c, v, col))
#else
#define TILE_K(k, c, col) TILE_K_(k, c, col)
#define TILE_V(c, v, col) TILE_V_(c, v, col)
#endif
#if NR_PATCH && LOADS_FIRST < 3
// a value of the prologue's copy as the tile holds it (an F16 cache's values are halves already)
#if K_F16
K_RAW nr_raw_k(vec4 x) { return uvec2(packHalf2x16(x.xy), packHalf2x16(x.zw)); }
#elif !K_SEG
K_RAW nr_raw_k(vec4 x) { return x; }
#endif
#if V_F16
V_RAW nr_raw_v(vec4 x) { return uvec2(packHalf2x16(x.xy), packHalf2x16(x.zw)); }
#elif !V_SEG
V_RAW nr_raw_v(vec4 x) { return x; }
#endif
#endif

#if DS > 1 && SCATTER && LOADS_FIRST != 3
// The DS dot lanes' sums of a thread's RPT x CPT partial scores, every lane ending with every sum:
// a reduce-scatter (at each level, offsets o from DS / 2 down, a lane keeps half the H values it
// still holds and adds its partner's copy of that half: H / 2 shuffles, not H; one value left, a
// butterfly step) then an all-gather back up the halving levels. Each level adds the two lanes'
// values of a sum as XOR_SUM does (a + b = b + a), so every sum has the butterfly's bits; a tile of
// 8 scores over 8 lanes takes 14 shuffles instead of 24. Offsets are literals (common.glsl).
const uint SC_N = POW2_CEIL(RPT * CPT);   // padded with zeros (sums of their own)
#define SC_DOWN(o) if (DS > (o)) { SCATTER_LEVEL(x, SCATTER_HELD(SC_N, DS, o), o, (d_tid & (o)) != 0u, subgroupShuffleXor) }
#define SC_UP(o)                                                                        \
    if (DS > (o) && SCATTER_HELD(SC_N, DS, o) > 1u) {                                   \
        const uint h_ = SCATTER_HELD(SC_N, DS, o) / 2u;                                 \
        const bool hi = (d_tid & (o)) != 0u;                                            \
        FA_UNROLL for (uint i = 0u; i < h_; ++i) {                                      \
            const float mine = x[i];                                                    \
            const float got = subgroupShuffleXor(mine, o);                              \
            x[i] = hi ? got : mine;                                                     \
            x[i + h_] = hi ? mine : got;                                                \
        }                                                                               \
    }
void dot_sums(inout float s[RPT][CPT], uint d_tid) {
    float x[SC_N];
    FA_UNROLL for (uint i = 0u; i < SC_N; ++i) {
        x[i] = i < RPT * CPT ? s[min(i / CPT, RPT - 1u)][i % CPT] : 0.0;
    }
    SC_DOWN(64u) SC_DOWN(32u) SC_DOWN(16u) SC_DOWN(8u) SC_DOWN(4u) SC_DOWN(2u) SC_DOWN(1u)
    SC_UP(1u) SC_UP(2u) SC_UP(4u) SC_UP(8u) SC_UP(16u) SC_UP(32u) SC_UP(64u)
    FA_UNROLL for (uint i = 0u; i < RPT * CPT; ++i) {
        s[i / CPT][i % CPT] = x[i];
    }
}
#define DOT_SUMS_AT_ONCE 1
#else
#define DOT_SUMS_AT_ONCE 0
#endif

#if OUT_ROT
#define TILE_AT(f) tile[(f) >> 2][(f) & 3u]
// The workgroup's output rows, normalised in `tile`, rotated back in runs of OUT_ROT
// (hadamard.comp's stages and arithmetic, a pair an invocation a stage) and written times
// OUT_ROT_SCALE. From the workgroup's uniform control flow.
void store_rotated(uint row0, uint n_rows, uint b) {
    const uint t = gl_LocalInvocationID.x;
    [[dont_unroll]] for (uint hs = 0u; hs < HALVINGS(OUT_ROT); ++hs) {
        const uint h = 1u << hs;
        barrier();
        for (uint q = t; q < BR * HSV / 2u; q += WG) {
            const uint qq = q % (HSV / 2u), tt = qq % (OUT_ROT / 2u);
            const uint i = (q / (HSV / 2u)) * HSV + (qq / (OUT_ROT / 2u)) * OUT_ROT + (tt / h) * 2u * h + tt % h;
            const float x = TILE_AT(i), y = TILE_AT(i + h);
            TILE_AT(i) = x + y;
            TILE_AT(i + h) = x - y;
        }
    }
    barrier();
    for (uint f4 = t; f4 < BR * HSV4; f4 += WG) {
        const uint row = row0 + f4 / HSV4;
        if (row < n_rows) {
            const uint dst = p.o_off + ((b * P_N + row_token(row)) * p.n_head + row_head(row)) * HSV + 4u * (f4 % HSV4);
            const vec4 val = tile[f4];
            o[dst] = val.x * OUT_ROT_SCALE;
            o[dst + 1u] = val.y * OUT_ROT_SCALE;
            o[dst + 2u] = val.z * OUT_ROT_SCALE;
            o[dst + 3u] = val.w * OUT_ROT_SCALE;
        }
    }
}
#endif

// Count this split of the row tile as done; the last one to finish merges the splits that had
// tiles: out = sum_s O_s exp(M_s - M) / sum_s L_s exp(M_s - M), M = max_s M_s (0 where every L
// is 0), and resets the count for the next run.
void merge_splits(uint row0, uint n_rows, uint b, uint used_splits) {
    const uint t = gl_LocalInvocationID.x;
    const uint n_out = (gl_NumWorkGroups.z / p.n_split) * P_N * p.n_head;
    memoryBarrierBuffer();
    barrier();
    const uint tile_id = (b * gl_NumWorkGroups.y + gl_WorkGroupID.y) * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (t == 0u) {
        last_split = atomicAdd(done[tile_id], 1u) == p.n_split - 1u;
    }
    barrier();
    if (!last_split) {
        return;
    }
    memoryBarrierBuffer();
    // a thread a vec4 of an output row, in one pass over the splits: MERGE_AT splits' (M, L) and
    // O loaded at once, then folded in with a running max (the sums so far rescaled where a
    // chunk raises it)
    for (uint i = t; i < BR * HSV4; i += WG) {
        const uint row = row0 + i / HSV4;
        if (row >= n_rows) {
            continue;
        }
        const uint out_row = (b * P_N + row_token(row)) * p.n_head + row_head(row);
        float mx = FA_NEG_BIG;
        float l = 0.0;
        vec4 acc = vec4(0.0);
        for (uint s0 = 0; s0 < used_splits; s0 += MERGE_AT) {
            vec2 m_l[MERGE_AT];
            vec4 o_[MERGE_AT];
            [[unroll]] for (uint q = 0; q < MERGE_AT; ++q) {
                const uint sp = min(s0 + q, used_splits - 1u);
                m_l[q] = ml[sp * n_out + out_row];
                o_[q] = part4[(sp * n_out + out_row) * HSV4 + i % HSV4];
            }
            float cm = mx;
            [[unroll]] for (uint q = 0; q < MERGE_AT; ++q) {
                cm = s0 + q < used_splits ? max(cm, m_l[q].x) : cm;
            }
            const float a = exp(mx - cm);
            l *= a;
            acc *= a;
            mx = cm;
            [[unroll]] for (uint q = 0; q < MERGE_AT; ++q) {
                if (s0 + q < used_splits) {
                    const float w = exp(m_l[q].x - mx);
                    l += m_l[q].y * w;
                    acc += o_[q] * w;
                }
            }
        }
        acc *= sink_factor(mx, l, row_head(row));
        const vec4 val = l > 0.0 ? acc / l : vec4(0.0);
#if OUT_ROT
        tile[i] = val;
#else
        const uint dst = p.o_off + out_row * HSV + 4u * (i % HSV4);
        o[dst] = val.x;
        o[dst + 1u] = val.y;
        o[dst + 2u] = val.z;
        o[dst + 3u] = val.w;
#endif
    }
#if OUT_ROT
    store_rotated(row0, n_rows, b);
#endif
    if (t == 0u) {
        done[tile_id] = 0u;
    }
}

void main() {
    const uint t = gl_LocalInvocationID.x;
    const uint d_tid = t % DS;
    const uint col_tid = (t / DS) % COLS;
    const uint rg = t / (DS * COLS);
    const uint row0 = gl_WorkGroupID.x * BR;   // first row (token, or token x packed head)
    const uint n_rows = P_N * GQA_PACK;
    const uint split = gl_WorkGroupID.z % p.n_split;
    const uint b = gl_WorkGroupID.z / p.n_split;
#if GQA_PACK > 1
    const uint hk = gl_WorkGroupID.y;
    const uint h_mask = 0u;            // one mask plane
    const float slope = 1.0;           // no ALiBi
#else
    const uint h = gl_WorkGroupID.y;
    const uint hk = h / p.gqa;
    const uint h_mask = h % P_NEM2;
    const float slope = P_MAX_BIAS > 0.0 ? alibi_slope(h, p.n_head, P_MAX_BIAS) : 1.0;
#endif

    const uint q_base = p.q_off + b * P_Q_NB3;
#if NORM_ROPE_IN   // (its loads go out now; the Q tile is filled once the splits are known)
    const NrLoads nl = nr_load(row0, n_rows, q_base, hk);
#else
    for (uint i = t; i < BR * HSK4; i += WG) {
        const uint vr = row0 + i / HSK4;
        const uint e = q_base + row_head(vr) * p.q_nb2 + row_token(vr) * P_Q_NB1 + 4u * (i % HSK4);
        tile[i] = vr < n_rows ? vec4(q[e], q[e + 1u], q[e + 2u], q[e + 3u]) : vec4(0.0);
    }
    barrier();
#endif

#if KV_USED
    const uint kv = min(p.KV, kv_used);
#else
    const uint kv = p.KV;
#endif
    // the live tiles shared evenly by the splits (with KV_USED they change from step to step); a
    // split left without tiles only counts itself done (nothing at all where one split is used)
    const uint live_tiles = (kv + BC - 1u) / BC;
    const uint per_split = max(uint(SPLIT_MIN), (live_tiles + p.n_split - 1u) / p.n_split);
    const uint used_splits = (live_tiles + per_split - 1u) / per_split;
    if (p.n_split > 1u && split >= used_splits) {
        if (used_splits > 1u) {
            merge_splits(row0, n_rows, b, used_splits);
        }
        return;
    }

    const uint k_base = p.k_off + b * P_K_NB3 + hk * p.k_nb2;
    const uint v_base = p.v_off + b * P_V_NB3 + hk * p.v_nb2;
#if LOADS_FIRST == 0
    const uint k_row0 = K_ROW(k_base + col_tid * p.k_nb1), k_row_last = K_ROW(k_base + (p.KV - 1u) * p.k_nb1);
    const uint v_row0 = V_ROW(v_base + col_tid * p.v_nb1), v_row_last = V_ROW(v_base + (p.KV - 1u) * p.v_nb1);
#endif
#if NORM_ROPE_IN
    // the split whose tiles hold the new cell norms, rotates and stores its K and V
    const uint nr_cell = nl.cell, nr_tile = nr_cell / BC;
    const bool nr_owner = split == min(nr_tile / per_split, used_splits - 1u);
#endif
    const uint ntiles = (p.KV + BC - 1u) / BC;
#if HAS_MASK
    const uint m_base = p.m_off + (b % P_NEM3) * P_M_NB3 + h_mask * P_M_NB2;
    const uint mo_stride = (ntiles + 15u) / 16u;
    const uint n_rt = (P_N + MO_BR - 1u) / MO_BR;
    const uint mo_base = (((b % P_NEM3) * P_NEM2 + h_mask) * n_rt + row_token(row0) / MO_BR) * mo_stride;
    const bool use_mask_opt = (p.flags & 1u) != 0u;
#if MASK_ZERO
    const bool mask_live = mask_zero == 0u;   // (the workgroup's)
#else
    const bool mask_live = true;
#endif
#endif

    float M[RPT], L[RPT];
    vec4 acc[RPT][VD];
    FA_UNROLL for (uint r = 0; r < RPT; ++r) {
        M[r] = FA_NEG_BIG;
        L[r] = 0.0;
        FA_UNROLL for (uint v = 0; v < VD; ++v) {
            acc[r][v] = vec4(0.0);
        }
    }

    const uint j_end = min(live_tiles, (split + 1u) * per_split);
#if NORM_ROPE_IN
    const uint nr_col = nr_owner && nr_tile < j_end ? nr_cell : 0xFFFFFFFFu;   // none: past every column
    const uint nr_j = nr_col != 0xFFFFFFFFu ? nr_tile : 0xFFFFFFFFu;              // the tile holding it
#endif
#if LOADS_FIRST > 1
    // the next tile's K and V: this thread's share of it (3) or its own columns (2)
#if LOADS_FIRST == 3
    K_SHARE ksn[K_SHARES];
    V_SHARE vsn[V_SHARES];
#define LOAD_NEXT_KV(j) LOAD_KV_SHARE(j, ksn, vsn)
#else
    K_RAW kn[KR][CPT];
    V_RAW vn[CPT][VR];
#define LOAD_NEXT_KV(j) LOAD_KV(j, kn, vn)
#endif
    LOAD_NEXT_KV(min(split * per_split, j_end - 1u));
#if HAS_MASK
    uint mn[RPT][CPT];
    if (mask_live) {
        LOAD_MASK(min(split * per_split, j_end - 1u), mn);
    }
#endif
#endif
#if NORM_ROPE_IN
    // after the first tile's loads went out, so they arrive while it runs (the tiles read the new
    // cell from nk_sh / nv_sh, never as loaded)
    nr_prologue(nl, row0, n_rows, hk, nr_owner, k_base, v_base);
#endif
#if MASK_ZERO
    if (mask_live) {
#define LOOP_MASKED 1
#include "flash_attn_loop.glsl"
#undef LOOP_MASKED
    } else {
#define LOOP_MASKED 0
#include "flash_attn_loop.glsl"
#undef LOOP_MASKED
    }
#else
#define LOOP_MASKED HAS_MASK
#include "flash_attn_loop.glsl"
#undef LOOP_MASKED
#endif

    // merge the COLS column streams of each row: common max, their weights, summed L and O
    if (d_tid == 0u) {
        FA_UNROLL for (uint r = 0; r < RPT; ++r) {
            m_sh[(rg * RPT + r) * COLS + col_tid] = M[r];
            l_sh[(rg * RPT + r) * COLS + col_tid] = L[r];
        }
    }
    barrier();
    float row_m[RPT], row_l[RPT], weight[RPT];
    FA_UNROLL for (uint r = 0; r < RPT; ++r) {
        const uint base = (rg * RPT + r) * COLS;
        float mx = FA_NEG_BIG;
        FA_UNROLL for (uint cl = 0; cl < COLS; ++cl) {
            mx = max(mx, m_sh[base + cl]);
        }
        float l = 0.0;
        FA_UNROLL for (uint cl = 0; cl < COLS; ++cl) {
            l += l_sh[base + cl] * exp(m_sh[base + cl] - mx);
        }
        row_m[r] = mx;
        row_l[r] = l;
        weight[r] = exp(M[r] - mx);
    }
    FA_UNROLL for (uint cl = 0; cl < COLS; ++cl) {
        if (col_tid == cl) {
            FA_UNROLL for (uint r = 0; r < RPT; ++r) {
                FA_UNROLL for (uint v = 0; v < VD; ++v) {
                    const uint i = (rg * RPT + r) * HSV4 + VD4(v);
                    const vec4 part = acc[r][v] * weight[r];
                    tile[i] = cl == 0u ? part : tile[i] + part;
                }
            }
        }
        barrier();
    }

    const bool partial = used_splits > 1u;
    const uint n_out = (gl_NumWorkGroups.z / p.n_split) * P_N * p.n_head;   // output rows of a split
    FA_UNROLL for (uint r = 0; r < RPT; ++r) {
        const uint row = row0 + rg * RPT + r;
        if (row >= n_rows) {
            continue;
        }
        const uint out_row = (b * P_N + row_token(row)) * p.n_head + row_head(row);
        float l = row_l[r];
        const float f = partial ? 1.0 : sink_factor(row_m[r], l, row_head(row));
        const float inv = l > 0.0 ? f / l : 0.0;
        for (uint d4 = col_tid * DS + d_tid; d4 < HSV4; d4 += COLS * DS) {
            const vec4 val = tile[(rg * RPT + r) * HSV4 + d4];
            if (partial) {
                part4[(split * n_out + out_row) * HSV4 + d4] = val;
            } else {
#if OUT_ROT
                tile[(rg * RPT + r) * HSV4 + d4] = val * inv;
#else
                const uint dst = p.o_off + out_row * HSV + 4u * d4;
                o[dst] = val.x * inv;
                o[dst + 1u] = val.y * inv;
                o[dst + 2u] = val.z * inv;
                o[dst + 3u] = val.w * inv;
#endif
            }
        }
        if (partial && t % (COLS * DS) == 0u) {
            ml[split * n_out + out_row] = vec2(row_m[r], row_l[r]);
        }
    }
    if (!partial) {
#if OUT_ROT
        store_rotated(row0, n_rows, b);
#endif
        return;
    }

    merge_splits(row0, n_rows, b, used_splits);
}
