#version 450
// Top-N candidates of each row of logits (workgroup y), in passes: workgroup g takes CH (value, index) pairs -- from
// the logits (FIRST) or from the previous pass's candidates -- sorts them in shared memory (value
// descending, then index ascending; NaN as -inf; missing entries last) and writes its first N.
// Candidates are (value bits, index) pairs; index 0xFFFFFFFF marks an entry past the row.
#include "common.glsl"

layout(local_size_x = WG) in;

#ifdef FIRST
layout(binding = 0) readonly buffer X { float x[]; };
#else
layout(binding = 0) readonly buffer C { uvec2 cin[]; };
#endif
layout(binding = 1) writeonly buffer O { uvec2 cout[]; };

layout(push_constant) uniform Push {
    uint n;       // entries in a row (logits or candidates)
    uint x_off;   // offset of the input: floats (FIRST) or pairs
    uint x_row;   // and between rows (workgroup y is the row)
    uint o_off;   // pair offsets of the output and between its rows
    uint o_row;
} p;

shared float sv[CH];
shared uint si[CH];

bool before(float va, uint ia, float vb, uint ib) { return va > vb || (va == vb && ia < ib); }

void main() {
    const uint tid = gl_LocalInvocationID.x, base = gl_WorkGroupID.x * CH;
    const uint xin = p.x_off + gl_WorkGroupID.y * p.x_row;
    for (uint i = tid; i < CH; i += WG) {
        float v = uintBitsToFloat(0xFF800000u);   // -inf
        uint idx = 0xFFFFFFFFu;
        if (base + i < p.n) {
#ifdef FIRST
            v = x[xin + base + i];
            idx = base + i;
#else
            v = uintBitsToFloat(cin[xin + base + i].x);
            idx = cin[xin + base + i].y;
#endif
            if (isnan(v)) {
                v = uintBitsToFloat(0xFF800000u);
            }
        }
        sv[i] = v;
        si[i] = idx;
    }
    barrier();
    for (uint k = 2u; k <= CH; k <<= 1) {   // bitonic sort, best first
        for (uint j = k >> 1; j > 0u; j >>= 1) {
            for (uint i = tid; i < CH; i += WG) {
                const uint l = i ^ j;
                if (l > i) {
                    const bool first_half = (i & k) == 0u;
                    const bool swap = first_half ? before(sv[l], si[l], sv[i], si[i])
                                                 : before(sv[i], si[i], sv[l], si[l]);
                    if (swap) {
                        const float tv = sv[i];
                        const uint ti = si[i];
                        sv[i] = sv[l];
                        si[i] = si[l];
                        sv[l] = tv;
                        si[l] = ti;
                    }
                }
            }
            barrier();
        }
    }
    for (uint i = tid; i < N; i += WG) {
        cout[p.o_off + gl_WorkGroupID.y * p.o_row + gl_WorkGroupID.x * N + i] = uvec2(floatBitsToUint(sv[i]), si[i]);
    }
}
