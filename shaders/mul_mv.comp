#version 450
// Mat-vec for decode: y[j][row] = sum_k W[row][k] * x[j][k] for NC token columns.
// A workgroup of WG invocations is WG / TPR row groups of TPR lanes; a group takes NR consecutive
// rows. A row is cut into units (quant/types.glsl: pieces of a block that lie together) and lane
// l walks units l, l + TPR, ...: the lanes of a group read neighbouring bytes of a row at once,
// and every x chunk a lane loads serves its NR rows. TPR is the kernel's choice for K (fewer
// lanes a row when a row has few units, so short rows still keep every lane busy).
// With MUL_MAT_ID, workgroup z is one (token, slot) pair of the routing ids and W is the stack of
// expert matrices; pairs whose expert lies outside [e0, e1) (another binding's) exit at once.
// With GATE_UP the output is act(W·x) * (W2·x) (a gated FFN's gate and up projections in one pass): W2 lies in the same
// binding at w2_off, laid out like W, and its rows are dotted with the same x as extra rows.
// With MOE_SUM (and MUL_MAT_ID) workgroup z is a token and its groups are the token's slots
// (group g takes slots g, g + GROUPS, ...), all dotting the workgroup's NR rows: y[row] (the
// residual stream) += sum_j wt[j] * (W[e_j] · x_j)[row], the expert down projection and
// moe_combine in one pass, summed as moe_combine does and added as rms_norm's add adds it (in
// place: one workgroup a row); the last workgroup to finish then normalises the new stream into
// no (the next block's input: rms_norm's bits, shaders/mv_norm_in.glsl), the norm's dispatch and
// barrier gone.
// With ROUTE (a plain mat-vec: the MoE router's logits) the last workgroup to finish routes the
// NC tokens as moe_router does (shaders/moe_route.glsl): one dispatch instead of two; with
// ROUTE_SUBGROUP its first subgroup does, as a one-subgroup router would.
// With BIAS (and MUL_MAT_ID, not MOE_SUM) each output row gets its expert's bias, b[e][row], as
// add_id would add it after the store (GATE_UP: W's bias b and W2's b2, before the activation).
// With NORM_IN (and ROUTE) x is the residual stream and the kernel first does rms_norm's add
// and norm (shaders/rms_norm.comp with ADD, bit for bit): every workgroup sums x + r and
// normalises it into shared memory, redoing the norm workgroup's sums (NORM_WG invocations,
// SG_BUTTERFLY) subgroup by subgroup, writes its share of the normed x (the FFN's input) and the
// last workgroup stores x + r over x; the norm's dispatch and barrier are gone.
// The lanes' partial sums meet in a butterfly of subgroup shuffles (REDUCE_CLUSTER: a group lies
// within one subgroup), subgroup adds then shared memory (REDUCE_SUBGROUP: a group is whole
// subgroups, one group a workgroup or with MOE_SUM one a slot), or a shared-memory tree.
#include "common.glsl"
#if defined(REDUCE_CLUSTER) || defined(NORM_IN) || defined(MOE_SUM)
#extension GL_KHR_shader_subgroup_shuffle : enable
#endif
#if defined(REDUCE_SUBGROUP)
#extension GL_KHR_shader_subgroup_arithmetic : enable
#endif

layout(local_size_x = WG) in;

