#version 450
// A grammar's token mask applied in place to rows of logits: a token whose bit is clear gets
// -inf. The table starts with one flag a row (0: the row is left as it is), then `words` mask
// words a row, bit t % 32 of word t / 32 for token t (llguidance's bitmask layout). One
// invocation a mask word; a word with every bit set is skipped.
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
    uint words;   // mask words a row
} p;

void main() {
    const uint r = gl_WorkGroupID.y;
    const uint w = gl_GlobalInvocationID.x;
    if (w >= p.words || a[p.a_off + r] == 0u) {
        return;
    }
    const uint bits = a[p.a_off + p.rows + r * p.words + w];
    if (bits == 0xFFFFFFFFu) {
        return;
    }
    const uint row = p.x_off + r * p.x_row;
    const float neg_inf = uintBitsToFloat(0xFF800000u);
    for (uint b = 0u; b < 32u; ++b) {
        const uint t = w * 32u + b;
        if (t < p.n && (bits & (1u << b)) == 0u) {
            x[row + t] = neg_inf;
        }
    }
}
