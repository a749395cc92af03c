#version 450
// y[row] = x[row] / sqrt(mean(x[row]^2) + eps) * w   (w broadcast over rows; optional)
// One workgroup per row; rows run over dims 1..3 with element strides.
// With ADD the residual add before it is fused in: s = x + r (stored, often in place over x),
// then y = norm(s) * w -- the same sums in the same order as the two kernels apart.
// With COMBINE (and ADD) r is a token's routed-expert output, summed here from the experts'
// outputs as moe_combine sums it (moe_sum.glsl): moe_combine's pass folded into the next norm.
// With GATE the result is multiplied by silu(z) (a gated norm): z has x's shape and its own strides.
#include "common.glsl"
#if defined(ADD) && defined(GATE)
#error "ADD and GATE share binding 3"
#endif
#if defined(COMBINE) && !defined(ADD)
#error "COMBINE is ADD's residual as the experts' weighted sum"
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
#ifdef COMBINE
layout(binding = 3) readonly buffer EY { float ey[]; };   // experts' outputs [ncols, n_used, rows]
layout(binding = 5) readonly buffer EW { float ew[]; };   // routing weights [n_used, rows]
layout(binding = 6) readonly buffer ES { float es[]; };   // shared expert output [ncols, rows]
layout(binding = 7) readonly buffer EG { float eg[]; };   // its gate logit per row
#else
layout(binding = 3) readonly buffer R { float r[]; };
#endif
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
    uint r_off;     // residual (COMBINE: the experts' outputs) and sum: element offsets, the strides of x
    uint s_off;
#endif
#ifdef COMBINE
    uint n_used;    // experts a row; float offsets of the routing weights, the shared output and its gate
    uint ew_off;
    uint es_off;
    uint eg_off;
    uint has_shared;
#endif
#ifdef GATE
    uint z_off;     // gate: element offset and strides
    uint z_s1;
    uint z_s2;
    uint z_s3;
#endif
} p;

#include "reduce.glsl"

#ifndef HOLD
#define HOLD 4
#endif
// element c of the row as the sum of squares sees it (with ADD: stored as the residual sum too)
#if defined(COMBINE)
#define LOAD_SUM(c) add_store(sb + (c), x[xb + (c)] + experts_sum(p.r_off + row * p.n_used * p.ncols + (c), \
    p.ew_off + row * p.n_used, p.n_used, p.ncols, p.has_shared != 0, p.es_off + row * p.ncols + (c), p.eg_off + row))
#elif defined(ADD)
#define LOAD_SUM(c) add_store(sb + (c), x[xb + (c)] + r[rb + (c)])
#else
#define LOAD_SUM(c) x[xb + (c)]
#endif
#ifdef ADD
float add_store(uint at, float v) {
    s[at] = v;
    return v;
}
#define RELOAD(c) s[sb + (c)]
#else
#define RELOAD(c) x[xb + (c)]
#endif
#ifdef COMBINE
#include "moe_sum.glsl"
#endif

// column c's weight (1 without one: unused)
float weight_of(uint c) {
    return p.use_w != 0 ? w[p.w_off + c] : 1.0;
}

// y[at] = the normed v times its column's weight wc (GATE: times silu(z[zat]))
void store_normed(uint at, float wc, float v, uint zat) {
    const float wv = p.use_w != 0 ? v * wc : v;
#ifdef GATE
    y[at] = wv * act_fn(z[zat]);
#else
    y[at] = wv;
#endif
}

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
#else
    const uint zb = 0u;
#endif
#define STORE_OUT(c, wc, v) store_normed(yb + (c), wc, v, zb + (c))
    // the first HOLD elements of an invocation stay in registers between the sum and the scaling,
    // their weights read before the sum (a short row's second pass reads nothing); the order of
    // the sum is the plain loop's
    precise float sum = 0.0;   // no contraction: the mat-vec's norms (mv_norm.glsl) sum alike
    float held[HOLD], held_w[HOLD];
    const uint lid = reduce_lane();
#ifdef ADD
    const uint rb = xb - p.x_off + p.r_off, sb = xb - p.x_off + p.s_off;
#endif
    [[unroll]] for (uint i = 0u; i < HOLD; i++) {
        const uint c = lid + i * WG;
        held[i] = 0.0;
        held_w[i] = 1.0;
        if (c < p.ncols) {
            held_w[i] = weight_of(c);
            held[i] = LOAD_SUM(c);
            sum += held[i] * held[i];
        }
    }
    for (uint c = lid + HOLD * WG; c < p.ncols; c += WG) {
        const float v = LOAD_SUM(c);
        sum += v * v;
    }
    sum = workgroup_sum(sum);
    // not contracted (the division as a product with a reciprocal, fused with the add): every
    // kernel computing this norm gets the same bits (NVIDIA fused it in some and not others)
    precise float mean_eps = sum / float(p.ncols) + p.eps;
    const float scale = inversesqrt(mean_eps);
    [[unroll]] for (uint i = 0u; i < HOLD; i++) {
        const uint c = lid + i * WG;
        if (c < p.ncols) {
            STORE_OUT(c, held_w[i], held[i] * scale);
        }
    }
    for (uint c = lid + HOLD * WG; c < p.ncols; c += WG) {
        STORE_OUT(c, weight_of(c), RELOAD(c) * scale);
    }
}
