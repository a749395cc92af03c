#version 450
// Tiled GEMM for prefill: y[n][m] = sum_k W[m][k] * x[n][k]. A workgroup computes a BM x BN tile
// of y (rows x tokens); for each BK-slice of K it dequantises the W tile and copies the x tile
// into shared memory as fp32, then each invocation accumulates TM x TN outputs in registers.
// With MUL_MAT_ID, workgroup z is one expert of this binding and the tile's tokens are that
// expert's entries in the route table built by mmid_count.comp, gathered into shared memory as x
// and y offsets once per workgroup; tiles past an expert's count (all of them for an unused
// expert) exit at once.
// With SPLIT_K (not with MUL_MAT_ID) workgroup z sums the K range [z * k_split, +k_split) and
// stores its partial tile at part[z * part_split + n * M + m]; split_sum.comp adds the splits
// in order (a short grid's workgroups each walk less of K).
// With COOPMAT the tiles are stored as fp16 (W row-major, x column-major, K contiguous) and each
// subgroup of SGS invocations multiplies a WM x WN part of the tile as 16x16x16 cooperative
// matrices into fp32, written out through a shared 16x16 staging fragment.
#include "common.glsl"
#if defined(SPLIT_K) && defined(MUL_MAT_ID)
#error "SPLIT_K splits a plain GEMM's K; mul_mat_id's z is the expert"
#endif

#ifdef COOPMAT
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#define NSM (BM / WM)            // subgroups along the tile's rows
#define NSG (NSM * (BN / WN))    // subgroups a workgroup
#define WG (NSG * SGS)
#define CM (WM / 16u)            // fragments a subgroup along rows, along tokens
#define CN (WN / 16u)
#define BKP (BK + 8u)            // padded K of a shared row, fp16 (16-byte aligned rows)
#define FRAG_A coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define FRAG_B coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define FRAG_C coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#else
#define TPM (BM / TM)     // invocations along the rows of the tile
#define TPN (BN / TN)     // invocations along its tokens
#define WG (TPM * TPN)
#endif
#define BMP (BM + 4)      // padded shared rows (a multiple of 4: read as vec4)
#define BNP (BN + 4)
#define LW (BM * (BK / 4u))           // vec4 loads of a W tile, of an x tile
#define LX (BN * (BK / 4u))
#define NLW_CHUNKS ((LW + WG - 1u) / WG)
#define NLX ((LX + WG - 1u) / WG)

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
#ifdef SPLIT_K
layout(binding = 3) writeonly buffer Part { float part[]; };
#endif
#ifdef MUL_MAT_ID
// counts[n_expert], then per expert `cap` entries token * n_used + slot
layout(binding = 3) readonly buffer Route { uint route[]; };
#endif

#define QBUF w_data
#include "quant/types.glsl"

#if QR % BK == 0
// a row's K slice lies in one run of its block (one scale and min): an invocation loads whole
// row slices, decoding the run's scale once per slice instead of once per vec4
#define ROW_SLICE 1
#define RPW ((BM + WG - 1u) / WG)     // W rows an invocation loads per slice
#define NLW (RPW * (BK / 4u))
#else
#define NLW NLW_CHUNKS                // vec4 loads per invocation
#endif

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
#ifdef SPLIT_K
    uint k_split;     // K elements a split (a multiple of BK)
    uint part_split;  // floats between the splits' partial tiles
#endif
} p;

#ifdef COOPMAT
shared f16vec4 sw[BM * BKP / 4u];   // [m][k]
shared f16vec4 sx[BN * BKP / 4u];   // [n][k]
shared float sc[NSG * 256u];        // each subgroup's fragment on its way to y, column-major
#else
// An invocation's TM rows are TM / 4 runs of 4 adjacent rows (TN tokens likewise), read from
// shared memory as vec4: 4 reads per 64 FMAs of an 8 x 8 thread tile instead of 16.
shared vec4 sw[BK * BMP / 4];
shared vec4 sx[BK * BNP / 4];
#endif
vec4 rw[NLW], rx[NLX];   // a K slice on its way from memory to the shared tiles

// x's and y's float offsets of token column n (< BN) of the tile at n0
#ifdef MUL_MAT_ID
// the tile's gathered columns, read from the route table once per workgroup (gather_columns)
shared uint xcol[BN], ycol[BN];
void gather_columns(uint n0, uint ncols) {
    for (uint n = gl_LocalInvocationID.x; n < BN; n += WG) {
        if (n0 + n < ncols) {
            const uint e = route[p.n_expert + (p.e0 + gl_WorkGroupID.z) * p.N + n0 + n];
            const uint tok = e / p.n_used, slot = e % p.n_used;
            xcol[n] = p.x_off + tok * p.x_col + (slot % p.x_slots) * p.x_slot;
            ycol[n] = p.y_off + tok * p.y_col + slot * p.y_slot;
        }
    }
    barrier();
}
uint x_column(uint n0, uint n) { return xcol[n]; }
uint y_column(uint n0, uint n) { return ycol[n]; }
#else
uint x_column(uint n0, uint n) { return p.x_off + (n0 + n) * p.x_col; }
uint y_column(uint n0, uint n) { return p.y_off + (n0 + n) * p.y_col; }
#endif

