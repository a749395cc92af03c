#version 450
// Mat-vec for decode: y[j][row] = sum_k W[row][k] * x[j][k] for NC token columns (the dot
// products: mv_dot.glsl, their sums over a group's lanes: mv_reduce.glsl). With GATE_UP the
// output is act(W·x) * (W2·x): a gated FFN's gate and up projections in one pass, W2's rows
// in the same binding at w2_off, laid out like W.
#include "common.glsl"

layout(local_size_x = WG) in;

layout(binding = 2) writeonly buffer Y { float y_data[]; };

layout(push_constant) uniform Push {
    uint K;        // elements per row
    uint M;        // rows of this binding
    uint w_off;    // byte offset of row 0 in W
    uint w_row;    // bytes between rows
    uint x_off;    // float offsets and strides of x and y
    uint x_col;    // between token columns
    uint y_off;
    uint y_col;
#ifdef GATE_UP
    uint w2_off;   // byte offset of W2's row 0 in W
#endif
} p;

#include "mv_dot.glsl"
#include "mv_reduce.glsl"
#ifdef GATE_UP
#include "act.glsl"
#define RESULT(acc, group, v) glu_fn(MV_SUM(acc, group, v), MV_UP_SUM(acc, group, v))
#define W2_OFF p.w2_off
#else
#define RESULT(acc, group, v) MV_SUM(acc, group, v)
#define W2_OFF 0u
#endif

void main() {
    qinit();
    const uint flat_ = mv_flat(), lane = flat_ % TPR, group = flat_ / TPR;
    const uint wgid = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    const uint row0 = (wgid * GROUPS + group) * NR;
    mv_rows(p.w_off, W2_OFF, row0);
    precise float acc[NA];   // no contraction: every variant (fused or not) sums a row alike
    mv_dots(lane, p.x_off, acc);
    mv_reduce(flat_, acc);
    MV_EACH_SUM(lane, v) {
        const uint r = v / NC, j = v % NC;
        if (row0 + r < p.M) {
            y_data[p.y_off + j * p.y_col + row0 + r] = RESULT(acc, group, v);
        }
    }
}
