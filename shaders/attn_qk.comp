#version 450
// Attention scores without flash: S[b][h][i][j] = sum_d Q[b][h][i][d] * K[b][h / gqa][j][d], f32,
// contiguous (n_kv, n_q, n_head, batch from innermost). A workgroup computes a 16 x 16 tile
// (x: query tile, y: key tile, z: h + n_head * b); 8 x 8 invocations of 2 x 2 each.
// Defines: K_F16.
#include "common.glsl"
#include "attn_common.glsl"

layout(local_size_x = 8, local_size_y = 8) in;

#include "attn_qk_io.glsl"

shared float qs[16][17];
shared float ks[16][17];

void main() {
    const uint tx = gl_LocalInvocationID.x, ty = gl_LocalInvocationID.y, tid = ty * 8u + tx;
    const uint i0 = gl_WorkGroupID.x * 16u, j0 = gl_WorkGroupID.y * 16u;
    const uint h = gl_WorkGroupID.z % p.n_head, b = gl_WorkGroupID.z / p.n_head;
    const uint q_base = p.q_off + b * p.q_nb3 + h * p.q_nb2;
    const uint k_base = p.k_off + b * p.k_nb3 + (h / p.gqa) * p.k_nb2;
    float acc[2][2] = {{0.0, 0.0}, {0.0, 0.0}};
    for (uint d0 = 0; d0 < p.hsk; d0 += 16u) {
        for (uint e = tid; e < 256u; e += 64u) {
            const uint r = e / 16u, d = d0 + e % 16u;
            qs[r][e % 16u] = (i0 + r < p.N && d < p.hsk) ? q[q_base + (i0 + r) * p.q_nb1 + d] : 0.0;
            ks[r][e % 16u] = (j0 + r < p.KV && d < p.hsk) ? load_k(k_base + (j0 + r) * p.k_nb1 + d) : 0.0;
        }
        barrier();
        for (uint d = 0; d < 16u; ++d) {
            [[unroll]] for (uint a = 0; a < 2u; ++a) {
                [[unroll]] for (uint c = 0; c < 2u; ++c) {
                    acc[a][c] += qs[ty + 8u * a][d] * ks[tx + 8u * c][d];
                }
            }
        }
        barrier();
    }
    [[unroll]] for (uint a = 0; a < 2u; ++a) {
        [[unroll]] for (uint c = 0; c < 2u; ++c) {
            const uint i = i0 + ty + 8u * a, j = j0 + tx + 8u * c;
            if (i < p.N && j < p.KV) {
                s[(gl_WorkGroupID.z * p.N + i) * p.KV + j] = acc[a][c];
            }
        }
    }
}