// Loads the K slice at k0 of the W tile (dequantised) and the x tile into rw / rx.
void load_slice(uint k0, uint m0, uint n0, uint wbase, uint ncols) {
    const uint tid = gl_LocalInvocationID.x;
#ifdef ROW_SLICE
    [[unroll]] for (uint r = 0u; r < RPW; r++) {
        const uint m = tid + r * WG;
        [[unroll]] for (uint kc = 0u; kc < BK / 4u; kc++) {
            rw[r * (BK / 4u) + kc] = vec4(0.0);
        }
        if (m < BM && m0 + m < p.M && k0 < p.K) {
            const uint row = wbase + (m0 + m) * p.w_row;
            if (k0 + BK <= p.K) {
                const QRun s = qrun(row + (k0 / QK) * QTS, (k0 % QK) / QR);
                [[unroll]] for (uint kc = 0u; kc < BK / 4u; kc++) {
                    rw[r * (BK / 4u) + kc] = qget(s, (k0 % QR) / 4u + kc);
                }
            } else {
                for (uint i = 0u; k0 + i < p.K; i++) {
                    rw[r * (BK / 4u) + i / 4u][i % 4u] = qelem(row, k0 + i);
                }
            }
        }
    }
#else
    [[unroll]] for (uint t = 0u; t < NLW; t++) {
        const uint g = tid + t * WG;
        const uint m = g / (BK / 4u), k = k0 + 4u * (g % (BK / 4u));
        vec4 v = vec4(0.0);
        if (g < LW && m0 + m < p.M && k < p.K) {
            const uint row = wbase + (m0 + m) * p.w_row;
            if (k + 4u <= p.K) {
                v = dq4(row + (k / QK) * QTS, (k % QK) >> 2);
            } else {
                for (uint i = 0u; k + i < p.K; i++) {
                    v[i] = qelem(row, k + i);
                }
            }
        }
        rw[t] = v;
    }
#endif
    [[unroll]] for (uint t = 0u; t < NLX; t++) {
        const uint g = tid + t * WG;
        const uint n = g / (BK / 4u), k = k0 + 4u * (g % (BK / 4u));
        vec4 v = vec4(0.0);
        if (g < LX && n0 + n < ncols && k < p.K) {
            const uint col = x_column(n0, n);
            if (k + 4u <= p.K) {
                v = XLOAD4(col + k);
            } else {
                for (uint i = 0u; k + i < p.K; i++) {
                    v[i] = XLOAD1(col + k + i);
                }
            }
        }
        rx[t] = v;
    }
}

// A W row's (an x token's) 4 values at K chunk kc into shared memory: COOPMAT as fp16 rows of K,
// else transposed (K-major) as fp32.
#ifdef COOPMAT
void put_w(uint m, uint kc, vec4 v) { sw[m * (BKP / 4u) + kc] = f16vec4(v); }
void put_x(uint n, uint kc, vec4 v) { sx[n * (BKP / 4u) + kc] = f16vec4(v); }
#else
void put_w(uint m, uint kc, vec4 v) {
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        const uint a = (4u * kc + i) * BMP + m;
        sw[a >> 2][a & 3u] = v[i];
    }
}
void put_x(uint n, uint kc, vec4 v) {
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        const uint a = (4u * kc + i) * BNP + n;
        sx[a >> 2][a & 3u] = v[i];
    }
}
#endif

// Stores rw / rx into shared memory.
void store_slice() {
    const uint tid = gl_LocalInvocationID.x;
#ifdef ROW_SLICE
    [[unroll]] for (uint r = 0u; r < RPW; r++) {
        const uint m = tid + r * WG;
        if (m < BM) {
            [[unroll]] for (uint kc = 0u; kc < BK / 4u; kc++) {
                put_w(m, kc, rw[r * (BK / 4u) + kc]);
            }
        }
    }
#else
    [[unroll]] for (uint t = 0u; t < NLW; t++) {
        const uint g = tid + t * WG;
        if (g < LW) {
            put_w(g / (BK / 4u), g % (BK / 4u), rw[t]);
        }
    }
#endif
    [[unroll]] for (uint t = 0u; t < NLX; t++) {
        const uint g = tid + t * WG;
        if (g < LX) {
            put_x(g / (BK / 4u), g % (BK / 4u), rx[t]);
        }
    }
}

#ifdef COOPMAT
// y (or the split's partial tile) at row m, token column n of the tile at n0, where both exist.
void store_y(uint m, uint n0, uint n, uint ncols, float v) {
    if (m < p.M && n0 + n < ncols) {
#ifdef SPLIT_K
        part[gl_WorkGroupID.z * p.part_split + (n0 + n) * p.M + m] = v;
#else
        y_data[y_column(n0, n) + m] = v;
#endif
    }
}
#endif

