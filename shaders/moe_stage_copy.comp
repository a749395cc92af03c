#version 450
// Copies the experts a staging plan lists from an expert stack (typically in imported host
// memory) into their slots of a device buffer: workgroup z is one planned copy, x/y walk the
// expert's units (16 or 4 bytes). Each invocation loads UNROLL units before storing any, so that many
// reads are in flight across a high-latency link.
#include "common.glsl"

layout(local_size_x = WG) in;

#ifdef VEC4
#define UNIT uvec4
#else
#define UNIT uint
#endif

layout(binding = 0) readonly buffer Src { UNIT src[]; };
layout(binding = 1) writeonly buffer Dst { UNIT dst[]; };
layout(binding = 2) readonly buffer Plan { uint plan[]; };

layout(push_constant) uniform Push {
    uint units;       // units per expert
    uint src_off;     // unit offset of expert e0 in Src
    uint src_expert;  // units between experts in Src
    uint e0;          // experts [e0, e1) are in this binding
    uint e1;
    uint dst_off;     // unit offset of slot 0 in Dst
    uint dst_slot;    // units between slots in Dst
    uint plan_off;    // uint offset of the plan
} p;

void main() {
    const uint i = gl_WorkGroupID.z;
    if (i >= plan[p.plan_off]) {
        return;
    }
    const uint e = plan[p.plan_off + 1u + 2u * i], slot = plan[p.plan_off + 2u + 2u * i];
    if (e < p.e0 || e >= p.e1) {
        return;
    }
    const uint first = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * (WG * UNROLL)
                       + gl_LocalInvocationID.x;
    const uint s = p.src_off + (e - p.e0) * p.src_expert, d = p.dst_off + slot * p.dst_slot;
    UNIT v[UNROLL];
    [[unroll]] for (uint i = 0u; i < UNROLL; i++) {
        const uint u = first + i * WG;
        if (u < p.units) {
            v[i] = src[s + u];
        }
    }
    [[unroll]] for (uint i = 0u; i < UNROLL; i++) {
        const uint u = first + i * WG;
        if (u < p.units) {
            dst[d + u] = v[i];
        }
    }
}
