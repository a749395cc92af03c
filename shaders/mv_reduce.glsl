// How the lanes of a mat-vec group (mv_dot.glsl) sum their partial sums: a butterfly of
// shuffles (REDUCE_CLUSTER: a group lies within one subgroup), subgroup adds then shared memory
// (REDUCE_SUBGROUP: a group is whole subgroups; RED_SG subgroups a workgroup, one where the
// workgroup is narrower than a subgroup), or a shared-memory tree. MV_SCATTER (the lanes it
// spans: the group's TPR in a cluster, the subgroup's fixed size in REDUCE_SUBGROUP) sums by a
// reduce-scatter instead of a butterfly or subgroup add a value: in a cluster the butterfly's
// bits, each lane left with some of the sums (a gate row's and its up row's together).
// Call mv_reduce(flat_, acc) in the workgroup's uniform control flow; then
// MV_EACH_SUM(lane, v) { ... } is a loop over the values v < NV this lane stores, and inside it
// MV_SUM(acc, group, v) is the group's sum of value v (MV_UP_SUM: of value v + NV, GATE_UP's up
// row). MV_PARTS_READ() waits until every group has read its sums (before the next mv_reduce).
#ifndef VKRT_MV_REDUCE_GLSL
#define VKRT_MV_REDUCE_GLSL
#include "common.glsl"
#include "subgroup.glsl"
#if defined(REDUCE_SUBGROUP)
shared float red[RED_SG * NA];
#elif !defined(REDUCE_CLUSTER)
shared float red[WG * NA];
#endif
#ifdef MV_SCATTER
#if defined(REDUCE_CLUSTER) && defined(GATE_UP)
#define MV_SC_PAIRED
#define MV_SC_PAIR 2u   // a lane keeps a gate row's sum and its up row's (x[2v], x[2v + 1])
#else
#define MV_SC_PAIR 1u
#endif
const uint MV_SC_N = max(POW2_CEIL(NA), MV_SC_PAIR);   // the values padded with zeros (sums of their own)
const uint MV_SC_LAST = max(MV_SC_PAIR, MV_SC_N / MV_SCATTER);   // held at the end
uint mv_sc_base;      // the position of the first sum a lane holds
bool mv_sc_first;   // the first of the lanes that hold the same sums
#define MV_SC_HELD(o) SCATTER_HELD_MIN(MV_SC_N, MV_SCATTER, o, MV_SC_PAIR)
// a level of the reduce-scatter (common.glsl's SCATTER_LEVEL_MIN), offsets from MV_SCATTER / 2 down
#define MV_SC_LEVEL(o)                                                                  \
    if (MV_SCATTER > (o)) {                                                             \
        const bool hi = (sg_lane() & (o)) != 0u;                                        \
        mv_sc_base += hi && MV_SC_HELD(o) > MV_SC_PAIR ? MV_SC_HELD(o) / 2u : 0u;       \
        mv_sc_first = mv_sc_first && !(hi && MV_SC_HELD(o) == MV_SC_PAIR);              \
        SCATTER_LEVEL_MIN(x, MV_SC_HELD(o), MV_SC_PAIR, o, hi, sg_shuffle_xor)          \
    }
#endif

// the invocation's place in the workgroup: a group is TPR neighbouring invocations of one
// subgroup (or whole subgroups), whatever the subgroup size
uint mv_flat() {
#if defined(REDUCE_CLUSTER) || defined(REDUCE_SUBGROUP)
    return sg_flat();
#else
    return gl_LocalInvocationID.x;
#endif
}

