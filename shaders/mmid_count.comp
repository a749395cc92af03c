#version 450
// Route table for mul_mat_id: per expert, how many (token, slot) pairs chose it and which.
// route[e] counts expert e (zeroed before this runs); its entries token * n_used + slot follow
// at route[n_expert + e * cap ...] in no particular order (each output is computed on its own,
// so the order changes no result). Ids outside [0, n_expert) and entries past cap are dropped.
#include "common.glsl"

layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer Ids { int ids[]; };
layout(binding = 1) buffer Route { uint route[]; };

layout(push_constant) uniform Push {
    uint n_tokens;
    uint n_used;
    uint ids_off;   // int offset of the ids and ints between tokens
    uint ids_tok;
    uint n_expert;
    uint cap;       // entries per expert
} p;

void main() {
    const uint pair = global_index();
    if (pair >= p.n_tokens * p.n_used) {
        return;
    }
    const uint tok = pair / p.n_used, slot = pair % p.n_used;
    const int e = ids[p.ids_off + tok * p.ids_tok + slot];
    if (e < 0 || uint(e) >= p.n_expert) {
        return;
    }
    const uint pos = atomicAdd(route[uint(e)], 1u);
    if (pos < p.cap) {
        route[p.n_expert + uint(e) * p.cap + pos] = pair;
    }
}
