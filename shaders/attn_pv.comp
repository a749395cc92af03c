#version 450
// Attention output without flash: out[b][i][h][d] = sum_j P[b][h][i][j] * V[b][h / gqa][j][d] with P
// the softmaxed scores (n_kv, n_q, n_head, batch from innermost) and out f32 [hsv, n_head, n_q,
// batch]. A workgroup computes 16 queries x 16 dims (x: query tile, y: dim tile, z: h + n_head * b);
// 8 x 8 invocations of 2 x 2 each. Defines: V_F16.
#include "common.glsl"
#include "attn_common.glsl"

layout(local_size_x = 8, local_size_y = 8) in;

#include "attn_pv_io.glsl"

shared float ps[16][17];   // [query][key]
shared float vs[16][17];   // [dim][key]

void main() {
    const uint tx = gl_LocalInvocationID.x, ty = gl_LocalInvocationID.y, tid = ty * 8u + tx;
    const uint i0 = gl_WorkGroupID.x * 16u, d0 = gl_WorkGroupID.y * 16u;
    const uint h = gl_WorkGroupID.z % p.n_head, b = gl_WorkGroupID.z / p.n_head;
    const uint p_base = gl_WorkGroupID.z * p.N * p.KV;
    const uint v_base = p.v_off + b * p.v_nb3 + (h / p.gqa) * p.v_nb2;
    float acc[2][2] = {{0.0, 0.0}, {0.0, 0.0}};
    for (uint j0 = 0; j0 < p.KV; j0 += 16u) {
        for (uint e = tid; e < 256u; e += 64u) {
            const uint r = e / 16u, j = j0 + e % 16u;
            ps[r][e % 16u] = (i0 + r < p.N && j < p.KV) ? prob[p_base + (i0 + r) * p.KV + j] : 0.0;
            const uint jr = j0 + r, d = d0 + e % 16u;
            vs[e % 16u][r] = (jr < p.KV && d < p.hsv) ? load_v(v_base + jr * p.v_nb1 + d) : 0.0;
        }
        barrier();
        for (uint j = 0; j < 16u; ++j) {
            [[unroll]] for (uint a = 0; a < 2u; ++a) {
                [[unroll]] for (uint c = 0; c < 2u; ++c) {
                    acc[a][c] += ps[ty + 8u * a][j] * vs[tx + 8u * c][j];
                }
            }
        }
        barrier();
    }
    [[unroll]] for (uint a = 0; a < 2u; ++a) {
        [[unroll]] for (uint c = 0; c < 2u; ++c) {
            const uint i = i0 + ty + 8u * a, d = d0 + tx + 8u * c;
            if (i < p.N && d < p.hsv) {
                o[p.o_off + ((b * p.N + i) * p.n_head + h) * p.hsv + d] = acc[a][c];
            }
        }
    }
}
