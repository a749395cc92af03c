#version 450
// The summed expert down projection for decode: workgroup z is a token, its groups the token's
// NU slots (group g takes slots g, g + GROUPS, ...), all dotting the workgroup's NR rows
// (mv_dot.glsl, mv_reduce.glsl; one column): y[row] (the residual stream) += sum_j wt[j] *
// (W[e_j] · x_j)[row], the expert down projection and moe_combine in one pass, summed as
// moe_combine does and added as rms_norm's add adds it (in place: one workgroup a row); the last
// workgroup to finish then normalises the new stream into no (the next block's input:
// rms_norm's bits, mv_norm.glsl), the norm's dispatch and barrier gone.
#include "common.glsl"
#define NC 1

layout(local_size_x = WG) in;

layout(binding = 2) coherent buffer Y { float y_data[]; };   // the residual stream: the last workgroup reads it back
layout(binding = 3) readonly buffer Ids { int ids[]; };
layout(binding = 4) readonly buffer Wt { float wt_data[]; };       // routing weights [n_used, n_tokens]
layout(binding = 5) coherent buffer WgCount { uint wg_count[]; };   // finished workgroups
layout(binding = 6) readonly buffer NWt { float nw_data[]; };       // the norm's weight
layout(binding = 7) writeonly buffer NOut { float no_data[]; };     // the normed stream

layout(push_constant) uniform Push {
    uint K;           // elements per row
    uint M;           // rows of an expert (and of the stream)
    uint w_off;       // byte offset of row 0 of expert 0 in W
    uint w_row;       // bytes between rows
    uint x_off;       // float offsets and strides of x and y
    uint x_col;       // between tokens
    uint y_off;
    uint y_col;
    uint w_expert;    // bytes between experts
    uint e0;          // mul_mat_id's fields (all the experts are in this binding)
    uint e1;
    uint n_used;      // slots (experts) per token
    uint ids_off;     // int offset and ints between tokens of the ids
    uint ids_tok;
    uint x_slot;      // floats between the x rows of slots; x has x_slots rows per token (1: shared)
    uint x_slots;
    uint y_slot;
    uint wt_off;      // float offset of the routing weights
    uint count_off;   // the counter of finished workgroups (last_workgroup)
    uint n_w_off;     // float offsets: the norm's weight, the normed stream (n_o_col between tokens)
    uint n_o_off;
    uint n_o_col;
    float n_eps;
} p;

#include "mv_dot.glsl"
#include "mv_reduce.glsl"
#include "mv_last.glsl"
shared vec4 xn4[NORM_XN4];   // the normed residual stream of a token, then stored to no
#define NORM_LEN p.M
#define NORM_SRC(j, c) y_data[nbase + (c)]
#include "mv_norm.glsl"

#define NSLOTS ((NU + GROUPS - 1u) / GROUPS)   // slots a group walks, one expert at a time
shared float ms_part[NU * NR];   // each slot's dot products of the workgroup's rows

void main() {
    qinit();
    const uint flat_ = mv_flat(), lane = flat_ % TPR, group = flat_ / TPR;
    const uint wgid = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    const uint row0 = wgid * NR;   // every group: the same rows, its own slots
    const uint tok = gl_WorkGroupID.z;
#ifdef SLOT_UNROLL
    [[unroll]]
#endif
    for (uint it = 0u; it < NSLOTS; it++) {
        const bool sl_live = it * GROUPS + group < NU;
        const uint sl = min(it * GROUPS + group, NU - 1u);
        mv_rows(p.w_off + uint(ids[p.ids_off + tok * p.ids_tok + sl]) * p.w_expert, 0u, row0);
        precise float acc[NA];   // no contraction: every variant (fused or not) sums a row alike
        mv_dots(lane, p.x_off + tok * p.x_col + (sl % p.x_slots) * p.x_slot, acc);
        mv_reduce(flat_, acc);
        if (sl_live) {
            MV_EACH_SUM(lane, r) {
                ms_part[sl * NR + r] = MV_SUM(acc, group, r);
            }
        }
        MV_PARTS_READ();   // every group has read this slot's sums before the next slot's land
    }
    // a row's slots weighted and added in slot order, as moe_combine sums them
    barrier();
    const uint ybase = p.y_off + tok * p.y_col, r = gl_LocalInvocationID.x;
    if (r < NR && row0 + r < p.M) {
        precise float o = 0.0;
        for (uint j = 0u; j < NU; j++) {
            o += wt_data[p.wt_off + tok * p.n_used + j] * ms_part[j * NR + r];
        }
        o = y_data[ybase + row0 + r] + o;
        y_data[ybase + row0 + r] = o;
    }
    // the last workgroup of all the tokens' normalises each token's new residual stream
    if (last_workgroup(p.count_off, gl_NumWorkGroups.x * gl_NumWorkGroups.y * gl_NumWorkGroups.z)) {
        for (uint t = 0u; t < gl_NumWorkGroups.z; t++) {
            norm_rows(p.y_off + t * p.y_col, 0u);
            for (uint i = gl_LocalInvocationID.x; i < p.M; i += WG) {
                no_data[p.n_o_off + t * p.n_o_col + i] = xn4[i >> 2][i & 3u];
            }
            barrier();   // xn4 read before the next token's norm writes it
        }
    }
}
