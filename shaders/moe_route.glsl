// Mixture-of-experts routing of one token by one workgroup (moe_router.comp; mul_mv_route.comp,
// where the last workgroup of the router's mat-vec routes its tokens): p = softmax(logits) over the
// n_expert experts; the n_used largest (ties: lower expert id first) go to ids and their
// probabilities to weights, divided by their sum with mode 1 (qwen3moe); mode 2 weighs them by
// the softmax of the chosen experts' logits alone (gpt-oss). Modes 3 and 4 (glm4moe) gate by
// p = sigmoid(logits) and choose by p + bias (a selection bias an expert); the chosen weigh their
// p, divided by max(sum, 2^-14) with mode 4 (as llama.cpp clamps the sum).
// The first RWG invocations hold EPT experts each (lid, lid + RWG, ...) in registers; each of the
// n_used rounds picks the workgroup's best untaken expert with one barrier: subgroup max/min, then
// a scan over the subgroups' results (SUBGROUPS, NSG subgroups in the workgroup), or a
// shared-memory tree over the WG invocations where the device has no subgroup arithmetic.
// Invocations past RWG (a wider workgroup) hold no expert: they add zeros after the others' sums
// and never win a maximum, so the results are the bits of an RWG-wide workgroup. With
// ROUTE_SUBGROUP (SUBGROUPS, NSG 1, RWG the subgroup size) only one subgroup routes (where
// ROUTE_RUNS), its invocations numbered by their lane, and subgroup barriers stand for the
// workgroup's: the bits of a one-subgroup router in a wider workgroup (the router mat-vec's last
// one, shaders/mul_mv_route.comp). There, with ROUTE_SGS (the workgroup's subgroups) and device
// subgroups, every subgroup routes (ROUTE_PARALLEL): the includer gives each its own tokens, and
// each its own picked_p row.
// The including shader declares WG, RWG, EPT, the buffers and these reads and writes:
//   ROUTE_LOGIT(i), ROUTE_BIAS(i), ROUTE_ID(i, v), ROUTE_WEIGHT(i, v)
#ifndef VKRT_MOE_ROUTE_GLSL
#define VKRT_MOE_ROUTE_GLSL
#ifdef SUBGROUPS
#include "subgroup.glsl"
#define NSH NSG            // one shared entry per subgroup
#else
#define NSH WG
#endif
#ifdef ROUTE_SUBGROUP
#if !defined(SUBGROUPS) || NSG != 1
#error "ROUTE_SUBGROUP routes in one subgroup (SUBGROUPS, NSG 1)"
#endif
#define ROUTE_LID sg_lane()
#define ROUTE_BARRIER() sg_barrier()
#ifdef SG_LOGICAL
// emulated subgroups wait at workgroup barriers: every subgroup routes alike, the first writes
#define ROUTE_RUNS true
#define ROUTE_WRITES (sg_id() == 0u)
#elif defined(ROUTE_SGS)
#define ROUTE_PARALLEL 1
#define ROUTE_RUNS true              // every subgroup routes tokens of its own
#define ROUTE_WRITES true
#else
#define ROUTE_RUNS (sg_id() == 0u)   // the invocations that route (the includer's condition)
#define ROUTE_WRITES true            // and write the results
#endif
#else
#define ROUTE_LID gl_LocalInvocationID.x
#define ROUTE_BARRIER() barrier()
#define ROUTE_RUNS true
#define ROUTE_WRITES true
#endif
#define NONE 0xFFFFFFFFu
#define NEG_INF (-1.0 / 0.0)

// two alternating buffers: a reduction writes one while stragglers may still read the other
shared float sh_v[2][NSH];
shared uint sh_i[2][NSH];
#ifdef ROUTE_PARALLEL
shared float picked_rows[ROUTE_SGS][16];
#define picked_p picked_rows[sg_id()]
#else
shared float picked_p[16];
#endif

// (v, e) beats (bv, be): larger value, ties to the lower expert; NONE loses to any expert
bool beats(float v, uint e, float bv, uint be) {
    return e != NONE && (be == NONE || v > bv || (v == bv && e < be));
}

