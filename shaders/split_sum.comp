#version 450
// y[y_off + n * y_col + m] = sum over s = 0..S-1, in that order, of part[s * part_split + n * M + m]:
// the split-K GEMM's partial tiles (mul_mm.comp SPLIT_K) added into the output.
#include "common.glsl"

layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer Part { float part[]; };
layout(binding = 1) writeonly buffer Y { float y_data[]; };

layout(push_constant) uniform Push {
    uint M;
    uint N;
    uint S;
    uint part_split;
    uint y_off;
    uint y_col;
} p;

void main() {
    const uint i = global_index();
    if (i >= p.M * p.N) {
        return;
    }
    float acc = part[i];
    for (uint s = 1u; s < p.S; s++) {
        acc += part[s * p.part_split + i];
    }
    y_data[p.y_off + (i / p.M) * p.y_col + i % p.M] = acc;
}
