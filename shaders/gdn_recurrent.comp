#version 450
// Gated delta rule, recurrent form (vkrt/ops/delta_net.py): token by token, per sequence and value
// head h (key head h % n_k_heads), with S the head's D x D state (S[i][j]: i value row, j key column):
//     q = q / max(|q|, eps) / sqrt(D),  k = k / max(|k|, eps)
//     g = softplus(alpha + dt_bias) * ssm_a,  b = sigmoid(beta)
//     S = e^g S;  u = b (v - S k);  S += u k^T;  o = S q
// Rows of S evolve independently, so a workgroup owns a block of rows of one head of one sequence
// (x: row block, y: head, z: sequence) and keeps them in registers over the sequence's tokens.
// LANES consecutive invocations share ROWS rows: lane l holds the vec4s l + LANES * m of each row
// (lanes read consecutive 16 bytes of the state) and the lanes add their partial dot products with
// subgroup shuffles. Both dot products come from the state before the token's update:
//     S k = e^g S_old k,   o = e^g S_old q + u (k . q)
// so each token needs one reduction (|k|^2, |q|^2, k.q and S_old k, S_old q per row) and no barrier;
// the next token's inputs are loaded while it runs.
//
// Defines: D (head size), LANES (a power of two, at most the subgroup size; 1 = no shuffles), ROWS;
// SPAN: one sequence whose first column and token count follow its slot in `slots` (a DeltaNet
// catch-up, recorded once and run over whatever span the host writes there); with STATE_IN its
// state is read from another buffer (a snapshot; in_off, the state's strides) and written to
// the slot's.
#include "common.glsl"
#include "gdn.glsl"

layout(local_size_x_id = 0) in;
#if LANES > 1
#include "subgroup.glsl"   // (emulated subgroups, SG_LOGICAL, need the workgroup size as WG)
#endif

const uint NV4 = D / (4u * LANES);   // vec4s of a row per lane
const uint NRED = 3u + 2u * ROWS;    // values reduced per token

layout(binding = 0) readonly buffer QKV { float qkv[]; };
layout(binding = 1) readonly buffer Alpha { float alpha[]; };
layout(binding = 2) readonly buffer Beta { float beta[]; };
layout(binding = 3) readonly buffer DtBias { float dt_bias[]; };
layout(binding = 4) readonly buffer SsmA { float ssm_a[]; };
layout(binding = 5) buffer State { vec4 state4[]; };
layout(binding = 6) readonly buffer Slots { int slots[]; };
layout(binding = 7) writeonly buffer Out { float o[]; };

// element offsets and strides; the state's are multiples of 4
layout(push_constant) uniform Push {
    uint seq_tokens;    // tokens per sequence
    uint n_k_heads;
    uint qkv_off; uint qkv_s1;
    uint alpha_off; uint alpha_s1;
    uint beta_off; uint beta_s1;
    uint dt_off; uint a_off;
    uint st_off; uint st_s1; uint st_s2; uint st_s3;
    uint slot_off;
    uint out_off; uint out_s1;
    float eps;
#ifdef STATE_IN
    uint in_off;
#endif
} p;
#ifdef STATE_IN
layout(binding = 8) readonly buffer StateIn { vec4 state_in4[]; };
#endif

// token t's q and k (this lane's vec4s of the key head), v (this thread's rows of the value head)
// and raw gates
void load_token(uint t, uint kh, uint h, uint row0, uint lane, out vec4 q4[NV4], out vec4 k4[NV4],
                out float v[ROWS], out float al, out float be) {
    const uint col = p.qkv_off + t * p.qkv_s1;
    const uint qb = col + kh * D + 4u * lane;
    const uint kb = qb + p.n_k_heads * D;
    [[unroll]] for (uint m = 0; m < NV4; ++m) {
        const uint e = 4u * LANES * m;
        q4[m] = vec4(qkv[qb + e], qkv[qb + e + 1u], qkv[qb + e + 2u], qkv[qb + e + 3u]);
        k4[m] = vec4(qkv[kb + e], qkv[kb + e + 1u], qkv[kb + e + 2u], qkv[kb + e + 3u]);
    }
    const uint vb = col + 2u * p.n_k_heads * D + h * D + row0;
    [[unroll]] for (uint r = 0; r < ROWS; ++r) {
        v[r] = qkv[vb + r];
    }
    al = alpha[p.alpha_off + t * p.alpha_s1 + h];
    be = beta[p.beta_off + t * p.beta_s1 + h];
}

