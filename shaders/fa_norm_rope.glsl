// flash_attn.comp's NORM_ROPE_IN (decode: one token of one sequence): norm_rope's work in the
// attention's prologue, so a decode step has no norm_rope dispatch and barrier between the
// projections and the attention (vkrt/ops/fa_norm_rope.py). The queries are read as the q
// projection wrote them, RMS-normed by their weight (NR_NORM) and rotated into the Q tile. The
// workgroup whose split holds the new token's cell (rows[0]; the last split where the cell lies
// past the live ones) -- one a KV head, as the query heads of a KV head share a workgroup or there
// is one query head a KV head -- norms and rotates its KV head's k the same way, stores it and
// V's row into the caches, reads them back as stored, and its KV loop takes that cell's K and V
// from those values, not from what it loaded. With K_ROT / V_ROT (a rotated cache, the queries
// rotated with K) the rows are Walsh-Hadamard rotated in shared memory first, and a quantised
// cache (K_Q / V_Q) gets set_rows_q's blocks. Every step is norm_rope.comp's, bit for bit: the
// sums as its workgroup of NR_WG invocations in NR_SG-wide subgroups makes them (SG_BUTTERFLY:
// each NR_SG lanes here are one of its subgroups), the rotation through rope.glsl, the stores'
// conversion the cache's. The rotation's flags (ROPE_NEOX, ROPE_USE_FF, ROPE_INTERLEAVED,
// ROPE_SECTIONS, as the projections' head epilogue takes them), n_dims and attn_factor are
// defines, its other constants push fields. Included by flash_attn.comp after its bindings, push constants and
// row_token / row_head.
#ifndef VKRT_FA_NORM_ROPE_GLSL
#define VKRT_FA_NORM_ROPE_GLSL
#include "rope.glsl"
#extension GL_KHR_shader_subgroup_basic : require
#if K_F16 || V_F16
#extension GL_EXT_shader_16bit_storage : require
#endif
#if K_F16
#define NR_KT float16_t
#else
#define NR_KT float
#endif
#if V_F16
#define NR_VT float16_t
#else
#define NR_VT float
#endif

#define NR_B (7 + 2 * HAS_MASK + KV_USED + SINKS + MASK_ZERO)
layout(binding = NR_B + 0) readonly buffer NrQW { float nr_qw[]; };    // the norms' weights
layout(binding = NR_B + 1) readonly buffer NrKW { float nr_kw[]; };
layout(binding = NR_B + 2) readonly buffer NrPos { int nr_pos[]; };    // 1 position, 4 with sections
layout(binding = NR_B + 3) readonly buffer NrFF { float nr_ff[]; };
layout(binding = NR_B + 4) readonly buffer NrRows { int nr_rows[]; };  // the new token's cell
layout(binding = NR_B + 5) readonly buffer NrK { float nr_k[]; };      // k and v as projected
layout(binding = NR_B + 6) readonly buffer NrV { float nr_v[]; };
// the caches, for the stores (a quantised one as words: kv_quant.glsl's blocks)
#if K_Q
layout(binding = NR_B + 7) coherent buffer NrKC { uint nr_kc_w[]; };
#else
layout(binding = NR_B + 7) coherent buffer NrKC { NR_KT nr_kc[]; };
#endif
#if V_Q
layout(binding = NR_B + 8) coherent buffer NrVC { uint nr_vc_w[]; };
#else
layout(binding = NR_B + 8) coherent buffer NrVC { NR_VT nr_vc[]; };
#endif
#ifndef K_ROT
#define K_ROT 0
#endif
#ifndef V_ROT
#define V_ROT 0
#endif
#if K_ROT || V_ROT
#include "hadamard_runs.glsl"   // (hadamard_pair)
#endif

#if NR_NORM
#extension GL_KHR_shader_subgroup_shuffle : enable
#define BUTTERFLY_SG NR_SG
#include "butterfly.glsl"
const uint NR_G = NR_WG / NR_SG;         // norm_rope's subgroups
shared float nr_sums[(BR + 1u) * NR_G];  // their sums: the Q tile's rows, then the new K row
#else
#define NR_WG WG                         // (any lanes: nothing is summed)
#endif
shared vec4 nk_sh[HSK4];   // the new cell's K and V as normed, rotated and stored
shared vec4 nv_sh[HSV4];
// ... and a quantised row's words as stored, for the tiles that hold segments as the words loaded
// (K_SEG / V_SEG): from the word holding the row's first byte, its blocks of at most 34 bytes
#if K_SEG
const uint NR_KW = HSK / 32u * 9u + 1u;
shared uint nkw_sh[NR_KW];
#endif
#if V_SEG
const uint NR_VW = HSV / 32u * 9u + 1u;
shared uint nvw_sh[NR_VW];
#endif

