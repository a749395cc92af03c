#version 450
// The experts' mat-vec for decode (mul_mat_id): workgroup z is one (token, slot) pair of the
// routing ids, W the stack of expert matrices, y[tok][slot] = W[e] · x[tok][slot] for the slot's
// expert e (mv_dot.glsl, mv_reduce.glsl; one column). Pairs whose expert lies outside [e0, e1)
// (another binding's) exit at once. With GATE_UP the output is act(W[e]·x) * (W2[e]·x), W2's
// stack in the same binding at w2_off, laid out like W's. With BIAS each output row gets its
// expert's bias b[e][row], as add_id would add it after the store (GATE_UP: W's b and W2's b2,
// before the activation).
#include "common.glsl"
#define NC 1

layout(local_size_x = WG) in;

layout(binding = 2) writeonly buffer Y { float y_data[]; };
layout(binding = 3) readonly buffer Ids { int ids[]; };

layout(push_constant) uniform Push {
    uint K;        // elements per row
    uint M;        // rows of an expert
    uint w_off;    // byte offset of row 0 of expert e0 in W
    uint w_row;    // bytes between rows
    uint x_off;    // float offsets and strides of x and y
    uint x_col;    // between tokens
    uint y_off;
    uint y_col;
    uint w_expert; // bytes between experts
    uint e0;       // experts [e0, e1) are in this binding
    uint e1;
    uint n_used;   // slots (experts) per token
    uint ids_off;  // int offset and ints between tokens of the ids
    uint ids_tok;
    uint x_slot;   // floats between the x rows of slots; x has x_slots rows per token (1: shared)
    uint x_slots;
    uint y_slot;
#ifdef GATE_UP
    uint w2_off;   // byte offset of W2's row 0 of expert e0 in W
#endif
#ifdef BIAS
    uint b_off;    // float offsets of the biases of expert 0 (row r of expert e: + e * M + r)
#ifdef GATE_UP
    uint b2_off;
#endif
#endif
} p;

#include "mv_dot.glsl"
#include "mv_reduce.glsl"
#ifdef BIAS
layout(binding = 4) readonly buffer B { float b_data[]; };           // [M, n_expert]
#ifdef GATE_UP
layout(binding = 5) readonly buffer B2 { float b2_data[]; };         // W2's, laid out alike
#endif
// x + b as a separate add_id computes it
float biased(float x, float b) {
    precise float r = x + b;
    return r;
}
// sum s of row row0 + r with its expert's bias (buffer b from push field off) added
#define BIASED(s, b, off, r) biased(s, b[p.off + e * p.M + row0 + (r)])
#else
#define BIASED(s, b, off, r) (s)
#endif
#ifdef GATE_UP
#include "act.glsl"
#define RESULT(acc, group, v) glu_fn(BIASED(MV_SUM(acc, group, v), b_data, b_off, v), \
                                     BIASED(MV_UP_SUM(acc, group, v), b2_data, b2_off, v))
#define W2_OFF (p.w2_off + (e - p.e0) * p.w_expert)
#else
#define RESULT(acc, group, v) BIASED(MV_SUM(acc, group, v), b_data, b_off, v)
#define W2_OFF 0u
#endif

void main() {
    qinit();
    const uint flat_ = mv_flat(), lane = flat_ % TPR, group = flat_ / TPR;
    const uint wgid = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    const uint row0 = (wgid * GROUPS + group) * NR;
    const uint pair = gl_WorkGroupID.z;
    const uint tok = pair / p.n_used, slot = pair % p.n_used;
    const uint e = uint(ids[p.ids_off + tok * p.ids_tok + slot]);
    if (e < p.e0 || e >= p.e1) {
        return;   // uniform across the workgroup
    }
    mv_rows(p.w_off + (e - p.e0) * p.w_expert, W2_OFF, row0);
    precise float acc[NA];   // no contraction: every variant (fused or not) sums a row alike
    mv_dots(lane, p.x_off + tok * p.x_col + (slot % p.x_slots) * p.x_slot, acc);
    mv_reduce(flat_, acc);
    const uint ybase = p.y_off + tok * p.y_col + slot * p.y_slot;
    MV_EACH_SUM(lane, v) {
        if (row0 + v < p.M) {
            y_data[ybase + row0 + v] = RESULT(acc, group, v);
        }
    }
}
