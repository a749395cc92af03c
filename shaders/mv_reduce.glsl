// How the lanes of a mat-vec group (mv_dot.glsl) sum their partial sums: a butterfly of
// shuffles (REDUCE_CLUSTER: a group lies within one subgroup), subgroup adds then shared memory
// (REDUCE_SUBGROUP: a group is whole subgroups; RED_SG subgroups a workgroup, one where the
// workgroup is narrower than a subgroup; MV_SCATTER, the subgroup's fixed size: a reduce-scatter
// in place of the subgroup adds), or a shared-memory tree. Call mv_reduce(flat_, acc)
// in the workgroup's uniform control flow; then MV_EACH_SUM(lane, v) { ... } is a loop over the
// values v < NV this lane stores, and MV_SUM(acc, group, v) the group's sum of value v (< NA).
// MV_PARTS_READ() waits until every group has read its sums (before the next mv_reduce).
#ifndef VKRT_MV_REDUCE_GLSL
#define VKRT_MV_REDUCE_GLSL
#include "common.glsl"
#include "subgroup.glsl"
#if defined(REDUCE_SUBGROUP)
shared float red[RED_SG * NA];
#ifdef MV_SCATTER
const uint MV_SC_N = POW2_CEIL(NA);   // the values padded with zeros (sums of their own)
const uint MV_SC_LAST = MV_SCATTER > 1u ? max(1u, MV_SC_N / MV_SCATTER) : MV_SC_N;   // held at the end
#endif
#elif !defined(REDUCE_CLUSTER)
shared float red[WG * NA];
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
#if defined(REDUCE_CLUSTER)
    // a level of the butterfly for every value, literal offsets (common.glsl's XOR_SUM)
#define MV_XOR_LEVEL(o) if (TPR > (o)) { [[unroll]] for (uint v = 0u; v < NA; v++) { acc[v] += sg_shuffle_xor(acc[v], o); } }
    MV_XOR_LEVEL(64u) MV_XOR_LEVEL(32u) MV_XOR_LEVEL(16u) MV_XOR_LEVEL(8u) MV_XOR_LEVEL(4u) MV_XOR_LEVEL(2u) MV_XOR_LEVEL(1u)
#elif defined(REDUCE_SUBGROUP) && defined(MV_SCATTER)
    // a reduce-scatter over the subgroup's MV_SCATTER lanes (common.glsl's SCATTER_LEVEL, offsets
    // from MV_SCATTER / 2 down), in place of subgroupAdd's butterfly a value: a lane ends with
    // MV_SC_LAST sums, positions base and on, and stores them (lanes holding the same sums store
    // the same bits)
    uint base = 0u;
    precise float x[MV_SC_N];
    [[unroll]] for (uint i = 0u; i < MV_SC_N; i++) {
        x[i] = i < NA ? acc[i] : 0.0;
    }
#define MV_SC_LEVEL(o)                                                                  \
    if (MV_SCATTER > (o)) {                                                             \
        const bool hi = (sg_lane() & (o)) != 0u;                                        \
        base += hi && SCATTER_HELD(MV_SC_N, MV_SCATTER, o) > 1u ? SCATTER_HELD(MV_SC_N, MV_SCATTER, o) / 2u : 0u; \
        SCATTER_LEVEL(x, SCATTER_HELD(MV_SC_N, MV_SCATTER, o), o, hi, sg_shuffle_xor)   \
    }
    MV_SC_LEVEL(64u) MV_SC_LEVEL(32u) MV_SC_LEVEL(16u) MV_SC_LEVEL(8u) MV_SC_LEVEL(4u) MV_SC_LEVEL(2u) MV_SC_LEVEL(1u)
    [[unroll]] for (uint i = 0u; i < MV_SC_LAST; i++) {
        if (base + i < NA) {
            red[sg_id() * NA + base + i] = x[i];
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

#ifdef REDUCE_CLUSTER
// every lane of the group holds the sums: its first stores them
#define MV_SUM(acc, group, v) (acc)[v]
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
// the group's first lanes store its NV results (in REDUCE_SUBGROUP the workgroup is one group)
#define MV_EACH_SUM(lane, v) for (uint v = (lane); v < NV; v += TPR)
#define MV_PARTS_READ() barrier()
#endif

#endif
