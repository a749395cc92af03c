#version 450
// Mat-vec for decode: y[j][row] = sum_k W[row][k] * x[j][k] for NC token columns. A workgroup of
// WG invocations takes NR consecutive rows; each invocation walks runs u = tid, tid + WG, ... of
// those rows, dequantising inside the dot product, then the workgroup sums its partials.
// With MUL_MAT_ID, workgroup z is one (token, slot) pair of the routing ids and W is the stack of
// expert matrices; pairs whose expert lies outside [e0, e1) (another binding's) exit at once.
// With GLU the input is act(x) * u (a gated FFN's down projection): u is laid out like x, and
// the activation is the one shaders/act.glsl gives the separate kernel.
#include "common.glsl"
#ifdef SUBGROUP_ADD
#extension GL_KHR_shader_subgroup_arithmetic : enable
#endif

layout(local_size_x = WG) in;

layout(binding = 0) readonly buffer W { uint w_data[]; };
#ifdef XVEC4
layout(binding = 1) readonly buffer X { vec4 x4_data[]; };
#define XRAW4(i) x4_data[(i) >> 2]
#define XRAW1(i) x4_data[(i) >> 2][(i) & 3u]
#else
layout(binding = 1) readonly buffer X { float x_data[]; };
#define XRAW4(i) vec4(x_data[i], x_data[(i) + 1u], x_data[(i) + 2u], x_data[(i) + 3u])
#define XRAW1(i) x_data[i]
#endif
#ifdef GLU
#include "act.glsl"
#ifdef MUL_MAT_ID
#define U_BINDING 4
#else
#define U_BINDING 3
#endif
layout(binding = U_BINDING) readonly buffer U { float u_data[]; };
#endif
layout(binding = 2) writeonly buffer Y { float y_data[]; };
#ifdef MUL_MAT_ID
layout(binding = 3) readonly buffer Ids { int ids[]; };
#endif

#define QBUF w_data
#include "quant/types.glsl"

layout(push_constant) uniform Push {
    uint K;        // elements per row
    uint M;        // rows of this binding
    uint w_off;    // byte offset of row 0 (of expert e0) in W
    uint w_row;    // bytes between rows
    uint x_off;    // float offsets and strides of x and y
    uint x_col;    // between token columns (MUL_MAT_ID: between tokens)
    uint y_off;
    uint y_col;
#ifdef MUL_MAT_ID
    uint w_expert; // bytes between experts
    uint e0;       // experts [e0, e1) are in this binding
    uint e1;
    uint n_used;   // slots (experts) per token
    uint ids_off;  // int offset and ints between tokens of the ids
    uint ids_tok;
    uint x_slot;   // floats between the x rows of slots; x has x_slots rows per token (1: shared)
    uint x_slots;
    uint y_slot;
#endif
#ifdef GLU
    uint u_off;    // float offset of u (its strides are x's)
#endif
} p;

#ifdef GLU
#define UIDX(i) ((i) - p.x_off + p.u_off)
vec4 glu4(vec4 g, uint i) {
    return vec4(glu_fn(g.x, u_data[UIDX(i)]), glu_fn(g.y, u_data[UIDX(i) + 1u]), glu_fn(g.z, u_data[UIDX(i) + 2u]),
                glu_fn(g.w, u_data[UIDX(i) + 3u]));
}
#define XLOAD4(i) glu4(XRAW4(i), i)
#define XLOAD1(i) glu_fn(XRAW1(i), u_data[UIDX(i)])
#else
#define XLOAD4(i) XRAW4(i)
#define XLOAD1(i) XRAW1(i)
#endif

#define NV (NR * NC)
#ifdef SUBGROUP_ADD
shared float red[RED_SG * NV];
#else
shared float red[WG * NV];
#endif

