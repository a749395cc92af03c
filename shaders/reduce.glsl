// Workgroup-wide sum through shared memory. The including shader declares
//   layout(constant_id = 0) const uint WG = ...;  (its local_size_x_id = 0)
// before including this file. Call from uniform control flow.
#ifndef VKRT_REDUCE_GLSL
#define VKRT_REDUCE_GLSL

shared float reduce_buf[WG];

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
