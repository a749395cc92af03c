#version 450
// Mixture-of-experts routing for one token per workgroup: p = softmax(logits[:, t]) over the
// n_expert experts; the n_used largest (ties: lower expert id first) go to ids[:, t] and their
// probabilities to weights[:, t], divided by their sum when NORM is set (qwen3moe).
#include "common.glsl"

layout(constant_id = 0) const uint WG = 64;
layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer L { float logits[]; };
layout(binding = 1) writeonly buffer Ids { int ids[]; };
layout(binding = 2) writeonly buffer Wts { float weights[]; };

layout(push_constant) uniform Push {
    uint n_expert;
    uint n_used;
    uint n_tokens;
    uint l_off;
    uint l_col;     // floats between tokens in logits
    uint ids_off;
    uint w_off;
    uint norm;
} p;

shared float red_v[WG];
shared uint red_i[WG];
shared float picked_p[16];

void main() {
    const uint t = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (t >= p.n_tokens) {
        return;
    }
    const uint lid = gl_LocalInvocationID.x;
    const uint base = p.l_off + t * p.l_col;

    // softmax statistics: max, then sum of exp
    float m = -1.0 / 0.0;
    for (uint e = lid; e < p.n_expert; e += WG) {
        m = max(m, logits[base + e]);
    }
    red_v[lid] = m;
    barrier();
    for (uint s = WG / 2; s > 0; s >>= 1) {
        if (lid < s) red_v[lid] = max(red_v[lid], red_v[lid + s]);
        barrier();
    }
    const float mx = red_v[0];
    barrier();
    float sum = 0.0;
    for (uint e = lid; e < p.n_expert; e += WG) {
        sum += exp(logits[base + e] - mx);
    }
    red_v[lid] = sum;
    barrier();
    for (uint s = WG / 2; s > 0; s >>= 1) {
        if (lid < s) red_v[lid] += red_v[lid + s];
        barrier();
    }
    const float total = red_v[0];
    barrier();

    // n_used rounds of argmax over the experts not yet picked
    uint taken_mask_lo = 0u;   // picked experts among this thread's first 32 strided slots
    uint taken_mask_hi = 0u;   // ... and the next 32 (n_expert <= 64 * WG)
    float picked_sum = 0.0;
    for (uint k = 0; k < p.n_used; k++) {
        float best = -1.0 / 0.0;
        uint best_e = 0xFFFFFFFFu;
        uint slot = 0;
        for (uint e = lid; e < p.n_expert; e += WG, slot++) {
            const bool taken = slot < 32 ? ((taken_mask_lo >> slot) & 1u) != 0u : ((taken_mask_hi >> (slot - 32)) & 1u) != 0u;
            const float v = logits[base + e];
            if (!taken && (v > best || (v == best && e < best_e))) {
                best = v;
                best_e = e;
            }
        }
        red_v[lid] = best;
        red_i[lid] = best_e;
        barrier();
        for (uint s = WG / 2; s > 0; s >>= 1) {
            if (lid < s) {
                const float ov = red_v[lid + s];
                const uint oi = red_i[lid + s];
                if (ov > red_v[lid] || (ov == red_v[lid] && oi < red_i[lid])) {
                    red_v[lid] = ov;
                    red_i[lid] = oi;
                }
            }
            barrier();
        }
        const uint chosen = red_i[0];
        const float prob = exp(red_v[0] - mx) / total;
        barrier();
        if (chosen % WG == lid) {
            const uint s = chosen / WG;
            if (s < 32) taken_mask_lo |= 1u << s; else taken_mask_hi |= 1u << (s - 32);
        }
        if (lid == 0) {
            ids[p.ids_off + t * p.n_used + k] = int(chosen);
            picked_p[k] = prob;
        }
        picked_sum += prob;
    }
    barrier();
    if (lid < p.n_used) {
        const float w = picked_p[lid];
        weights[p.w_off + t * p.n_used + lid] = p.norm != 0 ? w / picked_sum : w;
    }
}
