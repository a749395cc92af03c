#version 450
// Gated delta rule, chunked form, pass 1 of 2 (vkrt/ops/delta_net.py): what one chunk of C tokens
// of one head needs, independent of the state. One workgroup per (chunk, value head, sequence).
// Tokens past the sequence's end are padding: k = q = v = 0, g = b = 0.
//
// With gc the inclusive cumulative sum of g over the chunk, k_t = nk_t * k_raw_t and
// q_t = nq_t * q_raw_t (nk, nq the L2 factors, nq including 1/sqrt(D)):
//     L[t][s] = b_t (k_t . k_s) e^(gc_t - gc_s)  (s < t),   T = (I + L)^-1 (unit lower triangular)
//     A[t][s] = (q_t . k_s) e^(gc_t - gc_s)      (s <= t)
// Written to the chunk's workspace block (floats; ChunkLayout.block_floats in delta_net.py):
//     [0, C^2)        Tb = T diag(b)                (Vn = Tb (V - ck * (K_raw S^T)))
//     [C^2, 2C^2)     A                             (zero above the diagonal)
//     [2C^2, +C)      ck_t = e^gc_t nk_t
//     [+C, +2C)       cq_t = e^gc_t nq_t
//     [+2C, +3C)      cd_t = e^(gc_last - gc_t) nk_t
//     [+3C]           e^gc_last
// Every exponent is <= 0. The Gram matrices K K^T and Q K^T of the raw vectors are accumulated over
// D in tiles of DT columns staged in shared memory; a thread owns GR rows t (tr + NTR p) x 4
// columns s of both. T is found in place of L, T[t][s] = -(L[t][s] + sum_{s<m<t} L[t][m] T[m][s]),
// one row m a step: C steps of GR x 4 multiply-adds a thread.
//
// Defines: D, C, DT, WG (C <= WG <= C * C / 4; 4 * WG a multiple of C), UNROLL (0: the loop over
// staged columns stays rolled, for compilers where unrolling takes seconds).
#include "common.glsl"
#include "gdn.glsl"

layout(local_size_x = WG) in;

#if UNROLL
#define GDN_UNROLL [[unroll]]
#else
#define GDN_UNROLL [[dont_unroll]]
#endif

const uint DTP = DT + 1u;          // staged row stride (odd: rows fall in different banks)
const uint NTC = C / 4u;           // Gram column groups
const uint NTR = WG / NTC;         // Gram row groups
const uint GR = C / NTR;           // Gram rows per thread
const uint BLOCK = 2u * C * C + 3u * C + 4u;

layout(binding = 0) readonly buffer QKV { float qkv[]; };
layout(binding = 1) readonly buffer Alpha { float alpha[]; };
layout(binding = 2) readonly buffer Beta { float beta[]; };
layout(binding = 3) readonly buffer DtBias { float dt_bias[]; };
layout(binding = 4) readonly buffer SsmA { float ssm_a[]; };
layout(binding = 5) writeonly buffer Work { vec4 ws4[]; };    // scalars written as components

layout(push_constant) uniform Push {
    uint seq_tokens;    // tokens per sequence
    uint n_k_heads;
    uint qkv_off; uint qkv_s1;
    uint alpha_off; uint alpha_s1;
    uint beta_off; uint beta_s1;
    uint dt_off; uint a_off;
    uint ws_off;        // a multiple of 4
    float eps;
} p;

shared float kt[C * DTP];
shared float qt[C * DTP];
shared float mat[C * C];           // L, then T (strictly lower part)
shared float gc_sh[C];
shared float b_sh[C];
shared float nk_sh[C];
shared float nq_sh[C];