void main() {
    const uint tid = gl_LocalInvocationID.x;
    const uint lane = tid % LANES;
    const uint row0 = gl_WorkGroupID.x * (gl_WorkGroupSize.x / LANES * ROWS) + tid / LANES * ROWS;
    const uint h = gl_WorkGroupID.y;
    const uint seq = gl_WorkGroupID.z;
    const uint kh = h % p.n_k_heads;
    const uint slot = uint(slots[p.slot_off + seq]);
    const uint st_base = (p.st_off + slot * p.st_s3 + h * p.st_s2) / 4u + lane;

    vec4 S[ROWS][NV4];
#ifdef STATE_IN
    const uint in_base = (p.in_off + h * p.st_s2) / 4u + lane;
#endif
    [[unroll]] for (uint r = 0; r < ROWS; ++r) {
        [[unroll]] for (uint m = 0; m < NV4; ++m) {
#ifdef STATE_IN
            S[r][m] = state_in4[in_base + (row0 + r) * (p.st_s1 / 4u) + m * LANES];
#else
            S[r][m] = state4[st_base + (row0 + r) * (p.st_s1 / 4u) + m * LANES];
#endif
        }
    }
    const float dt = dt_bias[p.dt_off + h];
    const float a = ssm_a[p.a_off + h];
    const float q_scale = inversesqrt(float(D));

    // the token's inputs are loaded one token ahead, while the previous token is reduced
#ifdef SPAN
    const uint t_first = uint(slots[p.slot_off + 1u]);
    const uint t_end = t_first + uint(slots[p.slot_off + 2u]);
#else
    const uint t_first = seq * p.seq_tokens;
    const uint t_end = t_first + p.seq_tokens;
#endif
    vec4 q4[NV4], k4[NV4];
    float v[ROWS], al, be;
    load_token(t_first, kh, h, row0, lane, q4, k4, v, al, be);
    [[dont_unroll]] for (uint t = t_first; t < t_end; ++t) {
        float red[NRED];
        [[unroll]] for (uint i = 0; i < NRED; ++i) {
            red[i] = 0.0;
        }
        [[unroll]] for (uint m = 0; m < NV4; ++m) {
            red[0] += dot(k4[m], k4[m]);
            red[1] += dot(q4[m], q4[m]);
            red[2] += dot(k4[m], q4[m]);
            [[unroll]] for (uint r = 0; r < ROWS; ++r) {
                red[3u + 2u * r] += dot(S[r][m], k4[m]);
                red[4u + 2u * r] += dot(S[r][m], q4[m]);
            }
        }
        const vec4 k_cur[NV4] = k4;
        const float v_cur[ROWS] = v;
        const float eg = exp(gdn_log_decay(al, dt, a));
        const float b = gdn_strength(be);
        if (t + 1u < t_end) {
            load_token(t + 1u, kh, h, row0, lane, q4, k4, v, al, be);
        }
#if LANES > 1
        [[unroll]] for (uint i = 0; i < NRED; ++i) {
            XOR_SUM_UP(red[i], LANES, sg_shuffle_xor)
        }
#endif
        const float nk = gdn_inv_norm(red[0], p.eps);
        const float nq = gdn_inv_norm(red[1], p.eps) * q_scale;
        const float kq = red[2] * nk * nq;
        const uint ob = p.out_off + t * p.out_s1 + h * D + row0;
        [[unroll]] for (uint r = 0; r < ROWS; ++r) {
            const float u = b * (v_cur[r] - eg * (red[3u + 2u * r] * nk));
            const float uk = u * nk;
            [[unroll]] for (uint m = 0; m < NV4; ++m) {
                S[r][m] = eg * S[r][m] + uk * k_cur[m];
            }
            if (lane == r % LANES) {
                o[ob + r] = eg * (red[4u + 2u * r] * nq) + u * kq;
            }
        }
    }

    [[unroll]] for (uint r = 0; r < ROWS; ++r) {
        [[unroll]] for (uint m = 0; m < NV4; ++m) {
            state4[st_base + (row0 + r) * (p.st_s1 / 4u) + m * LANES] = S[r][m];
        }
    }
}
