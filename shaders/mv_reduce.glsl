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
// values a lane holds before the level of offset o (levels run for o < MV_SCATTER), and at the end
#define MV_SC_HALF(h) ((h) > 1u ? (h) / 2u : 1u)
const uint MV_SC_N = POW2_CEIL(NA);   // the values padded with zeros (sums of their own)
const uint MV_SC_H64 = MV_SC_N;
const uint MV_SC_H32 = MV_SCATTER > 64u ? MV_SC_HALF(MV_SC_H64) : MV_SC_N;
const uint MV_SC_H16 = MV_SCATTER > 32u ? MV_SC_HALF(MV_SC_H32) : MV_SC_N;
const uint MV_SC_H8 = MV_SCATTER > 16u ? MV_SC_HALF(MV_SC_H16) : MV_SC_N;
const uint MV_SC_H4 = MV_SCATTER > 8u ? MV_SC_HALF(MV_SC_H8) : MV_SC_N;
const uint MV_SC_H2 = MV_SCATTER > 4u ? MV_SC_HALF(MV_SC_H4) : MV_SC_N;
const uint MV_SC_H1 = MV_SCATTER > 2u ? MV_SC_HALF(MV_SC_H2) : MV_SC_N;
const uint MV_SC_LAST = MV_SCATTER > 1u ? MV_SC_HALF(MV_SC_H1) : MV_SC_N;
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
    // a reduce-scatter: at each level (offsets o from the subgroup's MV_SCATTER lanes / 2 down) a
    // lane keeps half the values it still holds (the upper half where its bit o is set) and adds
    // its partner's copy of that half, H / 2 shuffles where subgroupAdd's butterflies take H; one
    // value left, a butterfly step. Each sum has the bits of a butterfly (XOR_SUM's order); a lane
    // ends with MV_SC_LAST sums, positions base and on, and stores them (lanes holding the same
    // sums store the same bits)
    uint base = 0u;
    precise float x[MV_SC_N];
    [[unroll]] for (uint i = 0u; i < MV_SC_N; i++) {
        x[i] = i < NA ? acc[i] : 0.0;
    }
#define MV_SC_LEVEL(o, H)                                                             \
    if (MV_SCATTER > (o)) {                                                           \
        const bool hi = (sg_lane() & (o)) != 0u;                                      \
        if ((H) > 1u) {                                                               \
            base += hi ? (H) / 2u : 0u;                                               \
            [[unroll]] for (uint i = 0u; i < (H) / 2u; i++) {                         \
                const float keep = hi ? x[i + (H) / 2u] : x[i];                       \
                const float send = hi ? x[i] : x[i + (H) / 2u];                       \
                x[i] = keep + sg_shuffle_xor(send, o);                                \
            }                                                                         \
        } else {                                                                      \
            x[0] += sg_shuffle_xor(x[0], o);                                          \
        }                                                                             \
    }
    MV_SC_LEVEL(64u, MV_SC_H64) MV_SC_LEVEL(32u, MV_SC_H32) MV_SC_LEVEL(16u, MV_SC_H16)
    MV_SC_LEVEL(8u, MV_SC_H8) MV_SC_LEVEL(4u, MV_SC_H4) MV_SC_LEVEL(2u, MV_SC_H2) MV_SC_LEVEL(1u, MV_SC_H1)
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
