#version 450
// Attention scores without flash for fewer queries than attn_qk's 16-query tile (decode and
// verify steps): S as attn_qk writes it, from its operands. A workgroup computes one query's
// scores against 64 keys (x: query, y: key block, z: h + n_head * b), an invocation a key over
// the whole head, the query row held in shared memory: attn_qk's 16 x 16 tiles would leave 15 of
// their 16 query rows empty. Defines: K_F16, MAX_HEAD (attn_shapes.MAX_HEAD).
#include "common.glsl"
#include "attn_common.glsl"

layout(local_size_x = 64) in;

#include "attn_qk_io.glsl"

shared float qs[MAX_HEAD];

void main() {
    const uint t = gl_LocalInvocationID.x, i = gl_WorkGroupID.x, j = gl_WorkGroupID.y * 64u + t;
    const uint h = gl_WorkGroupID.z % p.n_head, b = gl_WorkGroupID.z / p.n_head;
    const uint q_row = p.q_off + b * p.q_nb3 + h * p.q_nb2 + i * p.q_nb1;
    for (uint d = t; d < p.hsk; d += 64u) {
        qs[d] = q[q_row + d];
    }
    barrier();
    if (j >= p.KV) {
        return;
    }
    const uint k_row = p.k_off + b * p.k_nb3 + (h / p.gqa) * p.k_nb2 + j * p.k_nb1;
    float acc = 0.0;
    for (uint d = 0; d < p.hsk; ++d) {
        acc = fma(qs[d], load_k(k_row + d), acc);
    }
    s[(gl_WorkGroupID.z * p.N + i) * p.KV + j] = acc;
}
