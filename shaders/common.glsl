// Shared by every kernel: extensions and helpers.
#ifndef VKRT_COMMON_GLSL
#define VKRT_COMMON_GLSL

#extension GL_EXT_control_flow_attributes : enable

// Kernels whose outputs must equal gguf's bit for bit (MXFP4's smallest scales are fp32
// subnormals) keep subnormals where the device can (SPIR-V DenormPreserve, width 32).
#ifdef DENORM_PRESERVE
#extension GL_EXT_spirv_intrinsics : require
spirv_execution_mode(extensions = ["SPV_KHR_float_controls"], capabilities = [4464], 4459, 32);
#endif

// Flat invocation index over a 2-D grid of workgroups (x fastest); large 1-D launches are
// split into rows of at most 65535 workgroups. A macro, not a function: gl_WorkGroupSize
// must be read after the shader's local_size layout, which may follow this include.
#define global_index() \
    ((gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * gl_WorkGroupSize.x + gl_LocalInvocationID.x)

// Steps of a butterfly over n lanes (n a power of two, at most 1024): log2(n). A loop
// `for (uint i = 0u; i < HALVINGS(n); ++i)` over the offsets n >> (i + 1) is one the compilers
// unroll (Mesa 22's NIR unrolls no loop whose counter is shifted); a shuffle in it still takes
// run-time offsets on the RX 580 (see XOR_SUM).
#define HALVINGS(n) ((n) >= 1024u ? 10u : (n) >= 512u ? 9u : (n) >= 256u ? 8u : (n) >= 128u ? 7u : (n) >= 64u ? 6u \
                     : (n) >= 32u ? 5u : (n) >= 16u ? 4u : (n) >= 8u ? 3u : (n) >= 4u ? 2u : (n) >= 2u ? 1u : 0u)

// the least power of two at least n (n at most 256)
#define POW2_CEIL(n) ((n) <= 1u ? 1u : (n) <= 2u ? 2u : (n) <= 4u ? 4u : (n) <= 8u ? 8u : (n) <= 16u ? 16u \
                      : (n) <= 32u ? 32u : (n) <= 64u ? 64u : (n) <= 128u ? 128u : 256u)

// v += SHUF(v, o) for the offsets o = n/2, n/4, ..., 1 (XOR_SUM) or 1, 2, ..., n/2 (XOR_SUM_UP) of a
// butterfly over runs of n lanes (a power of two, at most 128), each offset a literal: Mesa 22's
// RX 580 compiler picks a shuffle's instruction before it unrolls loops, and only a literal
// offset becomes DPP (1, 2, 8) or a swizzle (4, 16) instead of ds_bpermute, an LDS round trip
// with an address register. The same adds in the same order as the loops over HALVINGS(n).
#define XOR_STEP_(v, n, SHUF, o) if ((n) > (o)) { v += SHUF(v, o); }
#define XOR_SUM(v, n, SHUF) { \
    XOR_STEP_(v, n, SHUF, 64u) XOR_STEP_(v, n, SHUF, 32u) XOR_STEP_(v, n, SHUF, 16u) \
    XOR_STEP_(v, n, SHUF, 8u) XOR_STEP_(v, n, SHUF, 4u) XOR_STEP_(v, n, SHUF, 2u) XOR_STEP_(v, n, SHUF, 1u) }
// A reduce-scatter's level of offset o over the H values x[0, H) a lane holds (H a power of two;
// hi: the lane's bit o): with H > M the lane keeps the half hi picks (the upper where set) in
// x[0, H / 2) and adds its partner's copy of that half (H / 2 shuffles where a butterfly a value
// takes H); with M values left, a butterfly step on each. Each sum is a + b of the two lanes'
// values XOR_SUM's level o adds, so the sums keep XOR_SUM's bits. SCATTER_HELD(N, n, o): the
// values a lane holds before level o of a scatter over n lanes that started with N (levels run
// for o from n / 2 down); the _MIN forms stop halving at M values a lane (a power of two <= N).
#define SCATTER_LEVEL_MIN(x, H, M, o, hi, SHUF)                                         \
    if ((H) > (M)) {                                                                    \
        [[unroll]] for (uint i_ = 0u; i_ < (H) / 2u; ++i_) {                            \
            const float keep_ = (hi) ? x[i_ + (H) / 2u] : x[i_];                        \
            const float send_ = (hi) ? x[i_] : x[i_ + (H) / 2u];                        \
            x[i_] = keep_ + SHUF(send_, o);                                             \
        }                                                                               \
    } else {                                                                            \
        [[unroll]] for (uint i_ = 0u; i_ < (H); ++i_) {                                 \
            x[i_] += SHUF(x[i_], o);                                                    \
        }                                                                               \
    }
#define SCATTER_LEVEL(x, H, o, hi, SHUF) SCATTER_LEVEL_MIN(x, H, 1u, o, hi, SHUF)
#define SCATTER_HELD_MIN(N, n, o, M) ((o) < (n) ? max((M), (N) >> (HALVINGS(n) - HALVINGS(o) - 1u)) : (N))
#define SCATTER_HELD(N, n, o) SCATTER_HELD_MIN(N, n, o, 1u)
#define XOR_SUM_UP(v, n, SHUF) { \
    XOR_STEP_(v, n, SHUF, 1u) XOR_STEP_(v, n, SHUF, 2u) XOR_STEP_(v, n, SHUF, 4u) XOR_STEP_(v, n, SHUF, 8u) \
    XOR_STEP_(v, n, SHUF, 16u) XOR_STEP_(v, n, SHUF, 32u) XOR_STEP_(v, n, SHUF, 64u) }

#endif
