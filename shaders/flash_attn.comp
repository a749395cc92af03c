#version 450
// Flash attention, scalar path, all arithmetic in fp32 (vkrt/ops/flash_attn.py).
//
// One workgroup: BR query rows of one head (x: query tile, y: head, z: batch * n_split + split).
// Threads = RG row groups x COLS column lanes x DS dot lanes. A thread owns RPT = BR/RG rows and,
// in each KV tile of BC columns, the columns col_tid + c*COLS; the DS lanes of a column split the
// head dimension (vec4 d4 = d_tid + k*DS) and add their partial dot products with subgroup
// shuffles. Every thread keeps its own online softmax (max M, sum L, unnormalised O over its
// dims) for its columns, so the KV loop has no barriers; the COLS column streams of a row are
// merged once at the end. A thread skips a KV tile where its own mask values are all -inf. With
// mask_opt (flags bit 0) the 2-bit code of each Br x Bc mask block skips the block for the whole
// workgroup before any mask read (all -inf), or the mask read and add (all zero). With
// n_split > 1 the split writes its unnormalised O with (M, L) per row and fa_split_reduce.comp
// combines the splits.
//
// Defines: HSK, HSV (head sizes), BR, BC, DS, COLS, RG, K_F16, V_F16, HAS_MASK, UNROLL (0: loops
// stay rolled, for compilers where unrolled tiles take seconds).
#include "common.glsl"
#include "attn_common.glsl"
#if DS > 1
#extension GL_KHR_shader_subgroup_shuffle : require
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

layout(binding = 0) readonly buffer Q { float q[]; };
#if K_F16
layout(binding = 1) readonly buffer K { uvec2 k_h4[]; };  // 4 halves
vec4 load_k(uint e) { const uvec2 h = k_h4[e >> 2]; return vec4(unpackHalf2x16(h.x), unpackHalf2x16(h.y)); }
#else
layout(binding = 1) readonly buffer K { vec4 k_v4[]; };
vec4 load_k(uint e) { return k_v4[e >> 2]; }
#endif
#if V_F16
layout(binding = 2) readonly buffer V { uvec2 v_h4[]; };
vec4 load_v(uint e) { const uvec2 h = v_h4[e >> 2]; return vec4(unpackHalf2x16(h.x), unpackHalf2x16(h.y)); }
#else
layout(binding = 2) readonly buffer V { vec4 v_v4[]; };
vec4 load_v(uint e) { return v_v4[e >> 2]; }
#endif
layout(binding = 3) writeonly buffer O { float o[]; };        // output, or the splits' partial O
layout(binding = 4) writeonly buffer ML { vec2 ml[]; };       // the splits' (M, L) per row
#if HAS_MASK
layout(binding = 5) readonly buffer Mask { uint m_u32[]; };   // f16
layout(binding = 6) readonly buffer MaskOpt { uint mo[]; };   // block codes (fa_mask_opt.comp)
#endif

// element offsets and strides (K and V ones multiples of 4); scale already divided by softcap
// when softcap != 0
layout(push_constant) uniform Push {
    uint N; uint KV; uint n_head; uint gqa;
    uint q_off; uint q_nb1; uint q_nb2; uint q_nb3;
    uint k_off; uint k_nb1; uint k_nb2; uint k_nb3;
    uint v_off; uint v_nb1; uint v_nb2; uint v_nb3;
    uint m_off; uint m_nb1; uint m_nb2; uint m_nb3;
    uint nem2; uint nem3; uint o_off; uint flags;
    uint n_split; uint split_tiles;
    float scale; float softcap; float max_bias;
} p;

shared vec4 tile[TILE4];           // the Q rows during the KV loop, then the merged O rows
shared float m_sh[BR * COLS];
shared float l_sh[BR * COLS];

