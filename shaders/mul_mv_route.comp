#version 450
// The MoE router's mat-vec for decode: the logits y = W·x of NC tokens (mv_dot.glsl,
// mv_reduce.glsl), then the last workgroup to finish routes the tokens as moe_router does
// (moe_route.glsl): one dispatch instead of two; with ROUTE_SUBGROUP its first subgroup does,
// as a one-subgroup router would, or with ROUTE_SGS each of its subgroups routes tokens of its own.
// With NORM_IN x is the residual stream and the kernel first does rms_norm's add and norm
// (shaders/rms_norm.comp with ADD, bit for bit; mv_norm.glsl): every workgroup sums x + r and
// normalises it into shared memory, redoing the norm workgroup's sums subgroup by subgroup,
// writes its share of the normed x (the FFN's input) and the last workgroup stores x + r over x;
// the norm's dispatch and barrier are gone.
#include "common.glsl"

layout(local_size_x = WG) in;

layout(binding = 2) coherent buffer Y { float y_data[]; };   // the last workgroup reads every row back
layout(binding = 3) writeonly buffer RIds { int route_ids[]; };
layout(binding = 4) writeonly buffer RWts { float route_w[]; };
layout(binding = 5) readonly buffer RBias { float route_bias[]; };
layout(binding = 6) coherent buffer WgCount { uint wg_count[]; };

layout(push_constant) uniform Push {
    uint K;         // elements per row
    uint M;         // rows: the experts
    uint w_off;     // byte offset of row 0 in W
    uint w_row;     // bytes between rows
    uint x_off;     // float offsets and strides of x and y
    uint x_col;     // between token columns
    uint y_off;
    uint y_col;
    uint n_used;    // moe_route's: experts a token, offsets of ids and weights, mode, bias offset
    uint ids_off;
    uint rw_off;
    uint mode;
    uint b_off;
    uint count_off; // the counter of finished workgroups (last_workgroup)
#ifdef NORM_IN
    uint n_x_off;   // float offsets: the residual x (n_x_col between columns; r and x + r alike),
    uint n_x_col;   // r, the norm's weight, x + r, the normed x (n_o_col between columns)
    uint n_r_off;
    uint n_w_off;
    uint n_s_off;
    uint n_o_off;
    uint n_o_col;
    float n_eps;
#endif
} p;

#ifdef NORM_IN
layout(binding = 7) readonly buffer NRes { float nr_data[]; };      // the block output added to x
layout(binding = 8) readonly buffer NWt { float nw_data[]; };       // the norm's weight
layout(binding = 9) writeonly buffer NSum { float ns_data[]; };     // x + r, over x
layout(binding = 10) writeonly buffer NOut { float no_data[]; };    // the normed x
// the normed x of the NC columns, column j at j * K (the mat-vec's x_off 0, x_col K)
shared vec4 xn4[NORM_XN4];
#define XLOAD4(i) xn4[(i) >> 2]
#define XLOAD1(i) xn4[(i) >> 2][(i) & 3u]
#endif
#include "mv_dot.glsl"
#include "mv_reduce.glsl"
#include "mv_last.glsl"
#define ROUTE_LOGIT(i) y_data[i]
#define ROUTE_BIAS(i) route_bias[i]
#define ROUTE_ID(i, v) route_ids[p.ids_off + (i)] = (v)
#define ROUTE_WEIGHT(i, v) route_w[p.rw_off + (i)] = (v)
#include "moe_route.glsl"
#ifdef NORM_IN
#define NORM_LEN p.K
#define NORM_SRC(j, c) XG1(p.n_x_off + (j) * p.n_x_col + (c)) + nr_data[p.n_r_off + (j) * p.n_x_col + (c)]
#include "mv_norm.glsl"

// the prologue: xn4 from x + r, then this workgroup's share of the normed x is stored. The
// first word of each weight block of the lane is loaded while the norm runs: the mat-vec's own
// reads then find them in the cache (pf only keeps the loads alive)
void norm_prologue(uint lane, uint wgid) {
    uint pf = 0u;
    for (uint u = lane; u < (p.K / QK) * QU; u += TPR) {
        [[unroll]] for (uint r = 0u; r < NW; r++) {
            pf += w_data[(rowb[r] + (u / QU) * QTS) >> 2];
        }
    }
    norm_rows(0u, pf);
    const uint n = NC * p.K, groups = gl_NumWorkGroups.x * gl_NumWorkGroups.y, span = (n + groups - 1u) / groups;
    for (uint i = wgid * span + gl_LocalInvocationID.x; i < min(n, (wgid + 1u) * span); i += WG) {
        no_data[p.n_o_off + (i / p.K) * p.n_o_col + i % p.K] = xn4[i >> 2][i & 3u];
    }
}

// the last workgroup: x + r over x (every workgroup has read x)
void store_sums() {
    [[unroll]] for (uint j = 0u; j < NC; j++) {
        [[unroll]] for (uint g = 0u; g < NORM_G; g++) {
            [[unroll]] for (uint e = 0u; e < NORM_E; e++) {
                const uint c = NORM_AT(g, e);
                if (c < p.K) {
                    ns_data[p.n_s_off + j * p.n_x_col + c] = n_s[(j * NORM_G + g) * NORM_E + e];
                }
            }
        }
    }
}
#endif

void main() {
    qinit();
    const uint flat_ = mv_flat(), lane = flat_ % TPR, group = flat_ / TPR;
    const uint wgid = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    const uint row0 = (wgid * GROUPS + group) * NR;
    mv_rows(p.w_off, 0u, row0);
#ifdef NORM_IN
    norm_prologue(lane, wgid);
#endif
    precise float acc[NA];   // no contraction: every variant (fused or not) sums a row alike
    mv_dots(lane, p.x_off, acc);
    mv_reduce(flat_, acc);
    MV_EACH_SUM(lane, v) {
        const uint r = v / NC, j = v % NC;
        if (row0 + r < p.M) {
            y_data[p.y_off + j * p.y_col + row0 + r] = MV_SUM(acc, group, v);
        }
    }
    const bool last = last_workgroup(p.count_off, gl_NumWorkGroups.x * gl_NumWorkGroups.y);
#ifdef NORM_IN
    if (last) {
        store_sums();
    }
#endif
    if (last && ROUTE_RUNS) {   // routes the tokens (moe_router's results, bit for bit)
#ifdef ROUTE_PARALLEL
        for (uint t = sg_id(); t < NC; t += ROUTE_SGS) {   // a subgroup a token at a time
#else
        for (uint t = 0u; t < NC; t++) {
#endif
            route_token(p.y_off + t * p.y_col, t * p.n_used, p.M, p.n_used, p.mode, p.b_off);
        }
    }
}
