// One TILE x TILE tile of a 2-D transpose through shared memory, for a (TILE, rows) workgroup.
//
// The including shader defines TILE, BITS and the buffers `tsrc` (readonly) and `tdst`. The
// source matrix has ne0 x ne1 elements (rows of ne0 at stride src_row); the destination gets
// ne1 x ne0 (rows of ne1 at stride dst_row), dst[j1][j0] = src[j0][j1]. Reads walk source rows
// and writes walk destination rows, so both are coalesced along x; the tile row is padded by
// one element so that reading a tile column hits TILE different banks.
#ifndef VKRT_TRANSPOSE_TILE_GLSL
#define VKRT_TRANSPOSE_TILE_GLSL

shared uint tile[TILE][TILE + 1];

// (x0, y0): the tile's first element in source coordinates (i0, i1)
void transpose_tile(uint x0, uint y0, uint ne0, uint ne1, uint src_base, uint src_row, uint dst_base, uint dst_row) {
    const uint lx = gl_LocalInvocationID.x;
    const uint i0 = x0 + lx;
    for (uint k = gl_LocalInvocationID.y; k < TILE; k += gl_WorkGroupSize.y) {
        const uint i1 = y0 + k;
        if (i0 < ne0 && i1 < ne1) {
            tile[k][lx] = LOAD(BITS, tsrc, src_base + i1 * src_row + i0);
        }
    }
    barrier();
    const uint j0 = y0 + lx;
    for (uint k = gl_LocalInvocationID.y; k < TILE; k += gl_WorkGroupSize.y) {
        const uint j1 = x0 + k;
        if (j0 < ne1 && j1 < ne0) {
            STORE(BITS, tdst, dst_base + j1 * dst_row + j0, tile[lx][k]);
        }
    }
    barrier();  // the tile is reused by the workgroup's next iteration
}

#endif