void main() {
    const uint tid = gl_LocalInvocationID.x;
    const uint chunk = gl_WorkGroupID.x;
    const uint h = gl_WorkGroupID.y;
    const uint seq = gl_WorkGroupID.z;
    const uint n_valid = min(C, p.seq_tokens - chunk * C);
    const uint t0 = seq * p.seq_tokens + chunk * C;
    const uint kh = h % p.n_k_heads;
    const uint q_off = p.qkv_off + t0 * p.qkv_s1 + kh * D;
    const uint k_off = q_off + p.n_k_heads * D;

    if (tid < C) {
        float g = 0.0, b = 0.0;
        if (tid < n_valid) {
            const uint t = t0 + tid;
            g = gdn_log_decay(alpha[p.alpha_off + t * p.alpha_s1 + h], dt_bias[p.dt_off + h], ssm_a[p.a_off + h]);
            b = gdn_strength(beta[p.beta_off + t * p.beta_s1 + h]);
        }
        gc_sh[tid] = g;
        b_sh[tid] = b;
    }

    const uint tc = tid % NTC;
    const uint tr = tid / NTC;
    vec4 kk[GR], qk[GR];
    [[unroll]] for (uint i = 0; i < GR; ++i) {
        kk[i] = vec4(0.0);
        qk[i] = vec4(0.0);
    }
    float ss_k = 0.0, ss_q = 0.0;
    [[dont_unroll]] for (uint d0 = 0; d0 < D; d0 += DT) {
        for (uint e = tid; e < C * DT; e += WG) {
            const uint t = e / DT, j = e % DT;
            const bool live = t < n_valid;
            kt[t * DTP + j] = live ? qkv[k_off + t * p.qkv_s1 + d0 + j] : 0.0;
            qt[t * DTP + j] = live ? qkv[q_off + t * p.qkv_s1 + d0 + j] : 0.0;
        }
        barrier();
        if (tid < C) {
            for (uint j = 0; j < DT; ++j) {
                const float kv = kt[tid * DTP + j], qv = qt[tid * DTP + j];
                ss_k += kv * kv;
                ss_q += qv * qv;
            }
        }
        GDN_UNROLL for (uint j = 0; j < DT; ++j) {
            const uint s = 4u * tc * DTP + j;
            const vec4 ks = vec4(kt[s], kt[s + DTP], kt[s + 2u * DTP], kt[s + 3u * DTP]);
            [[unroll]] for (uint i = 0; i < GR; ++i) {
                const uint t = (tr + NTR * i) * DTP + j;
                kk[i] += kt[t] * ks;
                qk[i] += qt[t] * ks;
            }
        }
        barrier();
    }
    if (tid < C) {
        nk_sh[tid] = gdn_inv_norm(ss_k, p.eps);
        nq_sh[tid] = gdn_inv_norm(ss_q, p.eps) * inversesqrt(float(D));
    }
    if (tid == 0) {
        float acc = 0.0;
        for (uint t = 0; t < C; ++t) {
            acc += gc_sh[t];
            gc_sh[t] = acc;
        }
    }
    barrier();

    const uint block = p.ws_off + ((seq * gl_NumWorkGroups.y + h) * gl_NumWorkGroups.x + chunk) * BLOCK;
    [[unroll]] for (uint i = 0; i < GR; ++i) {
        const uint t = tr + NTR * i;
        const float gt = gc_sh[t], nkt = nk_sh[t], nqt = nq_sh[t], bt = b_sh[t];
        vec4 a;
        [[unroll]] for (uint e = 0; e < 4u; ++e) {
            const uint s = 4u * tc + e;
            const float decay = s <= t ? exp(gt - gc_sh[s]) : 0.0;
            const float nks = nk_sh[s];
            mat[t * C + s] = s < t ? bt * nkt * nks * kk[i][e] * decay : 0.0;
            a[e] = nqt * nks * qk[i][e] * decay;
        }
        ws4[(block + C * C + t * C) / 4u + tc] = a;
    }
    barrier();

    // T in place of L, right-looking: row m is final once the rows above it have been added to
    // its sums; then every row r adds L[r][m] T[m][s] (zero where r <= m or s >= m: there mat holds
    // T's zeros above its diagonal, or L's). kk holds each thread's sums.
    [[unroll]] for (uint i = 0; i < GR; ++i) {
        kk[i] = vec4(0.0);
    }
    [[dont_unroll]] for (uint m = 0; m < C; ++m) {
        const uint row_m = m * C + 4u * tc;
        [[unroll]] for (uint i = 0; i < GR; ++i) {
            if (tr + NTR * i == m) {
                const vec4 t = -(vec4(mat[row_m], mat[row_m + 1u], mat[row_m + 2u], mat[row_m + 3u]) + kk[i]);
                mat[row_m] = t.x;
                mat[row_m + 1u] = t.y;
                mat[row_m + 2u] = t.z;
                mat[row_m + 3u] = t.w;
            }
        }
        barrier();
        const vec4 tm = vec4(mat[row_m], mat[row_m + 1u], mat[row_m + 2u], mat[row_m + 3u]);
        [[unroll]] for (uint i = 0; i < GR; ++i) {
            kk[i] += mat[(tr + NTR * i) * C + m] * tm;
        }
        barrier();
    }

    for (uint e = tid; e < C * NTC; e += WG) {
        const uint t = e / NTC, s0 = 4u * (e % NTC);
        vec4 v;
        [[unroll]] for (uint i = 0; i < 4u; ++i) {
            const uint s = s0 + i;
            v[i] = s < t ? mat[t * C + s] * b_sh[s] : (s == t ? b_sh[s] : 0.0);
        }
        ws4[block / 4u + e] = v;
    }
    if (tid < C) {
        const float g_last = gc_sh[C - 1u], gt = gc_sh[tid], et = exp(gt);
        const uint sb = block + 2u * C * C;
        ws4[(sb + tid) / 4u][tid % 4u] = et * nk_sh[tid];
        ws4[(sb + C + tid) / 4u][tid % 4u] = et * nq_sh[tid];
        ws4[(sb + 2u * C + tid) / 4u][tid % 4u] = exp(g_last - gt) * nk_sh[tid];
        if (tid == 0) {
            ws4[(sb + 3u * C) / 4u] = vec4(exp(g_last), 0.0, 0.0, 0.0);
        }
    }
}
