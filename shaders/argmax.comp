#version 450
// Greedy sampling on the GPU: the index of the largest of n logits (the first on ties; NaN never
// wins; all -inf gives the first). Two passes: with PARTIAL, workgroup g scans elements
// [g * chunk, (g + 1) * chunk) and writes (value bits, index) to part[g]; without, one workgroup
// reduces n_parts partials and writes the index to tok0[t0_off] and tok1[t1_off].
#include "common.glsl"

layout(local_size_x = WG) in;

#ifdef PARTIAL
layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) writeonly buffer P { uvec2 part[]; };
#else
layout(binding = 0) readonly buffer P { uvec2 part[]; };
layout(binding = 1) writeonly buffer T0 { int tok0[]; };
layout(binding = 2) writeonly buffer T1 { int tok1[]; };
#endif

layout(push_constant) uniform Push {
    uint n;        // logits
    uint x_off;    // float offset of the first
    uint chunk;    // elements a partial workgroup scans
    uint n_parts;
    uint t0_off;   // int offsets of the two outputs
    uint t1_off;
} p;

shared float sv[WG];
shared uint si[WG];

bool better(float v, uint i, float bv, uint bi) { return v > bv || (v == bv && i < bi); }

void main() {
    const uint tid = gl_LocalInvocationID.x;
    float bv = uintBitsToFloat(0xFF800000u);   // -inf
    uint bi = 0xFFFFFFFFu;
#ifdef PARTIAL
    const uint g = gl_WorkGroupID.x, start = g * p.chunk, end = min(start + p.chunk, p.n);
    for (uint i = start + tid; i < end; i += WG) {
        const float v = x[p.x_off + i];
        if (better(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    }
#else
    for (uint i = tid; i < p.n_parts; i += WG) {
        const float v = uintBitsToFloat(part[i].x);
        const uint j = part[i].y;
        if (better(v, j, bv, bi)) {
            bv = v;
            bi = j;
        }
    }
#endif
    sv[tid] = bv;
    si[tid] = bi;
    barrier();
    [[unroll]] for (uint i = 0u; i < HALVINGS(WG); ++i) {
        const uint half_ = (WG >> 1u) >> i;
        if (tid < half_ && better(sv[tid + half_], si[tid + half_], sv[tid], si[tid])) {
            sv[tid] = sv[tid + half_];
            si[tid] = si[tid + half_];
        }
        barrier();
    }
    if (tid == 0u) {
#ifdef PARTIAL
        part[g] = uvec2(floatBitsToUint(sv[0]), si[0]);
#else
        tok0[p.t0_off] = int(si[0] == 0xFFFFFFFFu ? 0u : si[0]);
        tok1[p.t1_off] = int(si[0] == 0xFFFFFFFFu ? 0u : si[0]);
#endif
    }
}
