// The sum of v over a subgroup by a butterfly of shuffles: every lane ends with the same bits,
// and the order of the adds depends on the subgroup size alone (subgroup.glsl's subgroups;
// BUTTERFLY_SG: that size where the includer knows it, for a loop the compiler can unroll).
#ifndef VKRT_BUTTERFLY_GLSL
#define VKRT_BUTTERFLY_GLSL
#include "subgroup.glsl"
float subgroup_butterfly(float v) {
#ifdef BUTTERFLY_SG
    [[unroll]] for (uint o = BUTTERFLY_SG >> 1; o > 0u; o >>= 1) {
#else
    for (uint o = SG_SIZE >> 1; o > 0u; o >>= 1) {
#endif
        v += sg_shuffle_xor(v, o);
    }
    return v;
}
#endif
