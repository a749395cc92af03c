// mul_mv.comp's NORM_IN: the RMS norm (the router's: with the residual add) a mat-vec does first,
// with rms_norm.comp's bits (see mul_mv.comp). Included after its bindings, push constants and xn4.
#ifndef VKRT_MV_NORM_IN_GLSL
#define VKRT_MV_NORM_IN_GLSL
#define BUTTERFLY_SG NORM_SG
#include "butterfly.glsl"
#if defined(GLU) || defined(MUL_MAT_ID) || defined(HEAD_EPI)
#error "NORM_IN normalises the x of a plain mat-vec (the router's, attention's or an FFN's projections)"
#endif
#ifdef ROUTE
// the router's: x + r (its last workgroup stores the sums over x) and its share of the normed x
#define NORM_ADD 1
#define NORM_PLUS_R(i) + nr_data[i]
#else
#define NORM_PLUS_R(i)
#endif
// a lane's elements: in each of its NORM_G norm subgroups (this subgroup's index + g * NORM_SUB)
// the norm lane's NORM_E elements, lane + e * NORM_WG
#define NORM_AT(g, e) ((gl_SubgroupID + (g) * NORM_SUB) * NORM_SG + gl_SubgroupInvocationID + (e) * NORM_WG)
shared float n_sums[NC * NORM_VSG];
float n_s[NC * NORM_G * NORM_E];   // x (+ r) of this lane's elements (the last workgroup stores x + r)
// xn4 = rms_norm(x (+ r)) * w for the NC columns, summed as rms_norm.comp's workgroup of NORM_WG
// invocations sums (NORM_VSG subgroups, each the butterfly of its lanes' sums over the elements
// lane, lane + NORM_WG, ...; then the subgroups' sums in order), every load issued first; then
// this workgroup's share of the normed x is stored
void norm_prologue(uint wgid, uint pf) {
    float wv[NORM_G * NORM_E];
    [[unroll]] for (uint j = 0u; j < NC; j++) {
        const uint xb = p.n_x_off + j * p.n_x_col, rb = p.n_r_off + j * p.n_x_col;
        [[unroll]] for (uint g = 0u; g < NORM_G; g++) {
            [[unroll]] for (uint e = 0u; e < NORM_E; e++) {
                const uint c = NORM_AT(g, e);
                n_s[(j * NORM_G + g) * NORM_E + e] = c < p.K ? XG1(xb + c) NORM_PLUS_R(rb + c) : 0.0;
                if (j == 0u) {
                    wv[g * NORM_E + e] = c < p.K ? nw_data[p.n_w_off + c] : 0.0;
                }
            }
        }
    }
    [[unroll]] for (uint j = 0u; j < NC; j++) {
        [[unroll]] for (uint g = 0u; g < NORM_G; g++) {
            precise float sum = 0.0;
            [[unroll]] for (uint e = 0u; e < NORM_E; e++) {
                const float v = n_s[(j * NORM_G + g) * NORM_E + e];
                if (NORM_AT(g, e) < p.K) {
                    sum += v * v;
                }
            }
            sum = subgroup_butterfly(sum);
            if (subgroupElect()) {
                n_sums[j * NORM_VSG + gl_SubgroupID + g * NORM_SUB] = sum;
            }
        }
    }
    if (pf == 0x9E3779B9u && p.K == 0u) {   // never (K > 0): the prefetched words are waited for here
        n_sums[0] = 0.0;
    }
    barrier();
    [[unroll]] for (uint j = 0u; j < NC; j++) {
        float total = 0.0;
        for (uint g = 0u; g < NORM_VSG; g++) {
            total += n_sums[j * NORM_VSG + g];
        }
        // precise, as in rms_norm.comp: the same bits in every kernel
        precise float mean_eps = total / float(p.K) + p.n_eps;
        const float scale = inversesqrt(mean_eps);
        [[unroll]] for (uint g = 0u; g < NORM_G; g++) {
            [[unroll]] for (uint e = 0u; e < NORM_E; e++) {
                const uint c = NORM_AT(g, e);
                if (c < p.K) {
                    const float v = n_s[(j * NORM_G + g) * NORM_E + e] * scale;
                    xn4[(j * p.K + c) >> 2][c & 3u] = v * wv[g * NORM_E + e];
                }
            }
        }
    }
    barrier();
#ifdef NORM_ADD
    const uint n = NC * p.K, groups = gl_NumWorkGroups.x * gl_NumWorkGroups.y, span = (n + groups - 1u) / groups;
    for (uint i = wgid * span + gl_LocalInvocationID.x; i < min(n, (wgid + 1u) * span); i += WG) {
        no_data[p.n_o_off + (i / p.K) * p.n_o_col + i % p.K] = xn4[i >> 2][i & 3u];
    }
#endif
}

#ifdef NORM_ADD
// the last workgroup: x + r over x (every workgroup has read x)
void store_sums() {
    [[unroll]] for (uint j = 0u; j < NC; j++) {
        [[unroll]] for (uint g = 0u; g < NORM_G; g++) {
            [[unroll]] for (uint e = 0u; e < NORM_E; e++) {
                const uint c = NORM_AT(g, e);
                if (c < p.K) {
                    ns_data[p.n_s_off + j * p.n_x_col + c] = n_s[(j * NORM_G + g) * NORM_E + e];
                }
            }
        }
    }
}
#endif

#endif