// The workgroup's best (v, e); every invocation returns it. With SUM the v are added instead.
void reduce(inout float v, inout uint e, const bool sum, uint buf) {
    const uint lid = gl_LocalInvocationID.x;
#ifdef SUBGROUPS
    if (sum) {
        v = sg_add(v);
    } else {
        const float m = sg_max(v);
        e = sg_min(v == m ? e : NONE);
        v = m;
    }
#if NSG > 1   // (one subgroup: every invocation already holds the result)
    if (sg_elect()) {
        sh_v[buf][sg_id()] = v;
        sh_i[buf][sg_id()] = e;
    }
    barrier();
    v = sh_v[buf][0];
    e = sh_i[buf][0];
    for (uint s = 1u; s < sg_count(); s++) {
        if (sum) {
            v += sh_v[buf][s];
        } else if (beats(sh_v[buf][s], sh_i[buf][s], v, e)) {
            v = sh_v[buf][s];
            e = sh_i[buf][s];
        }
    }
#endif
#else
    sh_v[buf][lid] = v;
    sh_i[buf][lid] = e;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1) {
        if (lid < s) {
            const float ov = sh_v[buf][lid + s];
            const uint oi = sh_i[buf][lid + s];
            if (sum) {
                sh_v[buf][lid] += ov;
            } else if (beats(ov, oi, sh_v[buf][lid], sh_i[buf][lid])) {
                sh_v[buf][lid] = ov;
                sh_i[buf][lid] = oi;
            }
        }
        barrier();
    }
    v = sh_v[buf][0];
    e = sh_i[buf][0];
#endif
}

// Route the token whose logits start at ROUTE_LOGIT(base): its ids at ROUTE_ID(dst + k), weights
// at ROUTE_WEIGHT(dst + k), k < n_used; the selection bias (modes 3, 4) at ROUTE_BIAS(b_off + e).
// Call from uniform control flow (ROUTE_SUBGROUP: the routing subgroup's).
void route_token(uint base, uint dst, uint n_expert, uint n_used, uint mode, uint b_off) {
    const uint lid = ROUTE_LID;
    const bool holds = lid < RWG;
    const bool sig = mode >= 3u;
    float v[EPT];
    float gp[EPT];   // sigmoid gating: each expert's probability (v holds it plus the selection bias)
    float m = NEG_INF;
    [[unroll]] for (uint i = 0u; i < EPT; i++) {
        const uint e = lid + i * RWG;
        const bool mine = holds && e < n_expert;
        v[i] = mine ? ROUTE_LOGIT(base + e) : NEG_INF;
        gp[i] = 0.0;
        if (sig && mine) {
            gp[i] = 1.0 / (1.0 + exp(-v[i]));
            v[i] = gp[i] + ROUTE_BIAS(b_off + e);
        }
        m = max(m, v[i]);
    }
    uint any_e = lid;   // the max needs only the value; any expert id keeps beats() honest
    reduce(m, any_e, false, 0u);
    float total = 0.0;
    [[unroll]] for (uint i = 0u; i < EPT; i++) {
        if (holds && lid + i * RWG < n_expert) {
            total += exp(v[i] - m);
        }
    }
    reduce(total, any_e, true, 1u);

    uint taken = 0u;   // bit i: expert lid + i * RWG is picked
    float picked_sum = 0.0;
    for (uint k = 0u; k < n_used; k++) {
        float best = NEG_INF;
        uint best_e = NONE;
        [[unroll]] for (uint i = 0u; i < EPT; i++) {
            const uint e = lid + i * RWG;
            if (holds && e < n_expert && (taken & (1u << i)) == 0u && beats(v[i], e, best, best_e)) {
                best = v[i];
                best_e = e;
            }
        }
        reduce(best, best_e, false, k & 1u);
        if (best_e % RWG == lid) {
            taken |= 1u << (best_e / RWG);
            if (sig && ROUTE_WRITES) {
                [[unroll]] for (uint i = 0u; i < EPT; i++) {
                    if (lid + i * RWG == best_e) {
                        picked_p[k] = gp[i];
                    }
                }
            }
        }
        const float prob = mode == 2u ? exp(best - m) : exp(best - m) / total;
        if (lid == 0u && ROUTE_WRITES) {
            ROUTE_ID(dst + k, int(best_e));
            if (!sig) {
                picked_p[k] = prob;
            }
        }
        picked_sum += prob;
    }
    ROUTE_BARRIER();
    if (sig) {
        picked_sum = 0.0;
        for (uint j = 0u; j < n_used; j++) {
            picked_sum += picked_p[j];
        }
        picked_sum = max(picked_sum, 6.103515625e-5);
    }
    for (uint j = lid; ROUTE_WRITES && j < n_used; j += RWG) {
        const float w = picked_p[j];
        ROUTE_WEIGHT(dst + j, mode == 0u || mode == 3u ? w : w / picked_sum);
    }
    ROUTE_BARRIER();   // picked_p is read before the next token's rounds write it
}

#endif
