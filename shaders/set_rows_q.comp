#version 450
// Scatter rows into a quantised KV cache: cache row idx[t] of head h = src[:, h, t] quantised
// (kv_quant.glsl's KVQ_TYPE, as ggml's reference quantisers). src f32 [ne0, n_head, n_tokens];
// the cache's rows addressed in bytes as d_off + idx[t] * d_s1 + h * d_s2. One invocation a
// block; a block of 2-byte alignment shares its first or last word with its neighbour's, whose
// own bytes those words keep (kv_quant.glsl's KVQ_STORE_BLOCK).
#include "common.glsl"

layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer Src { float src[]; };
layout(binding = 1) readonly buffer Idx { int idx[]; };
layout(binding = 2) buffer Dst { uint dst[]; };

#define QBUF dst
#include "kv_quant.glsl"

layout(push_constant) uniform Push {
    uint ne0;
    uint n_head;
    uint n_tokens;
    uint s_off;
    uint s_s1;
    uint s_s2;
    uint idx_off;
    uint d_off;
    uint d_s1;
    uint d_s2;
} p;

void main() {
    const uint blocks = p.ne0 / 32u;
    const uint i = global_index();
    if (i >= blocks * p.n_head * p.n_tokens) {
        return;
    }
    const uint g = i % blocks;
    const uint h = (i / blocks) % p.n_head;
    const uint t = i / (blocks * p.n_head);
    const uint s = p.s_off + h * p.s_s1 + t * p.s_s2 + 32u * g;
    float x[32];
    [[unroll]] for (uint j = 0u; j < 32u; ++j) {
        x[j] = src[s + j];
    }
    const uint b0 = p.d_off + uint(idx[p.idx_off + t]) * p.d_s1 + h * p.d_s2 + g * kvq_bytes(KVQ_TYPE);
    KVQ_STORE_BLOCK(dst, KVQ_TYPE, x, b0)
}
