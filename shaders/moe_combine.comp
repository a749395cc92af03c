#version 450
// out[e, t] = sum_j ew[j, t] * ey[e, j, t]  (+ sigmoid(eg[t]) * es[e, t] with has_shared: qwen2moe's
// shared expert and its gate), summed by moe_sum.glsl. ey is the experts' outputs [n_embd, n_used, n_tokens].
#include "common.glsl"

layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer Y { float ey[]; };
layout(binding = 1) readonly buffer W { float ew[]; };
layout(binding = 2) readonly buffer S { float es[]; };
layout(binding = 3) readonly buffer G { float eg[]; };
layout(binding = 4) writeonly buffer O { float dst[]; };

layout(push_constant) uniform Push {
    uint n_embd;
    uint n_used;
    uint n_tokens;
    uint y_off;
    uint w_off;
    uint s_off;
    uint g_off;
    uint o_off;
    uint has_shared;
} p;

#include "moe_sum.glsl"

void main() {
    const uint i = global_index();
    if (i >= p.n_embd * p.n_tokens) {
        return;
    }
    const uint e = i % p.n_embd;
    const uint t = i / p.n_embd;
    dst[p.o_off + i] = experts_sum(p.y_off + t * p.n_used * p.n_embd + e, p.w_off + t * p.n_used, p.n_used, p.n_embd,
                                   p.has_shared != 0, p.s_off + t * p.n_embd + e, p.g_off + t);
}
