// Workgroup-wide sum through shared memory: with SG_BUTTERFLY of subgroup sums made by a
// butterfly of shuffles (an order fixed by the lanes, so a kernel of another shape can redo it
// bit for bit: the mat-vec's norms, mv_norm.glsl), with SG_REDUCE of subgroupAdd's sums, else a
// shared-memory tree; the subgroups are subgroup.glsl's.
// The including shader declares
//   layout(constant_id = 0) const uint WG = ...;  (its local_size_x_id = 0)
// before including this file, and gives invocation reduce_lane() the elements c = reduce_lane() +
// i * WG of a row in that order. Call from uniform control flow.
#ifndef VKRT_REDUCE_GLSL
#define VKRT_REDUCE_GLSL

shared float reduce_buf[WG];

#if defined(SG_BUTTERFLY) || defined(SG_REDUCE)
#include "subgroup.glsl"
#ifdef SG_BUTTERFLY
#include "butterfly.glsl"
#define SUBGROUP_SUM(v) subgroup_butterfly(v)
// subgroup by subgroup: lane i of subgroup g is invocation g * size + i of the row
uint reduce_lane() {
    return sg_flat();
}
#else
#define SUBGROUP_SUM(v) sg_add(v)
uint reduce_lane() {
    return gl_LocalInvocationID.x;
}
#endif
// the subgroups' sums, then the first invocation's walk over them in subgroup order: two
// barriers instead of log2(WG) + 1
float workgroup_sum(float v) {
    const float s = SUBGROUP_SUM(v);
    if (sg_elect()) {
        reduce_buf[sg_id()] = s;
    }
    barrier();
    float total = 0.0;
    for (uint i = 0u; i < sg_count(); i++) {
        total += reduce_buf[i];
    }
    barrier();
    return total;
}
#else
uint reduce_lane() {
    return gl_LocalInvocationID.x;
}
float workgroup_sum(float v) {
    const uint lid = gl_LocalInvocationID.x;
    reduce_buf[lid] = v;
    barrier();
    [[unroll]] for (uint s = WG / 2; s > 0; s >>= 1) {
        if (lid < s) {
            reduce_buf[lid] += reduce_buf[lid + s];
        }
        barrier();
    }
    const float total = reduce_buf[0];
    barrier();
    return total;
}
#endif

#endif
