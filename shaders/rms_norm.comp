#version 450
// y[row] = x[row] / sqrt(mean(x[row]^2) + eps) * w   (w broadcast over rows; optional)
// One workgroup per row; rows run over dims 1..3 with element strides.
// With ADD the residual add before it is fused in: s = x + r (stored, often in place over x),
// then y = norm(s) * w -- the same sums in the same order as the two kernels apart.
// With GATE the result is multiplied by silu(z) (a gated norm): z has x's shape and its own strides.
#include "common.glsl"
#if defined(ADD) && defined(GATE)
#error "ADD and GATE share binding 3"
#endif
#ifdef GATE
#define ACT ACT_SILU
#include "act.glsl"
#endif

layout(constant_id = 0) const uint WG = 64;
layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) readonly buffer W { float w[]; };
layout(binding = 2) writeonly buffer Y { float y[]; };
#ifdef ADD
layout(binding = 3) readonly buffer R { float r[]; };
layout(binding = 4) buffer S { float s[]; };   // may alias X; each element is read, then written, by one invocation
#endif
#ifdef GATE
layout(binding = 3) readonly buffer Z { float z[]; };
#endif

layout(push_constant) uniform Push {
    uint ncols;
    uint ne1;
    uint ne2;
    uint nrows;
    uint x_off;
    uint x_s1;
    uint x_s2;
    uint x_s3;
    uint y_off;
    uint y_s1;
    uint y_s2;
    uint y_s3;
    uint w_off;
    uint use_w;
    float eps;
#ifdef ADD
    uint r_off;     // residual and sum: element offsets, the strides of x
    uint s_off;
#endif
#ifdef GATE
    uint z_off;     // gate: element offset and strides
    uint z_s1;
    uint z_s2;
    uint z_s3;
#endif
} p;

#include "reduce.glsl"

void main() {
    const uint row = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (row >= p.nrows) {
        return;
    }
    const uint i1 = row % p.ne1;
    const uint i2 = (row / p.ne1) % p.ne2;
    const uint i3 = row / (p.ne1 * p.ne2);
    const uint xb = p.x_off + i1 * p.x_s1 + i2 * p.x_s2 + i3 * p.x_s3;
    const uint yb = p.y_off + i1 * p.y_s1 + i2 * p.y_s2 + i3 * p.y_s3;
#ifdef GATE
    const uint zb = p.z_off + i1 * p.z_s1 + i2 * p.z_s2 + i3 * p.z_s3;
#endif
    float sum = 0.0;
#ifdef ADD
    const uint rb = xb - p.x_off + p.r_off, sb = xb - p.x_off + p.s_off;
    for (uint c = gl_LocalInvocationID.x; c < p.ncols; c += WG) {
        const float v = x[xb + c] + r[rb + c];
        s[sb + c] = v;
        sum += v * v;
    }
#else
    for (uint c = gl_LocalInvocationID.x; c < p.ncols; c += WG) {
        const float v = x[xb + c];
        sum += v * v;
    }
#endif
    sum = workgroup_sum(sum);
    const float scale = inversesqrt(sum / float(p.ncols) + p.eps);
    for (uint c = gl_LocalInvocationID.x; c < p.ncols; c += WG) {
#ifdef ADD
        const float v = s[sb + c] * scale;
#else
        const float v = x[xb + c] * scale;
#endif
#ifdef GATE
        const float wv = p.use_w != 0 ? v * w[p.w_off + c] : v;
        y[yb + c] = wv * act_fn(z[zb + c]);
#else
        y[yb + c] = p.use_w != 0 ? v * w[p.w_off + c] : v;
#endif
    }
}
