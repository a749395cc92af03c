#version 450
// Flash attention on cooperative matrices (prompt batches; vkrt/ops/flash_attn.py): Q, K, V and
// the probabilities P as fp16 16x16 fragments, every sum in fp32, as in llama.cpp's coopmat
// flash attention.
//
// One workgroup: BR = 16 * NSG query rows of one head (x: query tile, y: head, z: batch), one
// subgroup of SGS invocations per 16 rows. Q's fragments stay in registers for the whole KV
// loop. Per KV tile of BC cells, K and V are copied into shared memory as fp16 rows; each
// subgroup computes S = Q K^T (fp32, 16 x BC) into its part of shared memory, where SGS / 16
// lanes a row apply scale, softcap and mask, keep the row's running max M and sum L, and write
// P = exp(S - M) as fp16 and the rescale factor exp(M_old - M) as a 16 x 16 accumulator (row r
// all alpha_r); then O = O * alpha (component-wise: the same fragment type, so the same element
// mapping) + P V. mask_opt (flags bit 0) skips all -inf blocks and the mask reads of all-zero
// ones, as in the scalar kernel. No split along KV, no packed heads: the caller picks the scalar
// kernel for those.
//
// Defines: HSK, HSV (multiples of 16), BC (a multiple of 16), NSG, SGS, K_F16, V_F16, K_Q, V_Q
// (a quantised cache's type: its blocks dequantised as the tile is copied), HAS_MASK, KV_USED, SINKS.
#include "common.glsl"
#include "attn_common.glsl"
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#ifndef K_Q
#define K_Q 0
#endif
#ifndef V_Q
#define V_Q 0
#endif

#define WG (NSG * SGS)
#define BR (16u * NSG)
#define LPR (SGS / 16u)            // lanes a row in the softmax
#define CPL (BC / LPR)             // columns a lane
#define HSKP (HSK + 8u)            // padded fp16 rows of Q and K, V (16-byte aligned, banks apart)
#define HSVP (HSV + 8u)
#define SP (BC + 4u)               // padded fp32 rows of S
#define PP (BC + 8u)               // padded fp16 rows of P
// shared memory in uvec2 (4 halves, 2 floats): Q first (until its fragments are loaded), then K,
// V and each subgroup's S, P and alpha
#define K_OFF 0u
#define V_OFF (K_OFF + BC * HSKP / 4u)
#define S_OFF (V_OFF + BC * HSVP / 4u)
#define P_OFF (S_OFF + NSG * 16u * SP / 2u)
#define A_OFF (P_OFF + NSG * 16u * PP / 4u)
#define END_OFF (A_OFF + NSG * 128u)
#define Q_SIZE (BR * HSKP / 4u)
#define FRAG_A coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define FRAG_B coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define FRAG_C coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>

layout(local_size_x = WG) in;

layout(binding = 0) readonly buffer Q { float q[]; };
uvec2 halves4(vec4 v) { return uvec2(packHalf2x16(v.xy), packHalf2x16(v.zw)); }
// K_Q / V_Q: a quantised cache's kv_quant.glsl type (offsets and strides count elements as its
// blocks of 32 do), dequantised 4 elements at a time as the tile is copied
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
#if K_Q
uvec2 load_k(uint e) { return halves4(KVQ_LOAD4(k_w, K_Q, e)); }
#elif K_F16
layout(binding = 1) readonly buffer K { uvec2 k_h4[]; };   // 4 halves
uvec2 load_k(uint e) { return k_h4[e >> 2]; }
#else
layout(binding = 1) readonly buffer K { vec4 k_v4[]; };
uvec2 load_k(uint e) { return halves4(k_v4[e >> 2]); }
#endif
#if V_Q && K_Q
layout(binding = 2) readonly buffer V { uint v_w[]; };
#endif
#if V_Q
uvec2 load_v(uint e) { return halves4(KVQ_LOAD4(v_w, V_Q, e)); }
#elif V_F16
layout(binding = 2) readonly buffer V { uvec2 v_h4[]; };
uvec2 load_v(uint e) { return v_h4[e >> 2]; }
#else
layout(binding = 2) readonly buffer V { vec4 v_v4[]; };
uvec2 load_v(uint e) { return halves4(v_v4[e >> 2]); }
#endif
layout(binding = 3) writeonly buffer O { float o[]; };
#if HAS_MASK
layout(binding = 4) readonly buffer Mask { uint m_u32[]; };   // f16
layout(binding = 5) readonly buffer MaskOpt { uint mo[]; };   // block codes (fa_mask_opt.comp)
#endif
#if KV_USED
layout(binding = 4 + 2 * HAS_MASK) readonly buffer KvUsed { uint kv_used; };
#endif
#if SINKS
layout(binding = 4 + 2 * HAS_MASK + KV_USED) readonly buffer Sinks { float sinks[]; };
#endif

