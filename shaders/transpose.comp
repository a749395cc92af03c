#version 450
// Batched tiled transpose: dst[i3][i2][i0][i1] = src[i3][i2][i1][i0], 16- or 32-bit elements.
// Workgroup (TILE, rows); the grid is (tiles along ne0, tiles along ne1, ne2 * ne3), each axis
// capped at the device limit and walked in strides beyond it. Strides/offsets in elements.
// Defines: TILE, BITS, STORAGE16.
#include "common.glsl"
#include "elements.glsl"

layout(local_size_x_id = 0, local_size_y_id = 1) in;

layout(binding = 0) readonly buffer Src { RAW_T(BITS) tsrc[]; };
layout(binding = 1) WRITEONLY(BITS) buffer Dst { RAW_T(BITS) tdst[]; };

#include "transpose_tile.glsl"

layout(push_constant) uniform Push {
    uint ne0;
    uint ne1;
    uint ne2;
    uint nbatch;
    uint src_nb[4];
    uint dst_nb[4];
    uint src_off;
    uint dst_off;
} p;

void main() {
    for (uint b = gl_WorkGroupID.z; b < p.nbatch; b += gl_NumWorkGroups.z) {
        const uint i2 = b % p.ne2, i3 = b / p.ne2;
        const uint src_base = p.src_off + i2 * p.src_nb[2] + i3 * p.src_nb[3];
        const uint dst_base = p.dst_off + i2 * p.dst_nb[2] + i3 * p.dst_nb[3];
        for (uint ty = gl_WorkGroupID.y; ty * TILE < p.ne1; ty += gl_NumWorkGroups.y) {
            for (uint tx = gl_WorkGroupID.x; tx * TILE < p.ne0; tx += gl_NumWorkGroups.x) {
                transpose_tile(tx * TILE, ty * TILE, p.ne0, p.ne1, src_base, p.src_nb[1], dst_base, p.dst_nb[1]);
            }
        }
    }
}
