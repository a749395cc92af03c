#version 450
// dst[:, t] = row ids[t] of the table W, as f32 (any weight type of shaders/quant/).
// The table may be bound in row ranges [row0, row0 + rows): ids outside the range are skipped,
// another dispatch covers them. One invocation per 4 elements of an output row.
#include "common.glsl"

layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer W { uint w_data[]; };
layout(binding = 1) readonly buffer Ids { int ids[]; };
layout(binding = 2) writeonly buffer D { uint d_data[]; };

#define QBUF w_data
#include "quant/types.glsl"

layout(push_constant) uniform Push {
    uint ne0;      // elements per row
    uint n_ids;
    uint row0;     // first table row in this binding
    uint rows;     // table rows in this binding
    uint w_off;    // byte offset of row row0 in W
    uint w_row;    // bytes between table rows
    uint ids_off;  // offset of ids[0] (elements)
    uint d_off;    // float offset of dst row 0
    uint d_row;    // floats between dst rows
} p;

void main() {
    qinit();
    const uint groups = (p.ne0 + 3u) / 4u;
    const uint g = global_index();
    if (g >= groups * p.n_ids) {
        return;
    }
    const uint t = g / groups;
    const uint row = uint(ids[p.ids_off + t]) - p.row0;
    if (row >= p.rows) {
        return;
    }
    const uint k = 4u * (g % groups);
    const uint src = p.w_off + row * p.w_row;
    const uint dst = p.d_off + t * p.d_row + k;
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
