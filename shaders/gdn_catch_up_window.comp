#version 450
// A DeltaNet catch-up's conv windows (vkrt/ops/gdn_catch_up.py): for each layer, the last TAPS
// inputs of ssm_conv after `count` tokens past the snapshot, window position w = count + j of
// [the snapshot's TAPS inputs, the kept inputs from column `first`]:
//     out[e, j, l] = w < TAPS ? snap[e, w, l] : kept[e, first + w - TAPS, l]
// The span (first, count) is read from a buffer the host writes before each run, so one
// recording serves every span. x: the window's elements (e + j * C), y: the layer.
#include "common.glsl"

layout(local_size_x_id = 0) in;

layout(binding = 0) writeonly buffer Out { float o[]; };
layout(binding = 1) readonly buffer Snap { float snap[]; };
layout(binding = 2) readonly buffer Kept { float kept[]; };
layout(binding = 3) readonly buffer Span { int span[]; };   // (slot, first column, count)

// float offsets and strides
layout(push_constant) uniform Push {
    uint channels; uint taps;
    uint out_off; uint out_s1; uint out_s2;
    uint snap_off; uint snap_s1; uint snap_s2;
    uint kept_off; uint kept_s1; uint kept_s2;
    uint span_off;
} p;

void main() {
    const uint i = gl_GlobalInvocationID.x;
    if (i >= p.channels * p.taps) {
        return;
    }
    const uint e = i % p.channels, j = i / p.channels, l = gl_WorkGroupID.y;
    const uint first = uint(span[p.span_off + 1u]), w = uint(span[p.span_off + 2u]) + j;
    o[p.out_off + e + j * p.out_s1 + l * p.out_s2] = w < p.taps
        ? snap[p.snap_off + e + w * p.snap_s1 + l * p.snap_s2]
        : kept[p.kept_off + e + (first + w - p.taps) * p.kept_s1 + l * p.kept_s2];
}
