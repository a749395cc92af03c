#version 450
// mask_opt pre-pass: classify every BR x BC block of an f16 attention mask as all -inf, all zero
// (+0 or -0) or mixed, 2 bits a block, 16 blocks a uint (codes in attn_common.glsl). Only rows < N
// and columns < KV count. Output [plane][row tile][ceil(n_tiles / 16)] with plane = i3 * nem2 + i2.
// One thread a block: x covers KV tiles (64 a workgroup), y the row tiles, z the mask planes.
// Defines: BR, BC.
#include "common.glsl"
#include "attn_common.glsl"

layout(local_size_x = 64) in;

layout(binding = 0) readonly buffer Mask { uint m_u32[]; };
layout(binding = 1) writeonly buffer MaskOpt { uint mo[]; };

layout(push_constant) uniform Push {
    uint N; uint KV; uint m_off; uint m_nb1;
    uint m_nb2; uint m_nb3; uint nem2;
} p;

shared uint words[4];

void main() {
    const uint t = gl_LocalInvocationID.x;
    const uint jt = gl_WorkGroupID.x * 64u + t;
    const uint rt = gl_WorkGroupID.y;
    const uint plane = gl_WorkGroupID.z;
    const uint n_tiles = (p.KV + BC - 1u) / BC;
    const uint stride = (n_tiles + 15u) / 16u;
    if (t < 4u) {
        words[t] = 0u;
    }
    barrier();

    uint code = FA_MIXED;
    if (jt < n_tiles) {
        const uint base = p.m_off + (plane / p.nem2) * p.m_nb3 + (plane % p.nem2) * p.m_nb2;
        const uint rows = min(BR, p.N - rt * BR);
        const uint cols = min(BC, p.KV - jt * BC);
        bool neg_inf = true;
        bool zero = true;
        for (uint r = 0; r < rows && (neg_inf || zero); ++r) {
            const uint e = base + (rt * BR + r) * p.m_nb1 + jt * BC;
            for (uint c = 0; c < cols; ++c) {
                const uint bits = attn_half_bits(m_u32, e + c);
                neg_inf = neg_inf && bits == 0xFC00u;
                zero = zero && (bits & 0x7FFFu) == 0u;
            }
        }
        code = neg_inf ? FA_ALL_NEG_INF : (zero ? FA_ALL_ZERO : FA_MIXED);
    }
    atomicOr(words[t / 16u], code << (2u * (t % 16u)));
    barrier();
    const uint w = jt / 16u;
    if (t % 16u == 0u && w < stride) {
        mo[(plane * gl_NumWorkGroups.y + rt) * stride + w] = words[t / 16u];
    }
}
