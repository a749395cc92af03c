#version 450
// Concat fast path, dim 0, one dispatch: dst (rows x (ctg_cols + trp_cols), contiguous rows)
// gets the contiguous source `ctg` in its columns [ctg_col, ctg_col + ctg_cols) by a plain
// coalesced copy, and the transposed source in its other columns by tiled transposes. The
// transposed source is read as the matrix it is stored as: trp_cols rows of `rows` elements
// at stride trp_row. Workgroups [0, copy_groups) copy a TILE x rows block each; the rest
// each transpose one tile. One dispatch rather than two: the halves write interleaved parts
// of the same rows, so two dispatches would be serialised by a barrier.
// Defines: TILE, BITS, STORAGE16. Strides and offsets in elements.
#include "common.glsl"
#include "elements.glsl"

layout(local_size_x_id = 0, local_size_y_id = 1) in;

layout(binding = 0) readonly buffer Ctg { RAW_T(BITS) ctg[]; };
layout(binding = 1) readonly buffer Trp { RAW_T(BITS) tsrc[]; };
layout(binding = 2) WRITEONLY(BITS) buffer Dst { RAW_T(BITS) tdst[]; };

#include "transpose_tile.glsl"

layout(push_constant) uniform Push {
    uint rows;
    uint ctg_cols;
    uint trp_cols;
    uint trp_row;
    uint dst_row;
    uint ctg_off;
    uint trp_off;
    uint dst_ctg_off;
    uint dst_trp_off;
    uint copy_groups;
    uint copy_col_blocks;
    uint row_tiles;
} p;

void main() {
    const uint g = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (g < p.copy_groups) {
        // one element per invocation, a TILE x rows block per workgroup; no per-element division
        const uint by = g / p.copy_col_blocks;
        const uint c = (g - by * p.copy_col_blocks) * TILE + gl_LocalInvocationID.x;
        const uint r = by * gl_WorkGroupSize.y + gl_LocalInvocationID.y;
        if (c < p.ctg_cols && r < p.rows) {
            STORE(BITS, tdst, p.dst_ctg_off + r * p.dst_row + c, LOAD(BITS, ctg, p.ctg_off + r * p.ctg_cols + c));
        }
        return;
    }
    const uint t = g - p.copy_groups;
    const uint ty = t / p.row_tiles;
    if (ty * TILE >= p.trp_cols) {
        return;  // past the last tile (the grid is folded into rows of at most 65535 groups)
    }
    transpose_tile((t - ty * p.row_tiles) * TILE, ty * TILE, p.rows, p.trp_cols, p.trp_off, p.trp_row,
                   p.dst_trp_off, p.dst_row);
}