// the scalar kernel's push constants (n_split is 1)
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

shared uvec2 sh[END_OFF > Q_SIZE ? END_OFF : Q_SIZE];

float s_at(uint f) { return uintBitsToFloat(sh[f >> 1u][f & 1u]); }

void main() {
    const uint t = gl_LocalInvocationID.x;
    const uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
    const uint r = lane % 16u, part = lane / 16u;      // this lane's row of its subgroup's 16, its columns
    const uint row0 = gl_WorkGroupID.x * BR;
    const uint h = gl_WorkGroupID.y, b = gl_WorkGroupID.z;
    const uint hk = h / p.gqa;
    const uint h_mask = h % p.nem2;
    const float slope = p.max_bias > 0.0 ? alibi_slope(h, p.n_head, p.max_bias) : 1.0;
#if KV_USED
    const uint kv = min(p.KV, kv_used);
#else
    const uint kv = p.KV;
#endif

    // Q as fp16 rows, then each subgroup's fragments
    const uint q_base = p.q_off + b * p.q_nb3 + h * p.q_nb2;
    for (uint i = t; i < BR * (HSK / 4u); i += WG) {
        const uint row = row0 + i / (HSK / 4u), d4 = i % (HSK / 4u);
        vec4 v = vec4(0.0);
        if (row < p.N) {
            const uint e = q_base + row * p.q_nb1 + 4u * d4;
            v = vec4(q[e], q[e + 1u], q[e + 2u], q[e + 3u]);
        }
        sh[(i / (HSK / 4u)) * (HSKP / 4u) + d4] = uvec2(packHalf2x16(v.xy), packHalf2x16(v.zw));
    }
    barrier();
    FRAG_A qf[HSK / 16u];
    [[unroll]] for (uint d = 0u; d < HSK / 16u; d++) {
        coopMatLoad(qf[d], sh, (sg * 16u) * (HSKP / 4u) + 4u * d, HSKP / 4u, gl_CooperativeMatrixLayoutRowMajor);
    }
    FRAG_C of[HSV / 16u];
    [[unroll]] for (uint d = 0u; d < HSV / 16u; d++) {
        of[d] = FRAG_C(0.0);
    }
    barrier();

    const uint k_base = p.k_off + b * p.k_nb3 + hk * p.k_nb2;
    const uint v_base = p.v_off + b * p.v_nb3 + hk * p.v_nb2;
    const uint ntiles = (p.KV + BC - 1u) / BC;
    const uint live_tiles = (kv + BC - 1u) / BC;
    const uint my_row = row0 + sg * 16u + r;
#if HAS_MASK
    const uint m_base = p.m_off + (b % p.nem3) * p.m_nb3 + h_mask * p.m_nb2;
    const uint mo_stride = (ntiles + 15u) / 16u;
    const uint n_rt = (p.N + BR - 1u) / BR;
    const uint mo_base = (((b % p.nem3) * p.nem2 + h_mask) * n_rt + gl_WorkGroupID.x) * mo_stride;
    const bool use_mask_opt = (p.flags & 1u) != 0u;
    const uint m_row = m_base + min(my_row, p.N - 1u) * p.m_nb1;
#endif
    const uint s_base = S_OFF + sg * 16u * SP / 2u;      // this subgroup's S (uvec2 index)
    const uint p_base = P_OFF + sg * 16u * PP / 4u;
    const uint a_base = A_OFF + sg * 128u;
    float M = FA_NEG_BIG, L = 0.0;

    [[dont_unroll]] for (uint j = 0u; j < live_tiles; ++j) {
        uint code = FA_MIXED;
#if HAS_MASK
        if (use_mask_opt) {
            code = (mo[mo_base + j / 16u] >> (2u * (j % 16u))) & 3u;
            if (code == FA_ALL_NEG_INF) {
                continue;
            }
        }
#endif
        // K and V rows of the tile as fp16 (cells past KV repeat the last: masked below)
        for (uint i = t; i < BC * (HSK / 4u); i += WG) {
            const uint c = i / (HSK / 4u), d4 = i % (HSK / 4u);
            const uint col = min(j * BC + c, p.KV - 1u);
            sh[K_OFF + c * (HSKP / 4u) + d4] = load_k(k_base + col * p.k_nb1 + 4u * d4);
        }
        for (uint i = t; i < BC * (HSV / 4u); i += WG) {
            const uint c = i / (HSV / 4u), d4 = i % (HSV / 4u);
            const uint col = min(j * BC + c, p.KV - 1u);
            sh[V_OFF + c * (HSVP / 4u) + d4] = load_v(v_base + col * p.v_nb1 + 4u * d4);
        }
        barrier();

        // S = Q K^T: K's rows are the columns of K^T
        [[unroll]] for (uint c = 0u; c < BC / 16u; c++) {
            FRAG_C s = FRAG_C(0.0);
            [[unroll]] for (uint d = 0u; d < HSK / 16u; d++) {
                FRAG_B kt;
                coopMatLoad(kt, sh, K_OFF + (16u * c) * (HSKP / 4u) + 4u * d, HSKP / 4u,
                            gl_CooperativeMatrixLayoutColumnMajor);
                s = coopMatMulAdd(qf[d], kt, s);
            }
            coopMatStore(s, sh, s_base + 8u * c, SP / 2u, gl_CooperativeMatrixLayoutRowMajor);
        }
        subgroupMemoryBarrierShared();
        subgroupBarrier();

        // the row's softmax step: this lane's CPL columns, the row's other lanes by shuffles
        float x[CPL];
        float mx = M;
        [[unroll]] for (uint c = 0u; c < CPL; c++) {
            const uint cc = part * CPL + c, col = j * BC + cc;
            float v = s_at(2u * s_base + r * SP + cc) * p.scale;
            if (p.softcap != 0.0) {
                v = p.softcap * tanh(clamp(v, -15.0, 15.0));
            }
#if HAS_MASK
            if (code == FA_MIXED) {
                v += slope * attn_half(m_u32, m_row + min(col, p.KV - 1u));
            }
#endif
            x[c] = col < kv ? v : ATTN_NEG_INF;
            mx = max(mx, x[c]);
        }
        [[unroll]] for (uint w = 16u; w < SGS; w <<= 1u) {
            mx = max(mx, subgroupShuffleXor(mx, w));
        }
        const float alpha = exp(M - mx);
        M = mx;
        float sum = 0.0;
        [[unroll]] for (uint c = 0u; c < CPL; c += 4u) {
            const vec4 e = exp(vec4(x[c], x[c + 1u], x[c + 2u], x[c + 3u]) - mx);
            sum += (e.x + e.y) + (e.z + e.w);
            sh[p_base + r * (PP / 4u) + (part * CPL + c) / 4u] = uvec2(packHalf2x16(e.xy), packHalf2x16(e.zw));
        }
        [[unroll]] for (uint w = 16u; w < SGS; w <<= 1u) {
            sum += subgroupShuffleXor(sum, w);
        }
        L = L * alpha + sum;
        [[unroll]] for (uint c = part * (16u / LPR); c < (part + 1u) * (16u / LPR); c += 2u) {
            sh[a_base + r * 8u + c / 2u] = uvec2(floatBitsToUint(alpha));
        }
        subgroupMemoryBarrierShared();
        subgroupBarrier();

        // O = O * alpha + P V
        FRAG_C rescale;
        coopMatLoad(rescale, sh, a_base, 8u, gl_CooperativeMatrixLayoutRowMajor);
        [[unroll]] for (uint d = 0u; d < HSV / 16u; d++) {
            of[d] = of[d] * rescale;
        }
        [[unroll]] for (uint c = 0u; c < BC / 16u; c++) {
            FRAG_A pf;
            coopMatLoad(pf, sh, p_base + 4u * c, PP / 4u, gl_CooperativeMatrixLayoutRowMajor);
            [[unroll]] for (uint d = 0u; d < HSV / 16u; d++) {
                FRAG_B vf;
                coopMatLoad(vf, sh, V_OFF + (16u * c) * (HSVP / 4u) + 4u * d, HSVP / 4u,
                            gl_CooperativeMatrixLayoutRowMajor);
                of[d] = coopMatMulAdd(pf, vf, of[d]);
            }
        }
        barrier();
    }

    // O / L row by row through this subgroup's S area (16 x 16 a fragment)
#if SINKS
    const float f = attn_sink_factor(M, L, sinks[p.s_off + h]);
#else
    const float f = 1.0;
#endif
    const float inv = L > 0.0 ? f / L : 0.0;
    const uint out_row = (b * p.N + my_row) * p.n_head + h;
    [[unroll]] for (uint d = 0u; d < HSV / 16u; d++) {
        coopMatStore(of[d], sh, s_base, SP / 2u, gl_CooperativeMatrixLayoutRowMajor);
        subgroupMemoryBarrierShared();
        subgroupBarrier();
        if (my_row < p.N) {
            [[unroll]] for (uint c = part * (16u / LPR); c < (part + 1u) * (16u / LPR); c++) {
                o[p.o_off + out_row * HSV + 16u * d + c] = s_at(2u * s_base + r * SP + c) * inv;
            }
        }
        subgroupBarrier();
    }
}