layout(binding = 0) readonly buffer W { uint w_data[]; };
#ifdef QWIDE
layout(binding = 0) readonly buffer W16 { uvec4 w16_data[]; };   // the same words, 16 bytes at a time
#endif
#ifdef XVEC4
layout(binding = 1) readonly buffer X { vec4 x4_data[]; };
#define XG4(i) x4_data[(i) >> 2]
#define XG1(i) x4_data[(i) >> 2][(i) & 3u]
#else
layout(binding = 1) readonly buffer X { float x_data[]; };
#define XG4(i) vec4(x_data[i], x_data[(i) + 1u], x_data[(i) + 2u], x_data[(i) + 3u])
#define XG1(i) x_data[i]
#endif
#ifdef NORM_IN
// the normed x of the NC columns, column j at j * K (the mat-vec's x_off 0, x_col K)
shared vec4 xn4[NORM_XN4];
#define XRAW4(i) xn4[(i) >> 2]
#define XRAW1(i) xn4[(i) >> 2][(i) & 3u]
#else
#define XRAW4(i) XG4(i)
#define XRAW1(i) XG1(i)
#endif
#ifdef MOE_SUM
shared vec4 xn4[NORM_XN4];   // the normed residual stream of a token, then stored to no
#endif
#ifdef GATE_UP
#include "act.glsl"
#endif
#ifdef BIAS
#if !defined(MUL_MAT_ID) || defined(MOE_SUM)
#error "BIAS is a per-expert bias of mul_mat_id's stored rows"
#endif
layout(binding = 4) readonly buffer B { float b_data[]; };           // [M, n_expert]
#ifdef GATE_UP
layout(binding = 5) readonly buffer B2 { float b2_data[]; };         // W2's, laid out alike
#endif
#endif
#ifdef ROUTE
#if defined(MUL_MAT_ID) || defined(GATE_UP)
#error "ROUTE routes the tokens of a plain mat-vec (the MoE router's)"
#endif
layout(binding = 2) coherent buffer Y { float y_data[]; };   // the last workgroup reads every row back
layout(binding = 3) writeonly buffer RIds { int route_ids[]; };
layout(binding = 4) writeonly buffer RWts { float route_w[]; };
layout(binding = 5) readonly buffer RBias { float route_bias[]; };
layout(binding = 6) coherent buffer WgCount { uint wg_count[]; };
#ifdef NORM_IN
layout(binding = 7) readonly buffer NRes { float nr_data[]; };      // the block output added to x
layout(binding = 8) readonly buffer NWt { float nw_data[]; };       // the norm's weight
layout(binding = 9) writeonly buffer NSum { float ns_data[]; };     // x + r, over x
layout(binding = 10) writeonly buffer NOut { float no_data[]; };    // the normed x
#endif
#elif defined(MOE_SUM)
#ifndef MUL_MAT_ID
#error "MOE_SUM sums mul_mat_id's slots"
#endif
layout(binding = 2) coherent buffer Y { float y_data[]; };   // the residual stream: the last workgroup reads it back
layout(binding = 5) coherent buffer WgCount { uint wg_count[]; };   // finished workgroups
layout(binding = 6) readonly buffer NWt { float nw_data[]; };       // the norm's weight
layout(binding = 7) writeonly buffer NOut { float no_data[]; };     // the normed stream
#else
layout(binding = 2) writeonly buffer Y { float y_data[]; };
#endif
#ifdef MUL_MAT_ID
layout(binding = 3) readonly buffer Ids { int ids[]; };
#endif
#ifdef MOE_SUM
layout(binding = 4) readonly buffer Wt { float wt_data[]; };       // routing weights [n_used, n_tokens]
#endif

#define QBUF w_data
#include "quant/types.glsl"
#if defined(QWIDE) && !defined(QWIDE_OK)
#error "QWIDE: this weight type has no wide loads"
#endif

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
#ifdef GATE_UP
    uint w2_off;   // byte offset of W2's row 0 (of expert e0) in W
#endif
#ifdef ROUTE
    uint n_used;    // moe_route's: experts a token, offsets of ids and weights, mode, bias offset
    uint ids_off;
    uint rw_off;
    uint mode;
    uint b_off;
    uint count_off; // the counter of finished workgroups (last_workgroup)
#endif
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
#ifdef MOE_SUM
    uint wt_off;      // float offset of the routing weights
    uint count_off;   // the counter of finished workgroups (last_workgroup)
    uint n_w_off;     // float offsets: the norm's weight, the normed stream (n_o_col between tokens)
    uint n_o_off;
    uint n_o_col;
    float n_eps;
