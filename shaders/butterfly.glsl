// The sum of v over a subgroup by a butterfly of shuffles: every lane ends with the same bits,
// and the order of the adds depends on the subgroup size alone (GL_KHR_shader_subgroup_shuffle;
// BUTTERFLY_SG: that size where the includer knows it, for a loop the compiler can unroll).
#ifndef VKRT_BUTTERFLY_GLSL
#define VKRT_BUTTERFLY_GLSL
float subgroup_butterfly(float v) {
#ifdef BUTTERFLY_SG
    [[unroll]] for (uint o = BUTTERFLY_SG >> 1; o > 0u; o >>= 1) {
#else
    for (uint o = gl_SubgroupSize >> 1; o > 0u; o >>= 1) {
#endif
        v += subgroupShuffleXor(v, o);
    }
    return v;
}
#endif