void main() {
    qinit();
    const uint tid = gl_LocalInvocationID.x;
    const uint m0 = gl_WorkGroupID.x * BM, n0 = gl_WorkGroupID.y * BN;
    uint wbase = p.w_off, ncols = p.N;
#ifdef MUL_MAT_ID
    ncols = min(route[p.e0 + gl_WorkGroupID.z], p.N);
    if (n0 >= ncols) {
        return;
    }
    wbase += gl_WorkGroupID.z * p.w_expert;
    gather_columns(n0, ncols);
#endif
#ifdef COOPMAT
    const uint sg = gl_SubgroupID, sm = sg % NSM, sn = sg / NSM;
    FRAG_C acc[CM * CN];
    [[unroll]] for (uint i = 0u; i < CM * CN; i++) {
        acc[i] = FRAG_C(0.0);
    }
#else
    const uint tm = tid % TPM, tn = tid / TPM;
    float acc[TM * TN];
    [[unroll]] for (uint i = 0u; i < TM * TN; i++) {
        acc[i] = 0.0;
    }
#endif

#ifdef SPLIT_K
    const uint k_begin = gl_WorkGroupID.z * p.k_split, k_end = min(p.K, k_begin + p.k_split);
#else
    const uint k_begin = 0u, k_end = p.K;
#endif
    for (uint k0 = k_begin; k0 < k_end; k0 += BK) {
        load_slice(k0, m0, n0, wbase, ncols);
        store_slice();
        barrier();
#ifdef COOPMAT
        [[unroll]] for (uint kk = 0u; kk < BK; kk += 16u) {
            FRAG_A a[CM];
            FRAG_B b[CN];
            [[unroll]] for (uint i = 0u; i < CM; i++) {
                coopMatLoad(a[i], sw, ((sm * WM + 16u * i) * BKP + kk) / 4u, BKP / 4u, gl_CooperativeMatrixLayoutRowMajor);
            }
            [[unroll]] for (uint j = 0u; j < CN; j++) {
                coopMatLoad(b[j], sx, ((sn * WN + 16u * j) * BKP + kk) / 4u, BKP / 4u, gl_CooperativeMatrixLayoutColumnMajor);
            }
            [[unroll]] for (uint i = 0u; i < CM; i++) {
                [[unroll]] for (uint j = 0u; j < CN; j++) {
                    acc[i * CN + j] = coopMatMulAdd(a[i], b[j], acc[i * CN + j]);
                }
            }
        }
#else
        [[unroll]] for (uint kk = 0u; kk < BK; kk++) {
            vec4 a[TM / 4u], b[TN / 4u];
            [[unroll]] for (uint i = 0u; i < TM / 4u; i++) {
                a[i] = sw[kk * (BMP / 4u) + i * TPM + tm];
            }
            [[unroll]] for (uint j = 0u; j < TN / 4u; j++) {
                b[j] = sx[kk * (BNP / 4u) + j * TPN + tn];
            }
            [[unroll]] for (uint i = 0u; i < TM; i++) {
                [[unroll]] for (uint j = 0u; j < TN; j++) {
                    acc[i * TN + j] = fma(a[i / 4u][i % 4u], b[j / 4u][j % 4u], acc[i * TN + j]);
                }
            }
        }
#endif
        barrier();
    }

#ifdef COOPMAT
    // each fragment through the subgroup's staging area: lane l writes row l % 16 of a column,
    // SGS / 16 columns a pass, so a column's 16 rows go out as one contiguous run
    const uint lane = gl_SubgroupInvocationID;
    [[unroll]] for (uint i = 0u; i < CM; i++) {
        [[unroll]] for (uint j = 0u; j < CN; j++) {
            coopMatStore(acc[i * CN + j], sc, sg * 256u, 16u, gl_CooperativeMatrixLayoutColumnMajor);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            const uint m = m0 + sm * WM + 16u * i, n = sn * WN + 16u * j;
            for (uint e = lane; e < 256u; e += SGS) {
                store_y(m + e % 16u, n0, n + e / 16u, ncols, sc[sg * 256u + e]);
            }
            subgroupBarrier();
        }
    }
#else

    [[unroll]] for (uint j = 0u; j < TN; j++) {
        const uint n = (j / 4u) * (4u * TPN) + 4u * tn + j % 4u;
        if (n0 + n < ncols) {
#ifdef SPLIT_K
            const uint col = gl_WorkGroupID.z * p.part_split + (n0 + n) * p.M;
#else
            const uint col = y_column(n0, n);
#endif
            [[unroll]] for (uint i = 0u; i < TM; i++) {
                const uint m = m0 + (i / 4u) * (4u * TPM) + 4u * tm + i % 4u;
                if (m < p.M) {
#ifdef SPLIT_K
                    part[col + m] = acc[i * TN + j];
#else
                    y_data[col + m] = acc[i * TN + j];
#endif
                }
            }
        }
    }
#endif
}
