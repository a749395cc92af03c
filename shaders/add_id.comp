#version 450
// ggml's add_id: out[i, j, t] = a[i, j, t] + b[i, ids[j, t]], f32. The experts' biases of
// gpt-oss: a is a per-slot projection [n, n_used, n_tokens] (contiguous), b a bias per expert
// [n, n_expert] (contiguous), ids the chosen experts [n_used, n_tokens]; out may be a itself.
#include "common.glsl"

layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer A { float a[]; };
layout(binding = 1) readonly buffer B { float b[]; };
layout(binding = 2) readonly buffer Ids { int ids[]; };
layout(binding = 3) writeonly buffer Out { float dst[]; };

layout(push_constant) uniform Push {
    uint n;         // elements of a row
    uint rows;      // n_used * n_tokens
    uint n_used;
    uint a_off;
    uint b_off;
    uint ids_off;
    uint ids_tok;   // ints between tokens of the ids
    uint d_off;
} p;

void main() {
    const uint i = global_index();
    if (i >= p.n * p.rows) {
        return;
    }
    const uint row = i / p.n;
    const uint e = uint(ids[p.ids_off + (row / p.n_used) * p.ids_tok + row % p.n_used]);
    dst[p.d_off + i] = a[p.a_off + i] + b[p.b_off + e * p.n + i % p.n];
}