const uint NR_ROWS = BR + 1u;                                // the Q tile's rows, then the new K row
const uint NR_IT = (NR_ROWS * NR_WG + WG - 1u) / WG;         // lane rounds of the workgroup
const uint NR_K = (HSK + NR_WG - 1u) / NR_WG;                // values a lane: c = l + k * NR_WG
const uint NR_PAIRS = NR_N_DIMS / 2u;
const uint NR_PT = (NR_ROWS * NR_PAIRS + WG - 1u) / WG;      // pairs an invocation rotates
const uint NR_VN = (HSV + WG - 1u) / WG;
#ifdef ROPE_SECTIONS
const uint NR_STREAMS = 4u;
#else
const uint NR_STREAMS = 1u;
#endif

// Everything the prologue reads, loaded at the kernel's start in one round trip: this
// invocation's lanes' values (round it, lane i = it * WG + its lane: row i / NR_WG, norm lane
// i % NR_WG), their norm weights, the frequency factors of the pairs it rotates, its share of the
// new V row, the positions and the new cell. The new K and V rows are read whether or not this
// workgroup stores them.
struct NrLoads {
    float x[NR_IT][NR_K];
    float w[NR_IT][NR_K];
    float ff[NR_PT];
    float v[NR_VN];   // the new V row's values c = t + k * WG
    int pos[NR_STREAMS];
    uint cell;
};

// row r of the prologue is live (r < BR: a query row of the tile; BR: the new K row, where this
// workgroup stores it), and the element index of its first value
bool nr_live(uint r, uint row0, uint n_rows, bool with_k) {
    return r < BR ? row0 + r < n_rows : r == BR && with_k;
}
uint nr_base(uint r, uint row0, uint q_base, uint hk) {
    return r < BR ? q_base + row_head(row0 + r) * p.q_nb2 : p.ks_off + hk * HSK;
}
#define NR_AT(r, c) ((r) < BR ? tile[(r) * HSK4 + (c) / 4u][(c) % 4u] : nk_sh[(c) / 4u][(c) % 4u])
void nr_set(uint r, uint c, float v) {
    if (r < BR) {
        tile[r * HSK4 + c / 4u][c % 4u] = v;
    } else {
        nk_sh[c / 4u][c % 4u] = v;
    }
}
uint nr_lane() {
    return gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID;
}

NrLoads nr_load(uint row0, uint n_rows, uint q_base, uint hk) {
    NrLoads nl;
    [[unroll]] for (uint it = 0u; it < NR_IT; it++) {
        const uint i = it * WG + nr_lane(), r = i / NR_WG, l = i % NR_WG;
        const bool row = r < NR_ROWS && nr_live(r, row0, n_rows, true);
        [[unroll]] for (uint k = 0u; k < NR_K; k++) {
            const uint c = l + k * NR_WG, e = nr_base(r, row0, q_base, hk) + c;
            const bool on = row && c < HSK;
            nl.x[it][k] = on ? (r < BR ? q[e] : nr_k[e]) : 0.0;
#if NR_NORM
            nl.w[it][k] = on ? (r < BR ? nr_qw[p.qw_off + c] : nr_kw[p.kw_off + c]) : 0.0;
#else
            nl.w[it][k] = 1.0;
#endif
        }
    }
    [[unroll]] for (uint j = 0u; j < NR_PT; j++) {
        const uint pair = (gl_LocalInvocationID.x + j * WG) % NR_PAIRS;
        nl.ff[j] = ROPE_USE_FF != 0 ? nr_ff[p.ff_off + pair] : 1.0;
    }
    [[unroll]] for (uint k = 0u; k < NR_VN; k++) {
        const uint c = gl_LocalInvocationID.x + k * WG;
        nl.v[k] = c < HSV ? nr_v[p.vs_off + hk * HSV + c] : 0.0;
    }
    [[unroll]] for (uint s = 0u; s < NR_STREAMS; s++) {
        nl.pos[s] = nr_pos[p.pos_off + s];   // one token: stream s at pos_off + s
    }
    nl.cell = uint(nr_rows[p.rows_off]);
    return nl;
}

