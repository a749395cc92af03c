// The RMS norm two mat-vec entries do with rms_norm.comp's bits: mul_mv_route.comp's NORM_IN
// (of x + r, before its dot products) and mul_mv_id_sum.comp's (of the residual stream it added
// into, in its last workgroup). The including entry declares xn4 (the normed rows: NC of
// NORM_LEN floats), nw_data (the norm's weight), the push fields n_w_off and n_eps, NORM_LEN
// and NORM_SRC(j, c), element c of row j of what it norms (norm_rows' nbase in scope), and the
// layout of vkrt/ops/mat_vec.py norm_layout: NORM_WG, NORM_VSG, NORM_SG, NORM_SUB, NORM_G, NORM_E.
#ifndef VKRT_MV_NORM_GLSL
#define VKRT_MV_NORM_GLSL
#define BUTTERFLY_SG NORM_SG
#include "butterfly.glsl"
// a lane's elements: in each of its NORM_G norm subgroups (this subgroup's index + g * NORM_SUB)
// the norm lane's NORM_E elements, lane + e * NORM_WG
#define NORM_AT(g, e) ((sg_id() + (g) * NORM_SUB) * NORM_SG + sg_lane() + (e) * NORM_WG)
shared float n_sums[NC * NORM_VSG];
float n_s[NC * NORM_G * NORM_E];   // this lane's elements (NORM_IN's last workgroup stores x + r)
// xn4 = rms_norm(NORM_SRC) * w for the NC rows (from nbase, where NORM_SRC reads it), summed as
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
            if (sg_elect()) {
                n_sums[j * NORM_VSG + sg_id() + g * NORM_SUB] = sum;
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

#endif