#endif
#ifdef BIAS
    uint b_off;    // float offsets of the biases of expert 0 (row r of expert e: + e * M + r)
#ifdef GATE_UP
    uint b2_off;
#endif
#endif
} p;

#ifdef ROUTE
#define ROUTE_LOGIT(i) y_data[i]
#define ROUTE_BIAS(i) route_bias[i]
#define ROUTE_ID(i, v) route_ids[p.ids_off + (i)] = (v)
#define ROUTE_WEIGHT(i, v) route_w[p.rw_off + (i)] = (v)
#include "moe_route.glsl"

#endif

#if defined(ROUTE) || defined(MOE_SUM)
shared bool wg_last;
// Whether this is the last of `of` workgroups counted at wg_count[at] to finish: each
// workgroup's rows are stored and made visible before it counts itself, so the last one reads
// them all; it resets the counter (0 between dispatches) for the next dispatch
bool last_workgroup(uint at, uint of) {
    memoryBarrierBuffer();
    barrier();
    if (gl_LocalInvocationID.x == 0u) {
        wg_last = atomicAdd(wg_count[at], 1u) == of - 1u;
    }
    barrier();
    if (wg_last) {
        memoryBarrierBuffer();
        if (gl_LocalInvocationID.x == 0u) {
            wg_count[at] = 0u;
        }
    }
    return wg_last;
}
#endif
#if defined(NORM_IN) || defined(MOE_SUM)
#include "mv_norm_in.glsl"
#endif

#define XLOAD4(i) XRAW4(i)
#define XLOAD1(i) XRAW1(i)

#define NV (NR * NC)
#ifdef GATE_UP
#define NW (2 * NR)   // weight rows a group dots: NR of W, then the same NR of W2
#else
#define NW NR
#endif
#ifdef MOE_SUM
#define NSLOTS ((NU + GROUPS - 1u) / GROUPS)   // slots a group walks, one expert at a time
shared float ms_part[NU * NR];   // each slot's dot products of the workgroup's rows
#else
#define NSLOTS 1
#endif
#define NA (NW * NC)
#define GROUPS (WG / TPR)
#if defined(REDUCE_SUBGROUP)
shared float red[RED_SG * NA];
#elif !defined(REDUCE_CLUSTER)
shared float red[WG * NA];
#endif

#if !defined(REDUCE_CLUSTER)
// the sum of value v of this invocation's group over the parts it left in red from `first` on
float part_sum(uint v, uint first, uint parts) {
    float sum = 0.0;
    for (uint i = 0u; i < parts; i++) {
        sum += red[(first + i) * NA + v];
    }
    return sum;
}
#endif

#ifdef BIAS
// x + b as a separate add_id computes it
float biased(float x, float b) {
    precise float r = x + b;
    return r;
}
#define B_AT(buf, off, r) buf[p.off + e * p.M + row0 + (r)]
#endif
#if defined(GATE_UP) && defined(BIAS)
#define RESULT(v, r, sum) \
    glu_fn(biased(sum(v), B_AT(b_data, b_off, r)), biased(sum((v) + NV), B_AT(b2_data, b2_off, r)))
#elif defined(GATE_UP)
#define RESULT(v, r, sum) glu_fn(sum(v), sum((v) + NV))
#elif defined(BIAS)
#define RESULT(v, r, sum) biased(sum(v), B_AT(b_data, b_off, r))
#else
#define RESULT(v, r, sum) sum(v)
#endif

#ifndef MV_UNROLL
#define MV_UNROLL 1
#endif
uint rowb[NW];            // the byte offsets of the rows a group dots