// The Q tile from the loaded queries, and with_k the new cell's K and V (stored into the caches
// at k_base / v_base + the cell's row, and into nk_sh / nv_sh as stored).
void nr_prologue(NrLoads nl, uint row0, uint n_rows, uint hk, bool with_k, uint k_base, uint v_base) {
    const uint t = gl_LocalInvocationID.x;
#if NR_NORM
    // lane l of row r sums that row's squares as norm_rope's invocation l would, then a
    // butterfly over each NR_SG lanes (one of its subgroups)
    [[unroll]] for (uint it = 0u; it < NR_IT; it++) {
        const uint i = it * WG + nr_lane(), r = i / NR_WG, l = i % NR_WG;
        precise float sum = 0.0;
        [[unroll]] for (uint k = 0u; k < NR_K; k++) {
            const float v = nl.x[it][k];
            sum += v * v;
        }
        sum = subgroup_butterfly(sum);
        if (r < NR_ROWS && l % NR_SG == 0u) {
            nr_sums[r * NR_G + l / NR_SG] = sum;
        }
    }
    barrier();
#endif
    [[unroll]] for (uint it = 0u; it < NR_IT; it++) {
        const uint i = it * WG + nr_lane(), r = i / NR_WG, l = i % NR_WG;
        if (r >= NR_ROWS || r == BR && !with_k) {
            continue;
        }
        const bool live = nr_live(r, row0, n_rows, with_k);
#if NR_NORM
        float total = 0.0;
        for (uint g = 0u; g < NR_G; g++) {
            total += nr_sums[r * NR_G + g];
        }
        precise float mean_eps = total / float(HSK) + p.eps;   // as rms_norm.comp
        const float scale = inversesqrt(mean_eps);
#endif
        [[unroll]] for (uint k = 0u; k < NR_K; k++) {
            const uint c = l + k * NR_WG;
            if (c < HSK) {
#if NR_NORM
                const float v = nl.x[it][k] * scale;
                nr_set(r, c, live ? v * nl.w[it][k] : 0.0);
#else
                nr_set(r, c, live ? nl.x[it][k] : 0.0);
#endif
            }
        }
    }
    barrier();
    [[unroll]] for (uint j = 0u; j < NR_PT; j++) {   // dims past n_dims stay as they are
        const uint i = t + j * WG, r = i / NR_PAIRS, pair = i % NR_PAIRS;
        if (r >= NR_ROWS || !nr_live(r, row0, n_rows, with_k)) {
            continue;
        }
        const uvec2 ab = rope_dims(pair, NR_PAIRS, ROPE_NEOX != 0);
        const uint stream = rope_stream_defined(pair);
        const vec2 rot = rope_pair(NR_AT(r, ab.x), NR_AT(r, ab.y), nl.pos[stream], pair, p.theta_scale,
                                   p.freq_scale, nl.ff[j], uintBitsToFloat(NR_ATTN_FACTOR), p.ext_factor,
                                   vec2(p.corr_low, p.corr_high));
        nr_set(r, ab.x, rot.x);
        nr_set(r, ab.y, rot.y);
    }
    barrier();
#if K_ROT
    // the rows (the queries', and the new K where this workgroup stores it) Walsh-Hadamard
    // rotated in runs of K_ROT, times K_ROT_SCALE, as norm_rope's K_ROT leaves them
    const uint nr_rot_rows = with_k ? NR_ROWS : BR;
    [[unroll]] for (uint hs = 0u; hs < HALVINGS(K_ROT); ++hs) {
        const uint h = 1u << hs;
        for (uint i = t; i < nr_rot_rows * (HSK / 2u); i += WG) {
            const uint r = i / (HSK / 2u), a = hadamard_pair(i % (HSK / 2u), K_ROT, h);
            const float x = NR_AT(r, a), y = NR_AT(r, a + h);
            nr_set(r, a, x + y);
            nr_set(r, a + h, x - y);
        }
        barrier();
    }
    for (uint i = t; i < nr_rot_rows * HSK; i += WG) {
        nr_set(i / HSK, i % HSK, NR_AT(i / HSK, i % HSK) * K_ROT_SCALE);
    }
    barrier();
#endif
    if (!with_k) {
        return;
    }
#if V_ROT || V_Q
    // V's row in shared memory: rotated in runs of V_ROT (times V_ROT_SCALE), quantised from there
    [[unroll]] for (uint k = 0u; k < NR_VN; k++) {
        if (t + k * WG < HSV) {
            nv_sh[(t + k * WG) / 4u][(t + k * WG) % 4u] = nl.v[k];
        }
    }
#if V_ROT
    [[unroll]] for (uint hs = 0u; hs < HALVINGS(V_ROT); ++hs) {
        const uint h = 1u << hs;
        barrier();
        for (uint i = t; i < HSV / 2u; i += WG) {
            const uint a = hadamard_pair(i, V_ROT, h), b = a + h;
            const float x = nv_sh[a / 4u][a % 4u], y = nv_sh[b / 4u][b % 4u];
            nv_sh[a / 4u][a % 4u] = x + y;
            nv_sh[b / 4u][b % 4u] = x - y;
        }
    }
    barrier();
    for (uint c = t; c < HSV; c += WG) {
        nv_sh[c / 4u][c % 4u] *= V_ROT_SCALE;
    }
#endif
    barrier();
#define NR_V(k) nv_sh[(t + (k) * WG) / 4u][(t + (k) * WG) % 4u]
#else
#define NR_V(k) nl.v[k]
#endif
    const uint kc = k_base + nl.cell * p.k_nb1, vc = v_base + nl.cell * p.v_nb1;
#if K_Q || V_Q
    // the quantised rows, a block an invocation (set_rows_q's blocks): K's, then V's
    const uint nbk = K_Q != 0u ? HSK / 32u : 0u, nbv = V_Q != 0u ? HSV / 32u : 0u;
    for (uint g = t; g < nbk + nbv; g += WG) {
        const bool is_v = g >= nbk;
        const uint gb = is_v ? g - nbk : g;
        float x[32];
        [[unroll]] for (uint j = 0u; j < 32u; ++j) {
            const uint c = 32u * gb + j;
            x[j] = is_v ? nv_sh[c / 4u][c % 4u] : nk_sh[c / 4u][c % 4u];
        }
#if K_Q
        if (!is_v) {
            KVQ_STORE_BLOCK(nr_kc_w, K_Q, x, kvq_block(K_Q, kc) + gb * kvq_bytes(K_Q))
        }
#endif
#if V_Q
        if (is_v) {
            KVQ_STORE_BLOCK(nr_vc_w, V_Q, x, kvq_block(V_Q, vc) + gb * kvq_bytes(V_Q))
        }
#endif
    }
#endif
#if !K_Q
    for (uint c = t; c < HSK; c += WG) {
        nr_kc[kc + c] = NR_KT(nk_sh[c / 4u][c % 4u]);
    }
#endif
#if !V_Q
    [[unroll]] for (uint k = 0u; k < NR_VN; k++) {
        if (t + k * WG < HSV) {
            nr_vc[vc + t + k * WG] = NR_VT(NR_V(k));
        }
    }
#endif
    memoryBarrierBuffer();
    barrier();
    // read back as stored: the tiles take the new cell's K and V from these
#if K_Q
#define NR_K_STORED(e) KVQ_LOAD4(nr_kc_w, K_Q, e)
#else
#define NR_K_STORED(e) vec4(float(nr_kc[e]), float(nr_kc[(e) + 1u]), float(nr_kc[(e) + 2u]), float(nr_kc[(e) + 3u]))
#endif
#if V_Q
#define NR_V_STORED(e) KVQ_LOAD4(nr_vc_w, V_Q, e)
#else
#define NR_V_STORED(e) vec4(float(nr_vc[e]), float(nr_vc[(e) + 1u]), float(nr_vc[(e) + 2u]), float(nr_vc[(e) + 3u]))
#endif
    for (uint c4 = t; c4 < HSK4 + HSV4; c4 += WG) {
        if (c4 < HSK4) {
            nk_sh[c4] = NR_K_STORED(kc + 4u * c4);
        } else {
            nv_sh[c4 - HSK4] = NR_V_STORED(vc + 4u * (c4 - HSK4));
        }
    }
// the words of a row's bytes [kvq_block(e), + HS / 32 blocks) of type QT, from word w0 on
#define NR_COPY_WORDS(DST, SRC, QT, e, HS)                                                      \
    {                                                                                          \
        const uint b0 = kvq_block(QT, e), w0 = b0 >> 2;                                        \
        const uint n = ((b0 + (HS) / 32u * kvq_bytes(QT) - 1u) >> 2) - w0 + 1u;                \
        for (uint i = t; i < n; i += WG) {                                                     \
            DST[i] = SRC[w0 + i];                                                              \
        }                                                                                      \
    }
#if K_SEG
    NR_COPY_WORDS(nkw_sh, nr_kc_w, K_Q, kc, HSK)
#endif
#if V_SEG
    NR_COPY_WORDS(nvw_sh, nr_vc_w, V_Q, vc, HSV)
#endif
    barrier();
}

#endif