void main() {
    const uint tid = gl_LocalInvocationID.x;
    const uint row0 = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * NR;
    if (row0 >= p.M) {
        return;
    }
    uint wbase = p.w_off, xbase = p.x_off, ybase = p.y_off;
#ifdef MUL_MAT_ID
    const uint pair = gl_WorkGroupID.z;
    const uint tok = pair / p.n_used, slot = pair % p.n_used;
    const uint e = uint(ids[p.ids_off + tok * p.ids_tok + slot]);
    if (e < p.e0 || e >= p.e1) {
        return;
    }
    wbase += (e - p.e0) * p.w_expert;
    xbase += tok * p.x_col + (slot % p.x_slots) * p.x_slot;
    ybase += tok * p.y_col + slot * p.y_slot;
#endif
    uint rowb[NR];
    [[unroll]] for (uint r = 0u; r < NR; r++) {
        rowb[r] = wbase + min(row0 + r, p.M - 1u) * p.w_row;   // rows past M read row M-1, unused
    }
    float acc[NV];
    [[unroll]] for (uint v = 0u; v < NV; v++) {
        acc[v] = 0.0;
    }

    const uint runs = p.K / QR;
    for (uint u = tid; u < runs; u += WG) {
        const uint boff = (u / QRUNS) * QTS, run = u % QRUNS;
        QRun s[NR];
        [[unroll]] for (uint r = 0u; r < NR; r++) {
            s[r] = qrun(rowb[r] + boff, run);
        }
        const uint k0 = xbase + u * QR;
        float dot_[NV], sum_[NC];   // per run: sum(raw * x) per row and column, sum(x) per column
        [[unroll]] for (uint v = 0u; v < NV; v++) {
            dot_[v] = 0.0;
        }
        [[unroll]] for (uint j = 0u; j < NC; j++) {
            sum_[j] = 0.0;
        }
        [[unroll]] for (uint c = 0u; c < QCH; c++) {
            vec4 xv[NC];
            [[unroll]] for (uint j = 0u; j < NC; j++) {
                xv[j] = XLOAD4(k0 + j * p.x_col + 4u * c);
                sum_[j] += dot(xv[j], vec4(1.0));
            }
            [[unroll]] for (uint r = 0u; r < NR; r++) {
                const vec4 raw = qraw(s[r], c);
                [[unroll]] for (uint j = 0u; j < NC; j++) {
                    dot_[r * NC + j] += dot(raw, xv[j]);
                }
            }
        }
        [[unroll]] for (uint r = 0u; r < NR; r++) {
            [[unroll]] for (uint j = 0u; j < NC; j++) {
                acc[r * NC + j] += s[r].a * dot_[r * NC + j] + s[r].b * sum_[j];
            }
        }
    }
#ifdef QPLAIN
    for (uint k = runs * QR + tid; k < p.K; k += WG) {   // plain types: K need not be a multiple of 4
        [[unroll]] for (uint r = 0u; r < NR; r++) {
            const float wk = qelem(rowb[r], k);
            [[unroll]] for (uint j = 0u; j < NC; j++) {
                acc[r * NC + j] += wk * XLOAD1(xbase + j * p.x_col + k);
            }
        }
    }
#endif

#ifdef SUBGROUP_ADD
    [[unroll]] for (uint v = 0u; v < NV; v++) {
        const float sum = subgroupAdd(acc[v]);
        if (subgroupElect()) {
            red[gl_SubgroupID * NV + v] = sum;
        }
    }
    barrier();
    const uint parts = gl_NumSubgroups;
#else
    [[unroll]] for (uint v = 0u; v < NV; v++) {
        red[tid * NV + v] = acc[v];
    }
    barrier();
    [[unroll]] for (uint half_ = WG / 2u; half_ > 0u; half_ >>= 1) {
        if (tid < half_) {
            [[unroll]] for (uint v = 0u; v < NV; v++) {
                red[tid * NV + v] += red[(tid + half_) * NV + v];
            }
        }
        barrier();
    }
    const uint parts = 1u;
#endif
    for (uint v = tid; v < NV; v += WG) {
        const uint r = v / NC, j = v % NC;
        if (row0 + r < p.M) {
            float sum = 0.0;
            for (uint i = 0u; i < parts; i++) {
                sum += red[i * NV + v];
            }
            y_data[ybase + j * p.y_col + row0 + r] = sum;
        }
    }
}