// unit uu's bytes of the row whose block is at byte b in 16-byte loads (QWIDE: the type's QWide;
// else unused), and the raw values of the unit's chunk c (< QU_C) of a run s of it
#ifdef QWIDE
#define MV_WQ_T QWide
#define MV_WQ(b, uu) qwide16(b, uu)
#define MV_RAW(s, wq, uu, c) qraw16(s, wq, c)
#else
#define MV_WQ_T uint
#define MV_WQ(b, uu) 0u
#define MV_RAW(s, wq, uu, c) qraw(s, qu_ch(uu, c))
#endif
// run `run` of the block at byte b, its header read in one 16-byte load where the type has one
// (QHDR16, with the wide loads: NVIDIA issued Q4_K's four header words as four loads)
#if defined(QWIDE) && defined(QHDR16)
#define MV_RUN(b, run) qrun_hdr(w16_data[(b) >> 4], b, run)
#else
#define MV_RUN(b, run) qrun(b, run)
#endif

// unit u of every row the group dots: acc[r * NC + j] += W[r] (unit u) . x[j] (unit u)
void mv_unit(uint u, uint xbase, inout precise float acc[NA]) {
    const uint blk = u / QU, uu = u % QU, boff = blk * QTS;
    [[unroll]] for (uint i = 0u; i < QU_R; i++) {
        const uint run = qu_run(uu, i);
        const uint k0 = xbase + blk * QK + run * QR;
#if NC == 1
        // one column: the run's x chunks, then each row's dot product with them:
        // sum(raw * x) and sum(x), as value = a * raw + b
        vec4 xv[QU_C * NC];
        float sum_[NC];
        [[unroll]] for (uint j = 0u; j < NC; j++) {
            sum_[j] = 0.0;
            [[unroll]] for (uint c = 0u; c < QU_C; c++) {
                xv[c * NC + j] = XLOAD4(k0 + j * p.x_col + 4u * qu_ch(uu, c));
                sum_[j] += dot(xv[c * NC + j], vec4(1.0));
            }
        }
        [[unroll]] for (uint r = 0u; r < NW; r++) {
            const QRun s = MV_RUN(rowb[r] + boff, run);
            const MV_WQ_T wq = MV_WQ(rowb[r] + boff, uu);
            float dot_[NC];
            [[unroll]] for (uint j = 0u; j < NC; j++) {
                dot_[j] = 0.0;
            }
            [[unroll]] for (uint c = 0u; c < QU_C; c++) {
                const vec4 raw = MV_RAW(s, wq, uu, c);
                [[unroll]] for (uint j = 0u; j < NC; j++) {
                    dot_[j] += dot(raw, xv[c * NC + j]);
                }
            }
            [[unroll]] for (uint j = 0u; j < NC; j++) {
                acc[r * NC + j] += s.a * dot_[j] + s.b * sum_[j];
            }
        }
#else
        // several columns: chunk by chunk, x for every column, then each row's dot products
        // with it (a lane holds one chunk of x a column: a unit's 8 chunks x 4 columns would be
        // 128 registers). The sums add their terms in the same order as above
        QRun s[NW];
        MV_WQ_T wq[NW];
        float sum_[NC], dot_[NA];
        [[unroll]] for (uint r = 0u; r < NW; r++) {
            s[r] = MV_RUN(rowb[r] + boff, run);
            wq[r] = MV_WQ(rowb[r] + boff, uu);
        }
        [[unroll]] for (uint v = 0u; v < NA; v++) {
            dot_[v] = 0.0;
        }
        [[unroll]] for (uint j = 0u; j < NC; j++) {
            sum_[j] = 0.0;
        }
        [[unroll]] for (uint c = 0u; c < QU_C; c++) {
            vec4 xv[NC];
            [[unroll]] for (uint j = 0u; j < NC; j++) {
                xv[j] = XLOAD4(k0 + j * p.x_col + 4u * qu_ch(uu, c));
                sum_[j] += dot(xv[j], vec4(1.0));
            }
            [[unroll]] for (uint r = 0u; r < NW; r++) {
                const vec4 raw = MV_RAW(s[r], wq[r], uu, c);
                [[unroll]] for (uint j = 0u; j < NC; j++) {
                    dot_[r * NC + j] += dot(raw, xv[j]);
                }
            }
        }
        [[unroll]] for (uint r = 0u; r < NW; r++) {
            [[unroll]] for (uint j = 0u; j < NC; j++) {
                acc[r * NC + j] += s[r].a * dot_[r * NC + j] + s[r].b * sum_[j];
            }
        }
#endif
    }
}

