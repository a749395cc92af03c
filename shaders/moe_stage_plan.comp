#version 450
// Staging plan for decode with host-resident experts: the distinct experts the (token, slot)
// pairs chose, in ascending order, and each pair's index into that list. plan[0] = count,
// plan[1 + s] = expert of staging slot s; remap[pair] = staging slot (-1 for an id outside
// [0, n_expert)). One workgroup; a pair's result does not depend on which slot it reads.
#include "common.glsl"

layout(local_size_x = WG) in;

layout(binding = 0) readonly buffer Ids { int ids[]; };
layout(binding = 1) writeonly buffer Remap { int remap[]; };
layout(binding = 2) writeonly buffer Plan { uint plan[]; };

layout(push_constant) uniform Push {
    uint n_used;
    uint n_tokens;
    uint ids_off;   // int offset of the ids and ints between tokens
    uint ids_tok;
    uint remap_off; // int offset of the remapped ids (contiguous, n_used per token)
    uint n_expert;
    uint plan_off;  // uint offset of the plan
} p;

shared uint slot_of[N_EXPERT];

void main() {
    const uint tid = gl_LocalInvocationID.x;
    const uint pairs = p.n_used * p.n_tokens;
    for (uint e = tid; e < p.n_expert; e += WG) {
        slot_of[e] = 0u;
    }
    barrier();
    for (uint pair = tid; pair < pairs; pair += WG) {
        const int e = ids[p.ids_off + (pair / p.n_used) * p.ids_tok + pair % p.n_used];
        if (e >= 0 && uint(e) < p.n_expert) {
            slot_of[uint(e)] = 1u;
        }
    }
    barrier();
    if (tid == 0u) {
        uint n = 0u;
        for (uint e = 0u; e < p.n_expert; e++) {
            if (slot_of[e] != 0u) {
                slot_of[e] = n;
                plan[p.plan_off + 1u + n] = e;
                n++;
            }
        }
        plan[p.plan_off] = n;
    }
    barrier();
    for (uint pair = tid; pair < pairs; pair += WG) {
        const int e = ids[p.ids_off + (pair / p.n_used) * p.ids_tok + pair % p.n_used];
        remap[p.remap_off + pair] = (e >= 0 && uint(e) < p.n_expert) ? int(slot_of[uint(e)]) : -1;
    }
}
