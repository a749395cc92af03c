// mul_mv.comp's NORM_IN: the residual add and RMS norm the router's mat-vec does first, and
// MOE_SUM's: the RMS norm of the summed expert down projection's output (the residual stream)
// its last workgroup does, both with rms_norm.comp's bits (see mul_mv.comp). Included after its
// bindings, push constants and xn4.
#ifndef VKRT_MV_NORM_IN_GLSL
#define VKRT_MV_NORM_IN_GLSL
#define BUTTERFLY_SG NORM_SG
#include "butterfly.glsl"
#ifdef NORM_IN
#if !defined(ROUTE) || defined(MOE_SUM)
#error "NORM_IN feeds the router's mat-vec: its last workgroup (ROUTE's) stores x + r"
#endif
#else
#if !defined(MOE_SUM) || NC != 1
#error "MOE_SUM normalises the residual stream the summed expert down projection added into"
#endif
#endif
#ifdef MOE_SUM
#define NORM_LEN p.M
#define NORM_SRC(j, c) y_data[nbase + (c)]
#else
#define NORM_LEN p.K
#define NORM_SRC(j, c) XG1(p.n_x_off + (j) * p.n_x_col + (c)) + nr_data[p.n_r_off + (j) * p.n_x_col + (c)]
#endif
// a lane's elements: in each of its NORM_G norm subgroups (this subgroup's index + g * NORM_SUB)
// the norm lane's NORM_E elements, lane + e * NORM_WG
#define NORM_AT(g, e) ((gl_SubgroupID + (g) * NORM_SUB) * NORM_SG + gl_SubgroupInvocationID + (e) * NORM_WG)
shared float n_sums[NC * NORM_VSG];
float n_s[NC * NORM_G * NORM_E];   // x + r of this lane's elements (NORM_IN's last workgroup stores them)
// xn4 = rms_norm(x + r) * w for the NC columns (MOE_SUM: of y from nbase), summed as
// rms_norm.comp's workgroup of NORM_WG invocations sums (NORM_VSG subgroups, each the butterfly
// of its lanes' sums over the elements lane, lane + NORM_WG, ...; then the subgroups' sums in
// order), every load issued first; xn4 is complete for every invocation on return
void norm_rows(uint nbase, uint pf) {
    float wv[NORM_G * NORM_E];
    [[unroll]] for (uint j = 0u; j < NC; j++) {
        [[unroll]] for (uint g = 0u; g < NORM_G; g++) {
            [[unroll]] for (uint e = 0u; e < NORM_E; e++) {
                const uint c = NORM_AT(g, e);
                n_s[(j * NORM_G + g) * NORM_E + e] = c < NORM_LEN ? NORM_SRC(j, c) : 0.0;
                if (j == 0u) {
                    wv[g * NORM_E + e] = c < NORM_LEN ? nw_data[p.n_w_off + c] : 0.0;
                }
            }
        }
    }
    [[unroll]] for (uint j = 0u; j < NC; j++) {
        [[unroll]] for (uint g = 0u; g < NORM_G; g++) {
            precise float sum = 0.0;
            [[unroll]] for (uint e = 0u; e < NORM_E; e++) {
                const float v = n_s[(j * NORM_G + g) * NORM_E + e];
                if (NORM_AT(g, e) < NORM_LEN) {
                    sum += v * v;
                }
            }
            sum = subgroup_butterfly(sum);
            if (subgroupElect()) {
                n_sums[j * NORM_VSG + gl_SubgroupID + g * NORM_SUB] = sum;
            }
        }
    }
    if (pf == 0x9E3779B9u && NORM_LEN == 0u) {   // never: the prefetched words are waited for here
        n_sums[0] = 0.0;
    }
    barrier();
    [[unroll]] for (uint j = 0u; j < NC; j++) {
        float total = 0.0;
        for (uint g = 0u; g < NORM_VSG; g++) {
            total += n_sums[j * NORM_VSG + g];
        }
        // precise, as in rms_norm.comp: the same bits in every kernel
        precise float mean_eps = total / float(NORM_LEN) + p.n_eps;
        const float scale = inversesqrt(mean_eps);
        [[unroll]] for (uint g = 0u; g < NORM_G; g++) {
            [[unroll]] for (uint e = 0u; e < NORM_E; e++) {
                const uint c = NORM_AT(g, e);
                if (c < NORM_LEN) {
                    const float v = n_s[(j * NORM_G + g) * NORM_E + e] * scale;
                    xn4[(j * NORM_LEN + c) >> 2][c & 3u] = v * wv[g * NORM_E + e];
                }
            }
        }
    }
    barrier();
}

#ifdef NORM_IN
// the prologue: xn4 from x + r, then this workgroup's share of the normed x is stored
void norm_prologue(uint wgid, uint pf) {
    norm_rows(0u, pf);
    const uint n = NC * p.K, groups = gl_NumWorkGroups.x * gl_NumWorkGroups.y, span = (n + groups - 1u) / groups;
    for (uint i = wgid * span + gl_LocalInvocationID.x; i < min(n, (wgid + 1u) * span); i += WG) {
        no_data[p.n_o_off + (i / p.K) * p.n_o_col + i % p.K] = xn4[i >> 2][i & 3u];
    }
}

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