void main() {
    qinit();
#if defined(REDUCE_CLUSTER) || defined(REDUCE_SUBGROUP)
    // a group is TPR neighbouring invocations of one subgroup (or whole subgroups), whatever the
    // subgroup size
    const uint flat_ = gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID;
#else
    const uint flat_ = gl_LocalInvocationID.x;
#endif
    const uint lane = flat_ % TPR, group = flat_ / TPR;
    const uint wgid = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    uint wbase = p.w_off, xbase = p.x_off, ybase = p.y_off;
    const uint M_ = p.M, ycol = p.y_col;
#ifdef MOE_SUM
    const uint row0 = wgid * NR;   // every group: the same rows, its own slots
#else
    const uint row0 = (wgid * GROUPS + group) * NR;
#endif
#ifdef GATE_UP
    uint wbase2 = p.w2_off;
#endif
#if defined(MOE_SUM)
    const uint tok = gl_WorkGroupID.z;
    ybase += tok * p.y_col;
#elif defined(MUL_MAT_ID)
    const uint pair = gl_WorkGroupID.z;
    const uint tok = pair / p.n_used, slot = pair % p.n_used;
    const uint e = uint(ids[p.ids_off + tok * p.ids_tok + slot]);
    if (e < p.e0 || e >= p.e1) {
        return;   // uniform across the workgroup
    }
    wbase += (e - p.e0) * p.w_expert;
#ifdef GATE_UP
    wbase2 += (e - p.e0) * p.w_expert;
#endif
    xbase += tok * p.x_col + (slot % p.x_slots) * p.x_slot;
    ybase += tok * p.y_col + slot * p.y_slot;
#endif
#ifdef SLOT_UNROLL
    [[unroll]]
#endif
    for (uint it = 0u; it < NSLOTS; it++) {
#ifdef MOE_SUM
    const bool sl_live = it * GROUPS + group < NU;
    const uint sl = min(it * GROUPS + group, NU - 1u);
    wbase = p.w_off + uint(ids[p.ids_off + tok * p.ids_tok + sl]) * p.w_expert;
    xbase = p.x_off + tok * p.x_col + (sl % p.x_slots) * p.x_slot;
#endif
    [[unroll]] for (uint r = 0u; r < NR; r++) {
        const uint roff = min(row0 + r, M_ - 1u) * p.w_row;   // rows past M read row M-1, unused
        rowb[r] = wbase + roff;
#ifdef GATE_UP
        rowb[NR + r] = wbase2 + roff;
#endif
    }
#ifdef NORM_IN
    {
        // the first word of each weight block of the lane, loaded while the norm runs: the
        // mat-vec's own reads then find them in the cache (pf only keeps the loads alive)
        uint pf = 0u;
        for (uint u = lane; u < (p.K / QK) * QU; u += TPR) {
            [[unroll]] for (uint r = 0u; r < NW; r++) {
                pf += w_data[(rowb[r] + (u / QU) * QTS) >> 2];
            }
        }
        norm_prologue(wgid, pf);
    }
#endif
    precise float acc[NA];   // no contraction: every variant (fused or not) sums a row alike
    [[unroll]] for (uint v = 0u; v < NA; v++) {
        acc[v] = 0.0;
    }

    const uint units = (p.K / QK) * QU;
    // MV_UNROLL units a lane at a time: their loads are issued together (latency, not bandwidth,
    // bounds a short mat-vec on a wide GPU); the order of the sums is the rolled loop's
    uint u = lane;
    for (; u + (MV_UNROLL - 1u) * TPR < units; u += MV_UNROLL * TPR) {
        [[unroll]] for (uint q = 0u; q < MV_UNROLL; q++) {
            mv_unit(u + q * TPR, xbase, acc);
        }
    }
    for (; u < units; u += TPR) {
        mv_unit(u, xbase, acc);
    }
#ifdef QPLAIN
    for (uint k = units * QK + lane; k < p.K; k += TPR) {   // plain types: K need not be a multiple of 4
        [[unroll]] for (uint r = 0u; r < NW; r++) {
            const float wk = qelem(rowb[r], k);
            [[unroll]] for (uint j = 0u; j < NC; j++) {
                acc[r * NC + j] += wk * XLOAD1(xbase + j * p.x_col + k);
            }
        }
    }
#endif

#if defined(REDUCE_CLUSTER)
    [[unroll]] for (uint step = TPR / 2u; step > 0u; step >>= 1) {
        [[unroll]] for (uint v = 0u; v < NA; v++) {
            acc[v] += subgroupShuffleXor(acc[v], step);
        }
    }
#define ACC(v) acc[v]
#ifdef MOE_SUM
    if (lane == 0u && sl_live) {
        [[unroll]] for (uint r = 0u; r < NR; r++) {
            ms_part[sl * NR + r] = acc[r];
        }
    }
#else
    if (lane == 0u) {
        [[unroll]] for (uint v = 0u; v < NV; v++) {
            const uint r = v / NC, j = v % NC;
            if (row0 + r < M_) {
                y_data[ybase + j * ycol + row0 + r] = RESULT(v, r, ACC);
            }
        }
    }
#endif
#else
#if defined(REDUCE_SUBGROUP)
    [[unroll]] for (uint v = 0u; v < NA; v++) {
        const float sum = subgroupAdd(acc[v]);
        if (subgroupElect()) {
            red[gl_SubgroupID * NA + v] = sum;
        }
    }
    barrier();
    // a group's subgroups (one where the workgroup is narrower than a subgroup)
    const uint parts = (TPR + gl_SubgroupSize - 1u) / gl_SubgroupSize, first = group * parts;
#else
    [[unroll]] for (uint v = 0u; v < NA; v++) {
        red[flat_ * NA + v] = acc[v];
    }
    barrier();
    [[unroll]] for (uint half_ = TPR / 2u; half_ > 0u; half_ >>= 1) {
        if (lane < half_) {
            [[unroll]] for (uint v = 0u; v < NA; v++) {
                red[flat_ * NA + v] += red[(flat_ + half_) * NA + v];
            }
        }
        barrier();
    }
    const uint parts = 1u, first = group * TPR;
#endif
#define PSUM(v) part_sum(v, first, parts)
#ifdef MOE_SUM
    if (lane == 0u && sl_live) {
        [[unroll]] for (uint r = 0u; r < NR; r++) {
            ms_part[sl * NR + r] = PSUM(r);
        }
    }
    barrier();   // every group has read this slot's sums before the next slot's land
#else
    // the group's first lanes store its NV results (in REDUCE_SUBGROUP the workgroup is one group)
    for (uint v = lane; v < NV; v += TPR) {
        const uint r = v / NC, j = v % NC;
        if (row0 + r < M_) {
            y_data[ybase + j * ycol + row0 + r] = RESULT(v, r, PSUM);
        }
    }
#endif
#endif
    }
#ifdef MOE_SUM
    // a row's slots weighted and added in slot order, as moe_combine sums them
    barrier();
    const uint r = gl_LocalInvocationID.x;
    if (r < NR && row0 + r < M_) {
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
#endif
#ifdef ROUTE
    const bool last = last_workgroup(p.count_off, gl_NumWorkGroups.x * gl_NumWorkGroups.y);
#ifdef NORM_IN
    if (last) {
        store_sums();
    }
#endif
#ifdef ROUTE_SUBGROUP
    if (last && gl_SubgroupID == 0u) {   // one subgroup routes, without workgroup barriers
#else
    if (last) {   // routes the tokens (moe_router's results, bit for bit)
#endif
        for (uint t = 0u; t < NC; t++) {
            route_token(p.y_off + t * p.y_col, t * p.n_used, p.M, p.n_used, p.mode, p.b_off);
        }
    }
#endif
}
