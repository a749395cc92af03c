// Workgroup-wide sum through shared memory (with SG_REDUCE, of subgroup sums). The including shader declares
//   layout(constant_id = 0) const uint WG = ...;  (its local_size_x_id = 0)
// before including this file. Call from uniform control flow.
#ifndef VKRT_REDUCE_GLSL
#define VKRT_REDUCE_GLSL

shared float reduce_buf[WG];

#ifdef SG_REDUCE
#extension GL_KHR_shader_subgroup_arithmetic : enable
// subgroup sums, then the first invocation's walk over them: two barriers instead of log2(WG) + 1
float workgroup_sum(float v) {
    const float s = subgroupAdd(v);
    if (subgroupElect()) {
        reduce_buf[gl_SubgroupID] = s;
    }
    barrier();
    float total = 0.0;
    for (uint i = 0u; i < gl_NumSubgroups; i++) {
        total += reduce_buf[i];
    }
    barrier();
    return total;
}
#else
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
