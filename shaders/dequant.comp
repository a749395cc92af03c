#version 450
// dst = src as f32, bit-exact with gguf.quants.dequantize. One invocation per 4 elements of a row;
// rows are `w_row` bytes apart in the source and `d_row` floats apart in the destination.
#include "common.glsl"

layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer W { uint w_data[]; };
layout(binding = 1) writeonly buffer D { uint d_data[]; };

#define QBUF w_data
#include "quant/types.glsl"

layout(push_constant) uniform Push {
    uint ne0;     // elements per row
    uint rows;
    uint w_off;   // byte offset of the first row in W
    uint w_row;   // bytes between rows of W
    uint d_off;   // float offset of the first row in D
    uint d_row;   // floats between rows of D
} p;

void main() {
    qinit();
    const uint groups = (p.ne0 + 3u) / 4u;
    const uint g = global_index();
    if (g >= groups * p.rows) {
        return;
    }
    const uint row = g / groups;
    const uint k = 4u * (g % groups);
    const uint src = p.w_off + row * p.w_row;
    const uint dst = p.d_off + row * p.d_row + k;
    if (k + 4u <= p.ne0) {
        const uvec4 v = floatBitsToUint(dq4(src + (k / QK) * QTS, (k % QK) >> 2));
        d_data[dst] = v.x;
        d_data[dst + 1u] = v.y;
        d_data[dst + 2u] = v.z;
        d_data[dst + 3u] = v.w;
    } else {
        for (uint i = 0u; k + i < p.ne0; i++) {
            d_data[dst + i] = floatBitsToUint(qelem(src, k + i));
        }
    }
}
