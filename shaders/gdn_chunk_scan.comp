#version 450
// Gated delta rule, chunked form, pass 2 of 2 (vkrt/ops/delta_net.py): walks a sequence's chunks in
// order with RB rows of one head's state. One workgroup per (row block, value head, sequence); the
// block S (RB x D) stays in shared memory, transposed (sT[j][r], rows in vec4s) for the whole walk.
// Per chunk, with the workspace block of gdn_chunk_prep.comp (Tb, A, ck, cq, cd, e^gc_last) and the
// raw k, q, v of the chunk's tokens (padding reads as zeros):
//   A  KS = K_raw S^T, QS = Q_raw S^T                       [C x RB], K and Q staged DT columns at a time
//      X  = V - ck * KS,   Oq = cq * QS
//   B  Vn = Tb X                                            (the chunk's corrected values)
//   C  O  = Oq + A Vn                                       -> out, for the chunk's real tokens
//   D  S  = e^gc_last S + Vn^T (cd * K_raw)                 K staged TT tokens at a time
// Phases A-C: a thread owns tokens tg + NT p (p < PT) x the 4 rows 4 rg..4 rg+3 (rg < NR = RB / 4).
// Phase D: a thread owns the 4 rows 4 rg.. x the NJ columns tg + NT n of the state.
// The walk is a chain of dependent steps, so every global read is started a step early: each tile
// staged in shared memory (K/Q columns, Tb and A columns, scaled K tokens) is loaded into registers
// while the one before it is in use, the next chunk's first K/Q tile during this chunk's last one.
//
// Defines: D, C, RB, WG, DT, TT (WG a multiple of NR; NT = WG / NR divides C and D; WG divides
// C * DT, C * ST and TT * D), UNROLL (0: the loops over staged columns and tokens stay rolled, for compilers
// where unrolling takes seconds).
#include "common.glsl"

layout(local_size_x = WG) in;

#if UNROLL
#define GDN_UNROLL [[unroll]]
#else
#define GDN_UNROLL [[dont_unroll]]
#endif

const uint NR = RB / 4u;
const uint NT = WG / NR;
const uint PT = C / NT;
const uint NJ = D / NT;
const uint DTP = DT + 1u;
const uint STAGE = 2u * C * DTP > TT * D ? 2u * C * DTP : TT * D;   // >= C * (ST + 1) too
const uint BLOCK = 2u * C * C + 3u * C + 4u;
const uint ST = 32u < C ? 32u : C; // columns of Tb / A staged at a time (row stride ST + 1)
const uint EA = C * DT / WG;       // K (and Q) values a thread stages per column tile
const uint ED = TT * D / WG;       // scaled K values a thread stages per token tile
const uint EM = C * ST / WG;       // Tb / A values a thread stages per column tile

layout(binding = 0) readonly buffer QKV { float qkv[]; };
layout(binding = 1) readonly buffer Work { vec4 ws4[]; };
layout(binding = 2) buffer State { vec4 state4[]; };
layout(binding = 3) readonly buffer Slots { int slots[]; };
layout(binding = 4) writeonly buffer Out { float o[]; };

// element offsets and strides; the state's and ws_off multiples of 4
layout(push_constant) uniform Push {
    uint seq_tokens;    // tokens per sequence
    uint n_chunks;      // chunks per sequence
    uint n_k_heads;
    uint qkv_off; uint qkv_s1;
    uint ws_off;
    uint st_off; uint st_s1; uint st_s2; uint st_s3;
    uint slot_off;
    uint out_off; uint out_s1;
} p;

shared vec4 sT[D * NR];            // the state block, sT[j * NR + rg] = S[4 rg .. 4 rg + 3][j]
shared float stage[STAGE];
shared vec4 xv[C * NR];            // X, then Vn

float wsf(uint i) {
    return ws4[i / 4u][i % 4u];
}

// the next staged tile, in flight
float pre_k[EA], pre_q[EA], pre_d[ED], pre_m[EM];

// the chunk's tile of K_raw and Q_raw columns d0..d0+DT-1 (zeros past the sequence)
void load_kq(uint k_off, uint q_off, uint n_valid, uint d0) {
    [[unroll]] for (uint i = 0; i < EA; ++i) {
        const uint e = gl_LocalInvocationID.x + WG * i;
        const uint t = e / DT, c = t * p.qkv_s1 + d0 + e % DT;
        const bool live = t < n_valid;
        pre_k[i] = live ? qkv[k_off + c] : 0.0;
        pre_q[i] = live ? qkv[q_off + c] : 0.0;
    }
}