void main() {
    const uint t = gl_LocalInvocationID.x;
    const uint d_tid = t % DS;
    const uint col_tid = (t / DS) % COLS;
    const uint rg = t / (DS * COLS);
    const uint row0 = gl_WorkGroupID.x * BR;
    const uint h = gl_WorkGroupID.y;
    const uint split = gl_WorkGroupID.z % p.n_split;
    const uint b = gl_WorkGroupID.z / p.n_split;
    const uint hk = h / p.gqa;

    const uint q_base = p.q_off + b * p.q_nb3 + h * p.q_nb2;
    for (uint i = t; i < BR * HSK4; i += WG) {
        const uint r = i / HSK4;
        const uint e = q_base + (row0 + r) * p.q_nb1 + 4u * (i % HSK4);
        tile[i] = row0 + r < p.N ? vec4(q[e], q[e + 1u], q[e + 2u], q[e + 3u]) : vec4(0.0);
    }
    barrier();

    const uint k_base = p.k_off + b * p.k_nb3 + hk * p.k_nb2;
    const uint v_base = p.v_off + b * p.v_nb3 + hk * p.v_nb2;
    const float slope = p.max_bias > 0.0 ? alibi_slope(h, p.n_head, p.max_bias) : 1.0;
    const uint ntiles = (p.KV + BC - 1u) / BC;
#if HAS_MASK
    const uint m_base = p.m_off + (b % p.nem3) * p.m_nb3 + (h % p.nem2) * p.m_nb2;
    const uint mo_stride = (ntiles + 15u) / 16u;
    const uint n_rt = (p.N + BR - 1u) / BR;
    const uint mo_base = (((b % p.nem3) * p.nem2 + h % p.nem2) * n_rt + gl_WorkGroupID.x) * mo_stride;
    const bool use_mask_opt = (p.flags & 1u) != 0u;
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

    const uint j_end = min(ntiles, (split + 1u) * p.split_tiles);
    [[dont_unroll]] for (uint j = split * p.split_tiles; j < j_end; ++j) {
        uint code = FA_MIXED;
#if HAS_MASK
        if (use_mask_opt) {
            code = (mo[mo_base + j / 16u] >> (2u * (j % 16u))) & 3u;
            if (code == FA_ALL_NEG_INF) {
                continue;
            }
        }
#endif
#if HAS_MASK
        // this thread's mask values first: a thread whose part of the block is all -inf skips it
        // (with mask_opt or without: the same work either way, so the results match bit for bit)
        float bias[RPT][CPT];
        if (code == FA_MIXED) {
            bool live = false;
            FA_UNROLL for (uint r = 0; r < RPT; ++r) {
                const uint row = min(row0 + rg * RPT + r, p.N - 1u);
                FA_UNROLL for (uint c = 0; c < CPT; ++c) {
                    const uint col = min(j * BC + c * COLS + col_tid, p.KV - 1u);
                    const float m = attn_half(m_u32, m_base + row * p.m_nb1 + col);
                    live = live || m != ATTN_NEG_INF;
                    bias[r][c] = slope * m;
                }
            }
            if (!live) {
                continue;
            }
        }
#endif
        float s[RPT][CPT];
        FA_UNROLL for (uint r = 0; r < RPT; ++r) {
            FA_UNROLL for (uint c = 0; c < CPT; ++c) {
                s[r][c] = 0.0;
            }
        }
        FA_UNROLL for (uint k = 0; k < KD; ++k) {
            const uint d4 = d_tid + k * DS;
            vec4 qc[RPT];
            FA_UNROLL for (uint r = 0; r < RPT; ++r) {
                qc[r] = tile[(rg * RPT + r) * HSK4 + d4];
            }
            FA_UNROLL for (uint c = 0; c < CPT; ++c) {
                const uint col = min(j * BC + c * COLS + col_tid, p.KV - 1u);
                const vec4 kv = load_k(k_base + col * p.k_nb1 + 4u * d4);
                FA_UNROLL for (uint r = 0; r < RPT; ++r) {
                    s[r][c] += dot(qc[r], kv);
                }
            }
        }
        FA_UNROLL for (uint r = 0; r < RPT; ++r) {
            float mx = M[r];
            FA_UNROLL for (uint c = 0; c < CPT; ++c) {
#if DS > 1
                FA_UNROLL for (uint w = DS / 2u; w > 0u; w >>= 1u) {
                    s[r][c] += subgroupShuffleXor(s[r][c], w);
                }
#endif
                const uint col = j * BC + c * COLS + col_tid;
                float x = s[r][c] * p.scale;
                if (p.softcap != 0.0) {
                    x = p.softcap * tanh(clamp(x, -15.0, 15.0));
                }
#if HAS_MASK
                if (code == FA_MIXED) {
                    x += bias[r][c];
                }
#endif
                s[r][c] = col < p.KV ? x : ATTN_NEG_INF;
                mx = max(mx, s[r][c]);
            }
            const float alpha = exp(M[r] - mx);
            M[r] = mx;
            float sum = 0.0;
            FA_UNROLL for (uint c = 0; c < CPT; ++c) {
                s[r][c] = exp(s[r][c] - mx);
                sum += s[r][c];
            }
            L[r] = L[r] * alpha + sum;
            FA_UNROLL for (uint v = 0; v < VD; ++v) {
                acc[r][v] *= alpha;
            }
        }
        FA_UNROLL for (uint c = 0; c < CPT; ++c) {
            const uint col = min(j * BC + c * COLS + col_tid, p.KV - 1u);
            FA_UNROLL for (uint v = 0; v < VD; ++v) {
                const vec4 vv = load_v(v_base + col * p.v_nb1 + 4u * (d_tid + v * DS));
                FA_UNROLL for (uint r = 0; r < RPT; ++r) {
                    acc[r][v] += s[r][c] * vv;
                }
            }
        }
    }

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
                    const uint i = (rg * RPT + r) * HSV4 + d_tid + v * DS;
                    const vec4 part = acc[r][v] * weight[r];
                    tile[i] = cl == 0u ? part : tile[i] + part;
                }
            }
        }
        barrier();
    }

    const bool partial = p.n_split > 1u;
    const uint split_rows = split * (gl_NumWorkGroups.z / p.n_split) * p.N * p.n_head;
    FA_UNROLL for (uint r = 0; r < RPT; ++r) {
        const uint row = row0 + rg * RPT + r;
        if (row >= p.N) {
            continue;
        }
        const uint out_row = (b * p.N + row) * p.n_head + h;
        const uint dst = partial ? (split_rows + out_row) * HSV : p.o_off + out_row * HSV;
        const float inv = partial ? 1.0 : (row_l[r] > 0.0 ? 1.0 / row_l[r] : 0.0);
        for (uint d4 = col_tid * DS + d_tid; d4 < HSV4; d4 += COLS * DS) {
            const vec4 val = tile[(rg * RPT + r) * HSV4 + d4] * inv;
            o[dst + 4u * d4] = val.x;
            o[dst + 4u * d4 + 1u] = val.y;
            o[dst + 4u * d4 + 2u] = val.z;
            o[dst + 4u * d4 + 3u] = val.w;
        }
        if (partial && t % (COLS * DS) == 0u) {
            ml[split_rows + out_row] = vec2(row_m[r], row_l[r]);
        }
    }
}
