#version 450
// Tiled GEMM for prefill: y[n][m] = sum_k W[m][k] * x[n][k]. A workgroup computes a BM x BN tile
// of y (rows x tokens); for each BK-slice of K it dequantises the W tile and copies the x tile
// into shared memory as fp32, then each invocation accumulates TM x TN outputs in registers.
// With MUL_MAT_ID, workgroup z is one expert of this binding and the tile's tokens are that
// expert's entries in the route table built by mmid_count.comp; tiles past an expert's count
// (all of them for an unused expert) exit at once.
#include "common.glsl"

#define TPM (BM / TM)     // invocations along the rows of the tile
#define TPN (BN / TN)     // invocations along its tokens
#define WG (TPM * TPN)
#define BMP (BM + 1)      // padded shared rows
#define BNP (BN + 1)

layout(local_size_x = WG) in;

layout(binding = 0) readonly buffer W { uint w_data[]; };
#ifdef XVEC4
layout(binding = 1) readonly buffer X { vec4 x4_data[]; };
#define XLOAD4(i) x4_data[(i) >> 2]
#define XLOAD1(i) x4_data[(i) >> 2][(i) & 3u]
#else
layout(binding = 1) readonly buffer X { float x_data[]; };
#define XLOAD4(i) vec4(x_data[i], x_data[(i) + 1u], x_data[(i) + 2u], x_data[(i) + 3u])
#define XLOAD1(i) x_data[i]
#endif
layout(binding = 2) writeonly buffer Y { float y_data[]; };
#ifdef MUL_MAT_ID
// counts[n_expert], then per expert `cap` entries token * n_used + slot
layout(binding = 3) readonly buffer Route { uint route[]; };
#endif

#define QBUF w_data
#include "quant/types.glsl"

layout(push_constant) uniform Push {
    uint K;
    uint M;        // rows of this binding
    uint N;        // tokens (MUL_MAT_ID: the route table's capacity per expert)
    uint w_off;    // byte offset of row 0 (of expert e0) in W
    uint w_row;    // bytes between rows
    uint x_off;    // float offsets and strides of x and y
    uint x_col;    // between token columns (MUL_MAT_ID: between tokens)
    uint y_off;
    uint y_col;
#ifdef MUL_MAT_ID
    uint w_expert; // bytes between experts
    uint e0;       // first expert of this binding (workgroup z = e - e0)
    uint n_expert;
    uint n_used;
    uint x_slot;   // floats between the x rows of slots; x has x_slots rows per token (1: shared)
    uint x_slots;
    uint y_slot;
#endif
} p;

shared float sw[BK * BMP];
shared float sx[BK * BNP];

#ifdef MUL_MAT_ID
uint entry(uint n) { return route[p.n_expert + (p.e0 + gl_WorkGroupID.z) * p.N + n]; }
uint x_column(uint n) {
    const uint e = entry(n), tok = e / p.n_used, slot = e % p.n_used;
    return p.x_off + tok * p.x_col + (slot % p.x_slots) * p.x_slot;
}
uint y_column(uint n) {
    const uint e = entry(n);
    return p.y_off + (e / p.n_used) * p.y_col + (e % p.n_used) * p.y_slot;
}
#else
uint x_column(uint n) { return p.x_off + n * p.x_col; }
uint y_column(uint n) { return p.y_off + n * p.y_col; }
#endif

void main() {
    const uint tid = gl_LocalInvocationID.x;
    const uint m0 = gl_WorkGroupID.x * BM, n0 = gl_WorkGroupID.y * BN;
    uint wbase = p.w_off, ncols = p.N;
#ifdef MUL_MAT_ID
    ncols = min(route[p.e0 + gl_WorkGroupID.z], p.N);
    if (n0 >= ncols) {
        return;
    }
    wbase += gl_WorkGroupID.z * p.w_expert;
#endif
    const uint tm = tid % TPM, tn = tid / TPM;
    float acc[TM * TN];
    [[unroll]] for (uint i = 0u; i < TM * TN; i++) {
        acc[i] = 0.0;
    }

    for (uint k0 = 0u; k0 < p.K; k0 += BK) {
        for (uint g = tid; g < BM * (BK / 4u); g += WG) {
            const uint m = g / (BK / 4u), kc = g % (BK / 4u), k = k0 + 4u * kc;
            vec4 v = vec4(0.0);
            if (m0 + m < p.M && k < p.K) {
                const uint row = wbase + (m0 + m) * p.w_row;
                if (k + 4u <= p.K) {
                    v = dq4(row + (k / QK) * QTS, (k % QK) >> 2);
                } else {
                    for (uint i = 0u; k + i < p.K; i++) {
                        v[i] = qelem(row, k + i);
                    }
                }
            }
            [[unroll]] for (uint i = 0u; i < 4u; i++) {
                sw[(4u * kc + i) * BMP + m] = v[i];
            }
        }
        for (uint g = tid; g < BN * (BK / 4u); g += WG) {
            const uint n = g / (BK / 4u), kc = g % (BK / 4u), k = k0 + 4u * kc;
            vec4 v = vec4(0.0);
            if (n0 + n < ncols && k < p.K) {
                const uint col = x_column(n0 + n);
                if (k + 4u <= p.K) {
                    v = XLOAD4(col + k);
                } else {
                    for (uint i = 0u; k + i < p.K; i++) {
                        v[i] = XLOAD1(col + k + i);
                    }
                }
            }
            [[unroll]] for (uint i = 0u; i < 4u; i++) {
                sx[(4u * kc + i) * BNP + n] = v[i];
            }
        }
        barrier();
        [[unroll]] for (uint kk = 0u; kk < BK; kk++) {
            float a[TM], b[TN];
            [[unroll]] for (uint i = 0u; i < TM; i++) {
                a[i] = sw[kk * BMP + tm + i * TPM];
            }
            [[unroll]] for (uint j = 0u; j < TN; j++) {
                b[j] = sx[kk * BNP + tn + j * TPN];
            }
            [[unroll]] for (uint i = 0u; i < TM; i++) {
                [[unroll]] for (uint j = 0u; j < TN; j++) {
                    acc[i * TN + j] = fma(a[i], b[j], acc[i * TN + j]);
                }
            }
        }
        barrier();
    }

    [[unroll]] for (uint j = 0u; j < TN; j++) {
        const uint n = n0 + tn + j * TPN;
        if (n < ncols) {
            const uint col = y_column(n);
            [[unroll]] for (uint i = 0u; i < TM; i++) {
                const uint m = m0 + tm + i * TPM;
                if (m < p.M) {
                    y_data[col + m] = acc[i * TN + j];
                }
            }
        }
    }
}
