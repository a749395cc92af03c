#version 450
// Mixture-of-experts routing, one token per workgroup: shaders/moe_route.glsl.
#include "common.glsl"

layout(local_size_x = WG) in;

layout(binding = 0) readonly buffer L { float logits[]; };
layout(binding = 1) writeonly buffer Ids { int ids[]; };
layout(binding = 2) writeonly buffer Wts { float weights[]; };
layout(binding = 3) readonly buffer B { float bias[]; };

layout(push_constant) uniform Push {
    uint n_expert;
    uint n_used;
    uint n_tokens;
    uint l_off;
    uint l_col;     // floats between tokens in logits
    uint ids_off;
    uint w_off;
    uint mode;      // 0: softmax, 1: softmax renormalised over the chosen, 2: softmax of the chosen,
                    // 3: sigmoid chosen by sigmoid + bias, 4: the same renormalised over the chosen
    uint b_off;     // the selection bias (modes 3 and 4)
} p;

#define RWG WG
#define ROUTE_LOGIT(i) logits[i]
#define ROUTE_BIAS(i) bias[i]
#define ROUTE_ID(i, v) ids[p.ids_off + (i)] = (v)
#define ROUTE_WEIGHT(i, v) weights[p.w_off + (i)] = (v)
#include "moe_route.glsl"

void main() {
    const uint t = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (t >= p.n_tokens) {
        return;
    }
    route_token(p.l_off + t * p.l_col, t * p.n_used, p.n_expert, p.n_used, p.mode, p.b_off);
}
