#version 450
// In-place logit adjustments (vkrt/engine/logit_adjust.py): logit bias, the repetition /
// frequency / presence penalties and DRY, for the tokens a sampler names. The table starts with
// one count a row, then `cap` entries a row of ENTRY words: token, flags, bias, the scale for a
// positive logit, the scale otherwise, penalty, dry (floats by their bits). Each operation is
// rounded on its own (precise: no fused multiply-add), in the host's order. One workgroup a row;
// a row's tokens are distinct, so no two invocations write one logit.
#include "common.glsl"

layout(local_size_x = WG) in;

layout(binding = 0) buffer X { float x[]; };
layout(binding = 1) readonly buffer A { uint a[]; };

layout(push_constant) uniform Push {
    uint x_off;   // float offset of row 0
    uint x_row;   // floats between rows
    uint n;       // logits a row
    uint a_off;   // word offset of the table
    uint rows;
    uint cap;     // entries a row
} p;

const uint ENTRY = 7u;
const uint BIAS = 1u, SCALE = 2u, PENALTY = 4u, DRY = 8u;

void main() {
    const uint r = gl_WorkGroupID.x;
    const uint count = min(a[p.a_off + r], p.cap);
    for (uint i = gl_LocalInvocationID.x; i < count; i += WG) {
        const uint e = p.a_off + p.rows + (r * p.cap + i) * ENTRY;
        const uint token = a[e];
        if (token >= p.n) {
            continue;
        }
        const uint flags = a[e + 1u];
        const uint xi = p.x_off + r * p.x_row + token;
        precise float v = x[xi];
        if ((flags & BIAS) != 0u) {
            v = v + uintBitsToFloat(a[e + 2u]);
        }
        if ((flags & SCALE) != 0u) {
            v = v * (v > 0.0 ? uintBitsToFloat(a[e + 3u]) : uintBitsToFloat(a[e + 4u]));
        }
        if ((flags & PENALTY) != 0u) {
            v = v - uintBitsToFloat(a[e + 5u]);
        }
        if ((flags & DRY) != 0u) {
            v = v - uintBitsToFloat(a[e + 6u]);
        }
        x[xi] = v;
    }
}
