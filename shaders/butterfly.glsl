// The sum of v over a subgroup by a butterfly of shuffles: every lane ends with the same bits,
// and the order of the adds depends on the subgroup size alone (subgroup.glsl's subgroups;
// BUTTERFLY_SG: that size where the includer knows it, else the subgroup's, at most 128).
#ifndef VKRT_BUTTERFLY_GLSL
#define VKRT_BUTTERFLY_GLSL
#include "common.glsl"
#include "subgroup.glsl"
float subgroup_butterfly(float v) {
#ifdef BUTTERFLY_SG
    XOR_SUM(v, BUTTERFLY_SG, sg_shuffle_xor)
#else
    XOR_SUM(v, SG_SIZE, sg_shuffle_xor)
#endif
    return v;
}
#endif