void mv_reduce(uint flat_, inout precise float acc[NA]) {
#ifdef MV_SCATTER
    mv_sc_base = 0u;
    mv_sc_first = true;
    precise float x[MV_SC_N];
    [[unroll]] for (uint i = 0u; i < MV_SC_N; i++) {
#ifdef MV_SC_PAIRED
        x[i] = i < NA ? acc[(i >> 1u) + (i & 1u) * NV] : 0.0;
#else
        x[i] = i < NA ? acc[i] : 0.0;
#endif
    }
    MV_SC_LEVEL(64u) MV_SC_LEVEL(32u) MV_SC_LEVEL(16u) MV_SC_LEVEL(8u) MV_SC_LEVEL(4u) MV_SC_LEVEL(2u) MV_SC_LEVEL(1u)
#endif
#if defined(REDUCE_CLUSTER) && defined(MV_SCATTER)
    [[unroll]] for (uint i = 0u; i < MV_SC_LAST; i++) {
        acc[i] = x[i];   // MV_EACH_SUM's values, positions mv_sc_base on
    }
#elif defined(REDUCE_CLUSTER)
    // a level of the butterfly for every value, literal offsets (common.glsl's XOR_SUM)
#define MV_XOR_LEVEL(o) if (TPR > (o)) { [[unroll]] for (uint v = 0u; v < NA; v++) { acc[v] += sg_shuffle_xor(acc[v], o); } }
    MV_XOR_LEVEL(64u) MV_XOR_LEVEL(32u) MV_XOR_LEVEL(16u) MV_XOR_LEVEL(8u) MV_XOR_LEVEL(4u) MV_XOR_LEVEL(2u) MV_XOR_LEVEL(1u)
#elif defined(REDUCE_SUBGROUP) && defined(MV_SCATTER)
    // lanes holding the same sums store the same bits
    [[unroll]] for (uint i = 0u; i < MV_SC_LAST; i++) {
        if (mv_sc_base + i < NA) {
            red[sg_id() * NA + mv_sc_base + i] = x[i];
        }
    }
    barrier();
#elif defined(REDUCE_SUBGROUP)
    [[unroll]] for (uint v = 0u; v < NA; v++) {
        const float sum = sg_add(acc[v]);
        if (sg_elect()) {
            red[sg_id() * NA + v] = sum;
        }
    }
    barrier();
#else
    [[unroll]] for (uint v = 0u; v < NA; v++) {
        red[flat_ * NA + v] = acc[v];
    }
    barrier();
    [[unroll]] for (uint i = 0u; i < HALVINGS(TPR); ++i) {
        const uint half_ = (TPR >> 1u) >> i;
        if (flat_ % TPR < half_) {
            [[unroll]] for (uint v = 0u; v < NA; v++) {
                red[flat_ * NA + v] += red[(flat_ + half_) * NA + v];
            }
        }
        barrier();
    }
#endif
}

#if defined(REDUCE_CLUSTER) && defined(MV_SCATTER)
// the first lane of those holding a run of sums stores it: acc[0, MV_SC_LAST) holds values
// mv_sc_base on (results mv_sc_base / MV_SC_PAIR on, a gate's and its up's sums side by side)
#define MV_EACH_SUM(lane, v) if (mv_sc_first) \
    [[unroll]] for (uint j_ = 0u, v = mv_sc_base / MV_SC_PAIR; j_ < MV_SC_LAST / MV_SC_PAIR; j_++, v++) if (v < NV)
#define MV_SUM(acc, group, v) (acc)[j_ * MV_SC_PAIR]
#define MV_UP_SUM(acc, group, v) (acc)[j_ * MV_SC_PAIR + 1u]
#define MV_PARTS_READ()
#elif defined(REDUCE_CLUSTER)
// every lane of the group holds the sums: its first stores them
#define MV_SUM(acc, group, v) (acc)[v]
#define MV_UP_SUM(acc, group, v) (acc)[(v) + NV]
#define MV_EACH_SUM(lane, v) if ((lane) == 0u) [[unroll]] for (uint v = 0u; v < NV; v++)
#define MV_PARTS_READ()
#else
#ifdef REDUCE_SUBGROUP
#define RED_PARTS ((TPR + SG_SIZE - 1u) / SG_SIZE)   // a group's subgroups
#define RED_FIRST(group) ((group) * RED_PARTS)
#else
#define RED_PARTS 1u
#define RED_FIRST(group) ((group) * TPR)
#endif
// the sum of value v of group `group` over the parts it left in red
float part_sum(uint v, uint group) {
    float sum = 0.0;
    for (uint i = 0u; i < RED_PARTS; i++) {
        sum += red[(RED_FIRST(group) + i) * NA + v];
    }
    return sum;
}
#define MV_SUM(acc, group, v) part_sum(v, group)
#define MV_UP_SUM(acc, group, v) part_sum((v) + NV, group)
// the group's first lanes store its NV results (in REDUCE_SUBGROUP the workgroup is one group)
#define MV_EACH_SUM(lane, v) for (uint v = (lane); v < NV; v += TPR)
#define MV_PARTS_READ() barrier()
#endif

#endif
