#version 450
// LayerNorm over each row of a contiguous [ncols, nrows] f32 tensor, with weight and bias:
// y = (x - mean) / sqrt(var + eps) * w + b. One workgroup a row; the sums are a shared-memory tree.
#include "common.glsl"

layout(constant_id = 0) const uint WG = 64;
layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) readonly buffer W { float w[]; };
layout(binding = 2) readonly buffer B { float b[]; };
layout(binding = 3) writeonly buffer Y { float y[]; };

layout(push_constant) uniform Push {
    uint ncols;
    uint nrows;
    uint x_off;
    uint y_off;
    uint w_off;
    uint b_off;
    float eps;
} p;

shared float part[WG];

float row_sum(float v) {
    const uint t = gl_LocalInvocationID.x;
    part[t] = v;
    barrier();
    [[unroll]] for (uint s = WG / 2; s > 0; s >>= 1) {
        if (t < s) {
            part[t] += part[t + s];
        }
        barrier();
    }
    const float total = part[0];
    barrier();
    return total;
}

void main() {
    const uint row = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (row >= p.nrows) {
        return;
    }
    const uint t = gl_LocalInvocationID.x;
    const uint xb = p.x_off + row * p.ncols;
    float s = 0.0;
    for (uint i = t; i < p.ncols; i += WG) {
        s += x[xb + i];
    }
    const float mean = row_sum(s) / float(p.ncols);
    float q = 0.0;
    for (uint i = t; i < p.ncols; i += WG) {
        const float d = x[xb + i] - mean;
        q += d * d;
    }
    const float inv = inversesqrt(row_sum(q) / float(p.ncols) + p.eps);
    const uint yb = p.y_off + row * p.ncols;
    for (uint i = t; i < p.ncols; i += WG) {
        y[yb + i] = (x[xb + i] - mean) * inv * w[p.w_off + i] + b[p.b_off + i];
    }
}