// columns s0..s0+ST-1 of the C x C matrix at float offset m_off of the workspace (Tb or A)
void load_mat(uint m_off, uint s0) {
    [[unroll]] for (uint i = 0; i < EM; ++i) {
        const uint e = gl_LocalInvocationID.x + WG * i;
        pre_m[i] = wsf(m_off + (e / ST) * C + s0 + e % ST);
    }
}

void store_mat() {
    [[unroll]] for (uint i = 0; i < EM; ++i) {
        const uint e = gl_LocalInvocationID.x + WG * i;
        stage[(e / ST) * (ST + 1u) + e % ST] = pre_m[i];
    }
}

// cd * K_raw of the chunk's tokens c0..c0+TT-1
void load_kd(uint k_off, uint n_valid, uint cd_off, uint c0) {
    [[unroll]] for (uint i = 0; i < ED; ++i) {
        const uint e = gl_LocalInvocationID.x + WG * i;
        const uint t = c0 + e / D;
        pre_d[i] = t < n_valid ? qkv[k_off + t * p.qkv_s1 + e % D] * wsf(cd_off + t) : 0.0;
    }
}

void main() {
    const uint tid = gl_LocalInvocationID.x;
    const uint rg = tid % NR;
    const uint tg = tid / NR;
    const uint h = gl_WorkGroupID.y;
    const uint seq = gl_WorkGroupID.z;
    const uint row0 = gl_WorkGroupID.x * RB;
    const uint kh = h % p.n_k_heads;
    const uint slot = uint(slots[p.slot_off + seq]);
    const uint st_base = (p.st_off + slot * p.st_s3 + h * p.st_s2 + row0 * p.st_s1) / 4u;
    const uint q_base = p.qkv_off + seq * p.seq_tokens * p.qkv_s1 + kh * D;   // chunk 0's first query
    const uint k_base = q_base + p.n_k_heads * D;
    const uint ws_base = p.ws_off + (seq * gl_NumWorkGroups.y + h) * p.n_chunks * BLOCK;

    for (uint e = tid; e < RB * (D / 4u); e += WG) {
        const uint r = e / (D / 4u), jv = e % (D / 4u);
        const vec4 v = state4[st_base + r * (p.st_s1 / 4u) + jv];
        [[unroll]] for (uint i = 0; i < 4u; ++i) {
            sT[(4u * jv + i) * NR + r / 4u][r % 4u] = v[i];
        }
    }
    load_kq(k_base, q_base, min(C, p.seq_tokens), 0);

    [[dont_unroll]] for (uint chunk = 0; chunk < p.n_chunks; ++chunk) {
        const uint n_valid = min(C, p.seq_tokens - chunk * C);
        const uint t0 = seq * p.seq_tokens + chunk * C;
        const uint k_off = k_base + chunk * C * p.qkv_s1;
        const uint block = ws_base + chunk * BLOCK;
        const uint sc = block + 2u * C * C;   // per-token scalars

        // A: K_raw S^T and Q_raw S^T
        vec4 acc[PT], oq[PT];
        [[unroll]] for (uint i = 0; i < PT; ++i) {
            acc[i] = vec4(0.0);
            oq[i] = vec4(0.0);
        }
        [[dont_unroll]] for (uint d0 = 0; d0 < D; d0 += DT) {
            [[unroll]] for (uint i = 0; i < EA; ++i) {
                const uint e = tid + WG * i;
                const uint at = (e / DT) * DTP + e % DT;
                stage[at] = pre_k[i];
                stage[C * DTP + at] = pre_q[i];
            }
            barrier();
            if (d0 + DT < D) {
                load_kq(k_off, k_off - p.n_k_heads * D, n_valid, d0 + DT);
            } else {
                load_mat(block, 0);
            }
            GDN_UNROLL for (uint j = 0; j < DT; ++j) {
                const vec4 s = sT[(d0 + j) * NR + rg];
                [[unroll]] for (uint i = 0; i < PT; ++i) {
                    const uint t = tg + NT * i;
                    acc[i] += stage[t * DTP + j] * s;
                    oq[i] += stage[(C + t) * DTP + j] * s;
                }
            }
            barrier();
        }
        [[unroll]] for (uint i = 0; i < PT; ++i) {
            const uint t = tg + NT * i;
            vec4 v = vec4(0.0);
            if (t < n_valid) {
                const uint vb = p.qkv_off + (t0 + t) * p.qkv_s1 + 2u * p.n_k_heads * D + h * D + row0 + 4u * rg;
                v = vec4(qkv[vb], qkv[vb + 1u], qkv[vb + 2u], qkv[vb + 3u]);
            }
            xv[t * NR + rg] = v - wsf(sc + t) * acc[i];
            oq[i] *= wsf(sc + C + t);
        }
        barrier();

        // B: Vn = Tb X, C: O = Oq + A Vn (Tb and A are zero above the diagonal)
        [[unroll]] for (uint i = 0; i < PT; ++i) {
            acc[i] = vec4(0.0);
        }
        [[dont_unroll]] for (uint s0 = 0; s0 < C; s0 += ST) {
            store_mat();
            barrier();
            if (s0 + ST < C) {
                load_mat(block, s0 + ST);
            } else {
                load_mat(block + C * C, 0);
            }
            GDN_UNROLL for (uint s = 0; s < ST; ++s) {
                const vec4 x = xv[(s0 + s) * NR + rg];
                [[unroll]] for (uint i = 0; i < PT; ++i) {
                    acc[i] += stage[(tg + NT * i) * (ST + 1u) + s] * x;
                }
            }
            barrier();
        }
        [[unroll]] for (uint i = 0; i < PT; ++i) {
            xv[(tg + NT * i) * NR + rg] = acc[i];   // Vn over X
        }
        [[dont_unroll]] for (uint s0 = 0; s0 < C; s0 += ST) {
            store_mat();
            barrier();
            if (s0 + ST < C) {
                load_mat(block + C * C, s0 + ST);
            } else {
                load_kd(k_off, n_valid, sc + 2u * C, 0);
            }
            GDN_UNROLL for (uint s = 0; s < ST; ++s) {
                const vec4 v = xv[(s0 + s) * NR + rg];
                [[unroll]] for (uint i = 0; i < PT; ++i) {
                    oq[i] += stage[(tg + NT * i) * (ST + 1u) + s] * v;
                }
            }
            barrier();
        }
        [[unroll]] for (uint i = 0; i < PT; ++i) {
            const uint t = tg + NT * i;
            if (t < n_valid) {
                const uint ob = p.out_off + (t0 + t) * p.out_s1 + h * D + row0 + 4u * rg;
                o[ob] = oq[i].x;
                o[ob + 1u] = oq[i].y;
                o[ob + 2u] = oq[i].z;
                o[ob + 3u] = oq[i].w;
            }
        }

        // D: S = e^gc_last S + Vn^T (cd * K_raw)
        const float decay = wsf(sc + 3u * C);
        vec4 s4[NJ];
        [[unroll]] for (uint n = 0; n < NJ; ++n) {
            s4[n] = decay * sT[(tg + NT * n) * NR + rg];
        }
        [[dont_unroll]] for (uint c0 = 0; c0 < C; c0 += TT) {
            [[unroll]] for (uint i = 0; i < ED; ++i) {
                stage[tid + WG * i] = pre_d[i];
            }
            barrier();
            if (c0 + TT < C) {
                load_kd(k_off, n_valid, sc + 2u * C, c0 + TT);
            } else if (chunk + 1u < p.n_chunks) {
                const uint k_next = k_off + C * p.qkv_s1;
                load_kq(k_next, k_next - p.n_k_heads * D, min(C, p.seq_tokens - (chunk + 1u) * C), 0);
            }
            GDN_UNROLL for (uint t = 0; t < TT; ++t) {
                const vec4 v = xv[(c0 + t) * NR + rg];
                [[unroll]] for (uint n = 0; n < NJ; ++n) {
                    s4[n] += stage[t * D + tg + NT * n] * v;
                }
            }
            barrier();
        }
        [[unroll]] for (uint n = 0; n < NJ; ++n) {
            sT[(tg + NT * n) * NR + rg] = s4[n];
        }
        barrier();
    }

    for (uint e = tid; e < RB * (D / 4u); e += WG) {
        const uint r = e / (D / 4u), jv = e % (D / 4u);
        vec4 v;
        [[unroll]] for (uint i = 0; i < 4u; ++i) {
            v[i] = sT[(4u * jv + i) * NR + r / 4u][r % 4u];
        }
        state4[st_base + r * (p.st_s1 / 4u) + jv] = v;
    }
}
