// The sum of v over a subgroup by a butterfly of shuffles: every lane ends with the same bits,
// and the order of the adds depends on the subgroup size alone (subgroup.glsl's subgroups;
// BUTTERFLY_SG: that size where the includer knows it, for a loop the compiler can unroll).
#ifndef VKRT_BUTTERFLY_GLSL
#define VKRT_BUTTERFLY_GLSL
#include "common.glsl"
#include "subgroup.glsl"
float subgroup_butterfly(float v) {
#ifdef BUTTERFLY_SG
    [[unroll]] for (uint i = 0u; i < HALVINGS(BUTTERFLY_SG); ++i) {
        v += sg_shuffle_xor(v, (BUTTERFLY_SG >> 1u) >> i);
    }
#else
    for (uint o = SG_SIZE >> 1; o > 0u; o >>= 1) {
        v += sg_shuffle_xor(v, o);
    }
#endif
    return v;
}
#endif
