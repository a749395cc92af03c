#version 450
// Attention scores without flash for fewer queries than attn_qk's 16-query tile (decode and
// verify steps): S as attn_qk writes it, from its operands. A workgroup computes one query's
// scores against 32 keys (x: query, y: key block, z: h + n_head * b): 8 lanes a key, each 4 dims
// of every 32 (a key's 32 dims one contiguous read of its 8 lanes), their sums added in shared
// memory; the query row is held there too. attn_qk's 16 x 16 tiles would leave 15 of their 16
// query rows empty. Defines: K_F16, MAX_HEAD (attn_shapes.MAX_HEAD).
#include "common.glsl"
#include "attn_common.glsl"

layout(local_size_x = 256) in;

#include "attn_qk_io.glsl"

#define KEYS 32u
#define DIM_LANES 8u

shared float qs[MAX_HEAD];
shared float part[KEYS][DIM_LANES + 1u];

void main() {
    const uint t = gl_LocalInvocationID.x, dl = t % DIM_LANES, kk = t / DIM_LANES;
    const uint i = gl_WorkGroupID.x, j = gl_WorkGroupID.y * KEYS + kk;
    const uint h = gl_WorkGroupID.z % p.n_head, b = gl_WorkGroupID.z / p.n_head;
    const uint q_row = p.q_off + b * p.q_nb3 + h * p.q_nb2 + i * p.q_nb1;
    for (uint d = t; d < p.hsk; d += KEYS * DIM_LANES) {
        qs[d] = q[q_row + d];
    }
    barrier();
    const uint k_row = p.k_off + b * p.k_nb3 + (h / p.gqa) * p.k_nb2 + min(j, p.KV - 1u) * p.k_nb1;
    float acc = 0.0;
    for (uint d0 = 4u * dl; d0 < p.hsk; d0 += 4u * DIM_LANES) {
        [[unroll]] for (uint c = 0; c < 4u; ++c) {
            if (d0 + c < p.hsk) {
                acc = fma(qs[d0 + c], load_k(k_row + d0 + c), acc);
            }
        }
    }
    part[kk][dl] = acc;
    barrier();
    if (dl == 0u && j < p.KV) {
        float sum = part[kk][0];
        for (uint l = 1u; l < DIM_LANES; ++l) {
            sum += part[kk][l];
        }
        s[(gl_WorkGroupID.z * p.N + i) * p.KV + j] = sum;
    }
}
