#version 450
// Attention output without flash for fewer queries than attn_pv's 16-query tile (decode and
// verify steps): out = P V with attn_pv's operands. A workgroup computes one query's 32 dims of
// one head (x: query, y: dim tile, z: h + n_head * b): its 32 key lanes take every 32nd key, each
// of its 8 dim lanes 4 dims, and the key lanes' sums are added in shared memory, so a deep cache's
// keys are read by 256 invocations at once where attn_pv walked them 16 at a time. Defines: V_F16.
#include "common.glsl"
#include "attn_common.glsl"

layout(local_size_x = 256) in;

#include "attn_pv_io.glsl"

#define KEY_LANES 32u
#define DIM_LANES 8u

shared vec4 part[KEY_LANES][DIM_LANES];

void main() {
    const uint t = gl_LocalInvocationID.x, dl = t % DIM_LANES, kl = t / DIM_LANES;
    const uint i = gl_WorkGroupID.x, d = gl_WorkGroupID.y * (4u * DIM_LANES) + 4u * dl;
    const uint h = gl_WorkGroupID.z % p.n_head, b = gl_WorkGroupID.z / p.n_head;
    const uint p_base = (gl_WorkGroupID.z * p.N + i) * p.KV;
    const uint v_base = p.v_off + b * p.v_nb3 + (h / p.gqa) * p.v_nb2;
    vec4 acc = vec4(0.0);
    for (uint j = kl; j < p.KV; j += KEY_LANES) {
        const uint row = v_base + j * p.v_nb1 + d;
        vec4 vv;
        [[unroll]] for (uint c = 0; c < 4u; ++c) {
            vv[c] = d + c < p.hsv ? load_v(row + c) : 0.0;
        }
        acc = fma(vec4(prob[p_base + j]), vv, acc);
    }
    part[kl][dl] = acc;
    barrier();
    if (kl == 0u) {
        vec4 sum = part[0][dl];
        for (uint k = 1u; k < KEY_LANES; ++k) {
            sum += part[k][dl];
        }
        const uint o_row = p.o_off + ((b * p.N + i) * p.n_head + h) * p.hsv;
        [[unroll]] for (uint c = 0; c < 4u; ++c) {
            if (d + c < p.hsv) {
                o[o_row + d + c] = sum[c];
            }
        }
    }
}
