#version 450
// Where a decode step reads each chosen expert of a host-resident MoE layer, and which experts
// must come over the link. Per layer the device keeps a cache of CACHE_SLOTS expert slots
// (least recently used replaced; none when CACHE_SLOTS is 0):
//   state[0]                      step clock of this layer
//   state[1], state[2]            chosen experts found in the cache (hits) and copied (misses)
//   state[3 + e]                  slot holding expert e, or -1        (e < n_expert)
//   state[3 + n_expert + s]       expert in slot s, or -1              (s < CACHE_SLOTS)
//   state[3 + n_expert + C + s]   clock value of slot s's last use
// A chosen expert in the cache is read from its slot (a hit). A miss takes the least recently
// used slot not read this step (its old expert leaves the cache) or, with none left, a staging
// slot (stage_base + i) that caches nothing. Outputs: remap[pair] = the slot each (token, slot)
// pair reads (-1 for an id outside [0, n_expert)); plan[0] = misses, plan[1 + 2i] = expert and
// plan[2 + 2i] = slot to copy it to. Slot numbers only move data: results do not depend on them.
#include "common.glsl"

layout(local_size_x = WG) in;

layout(binding = 0) readonly buffer Ids { int ids[]; };
layout(binding = 1) writeonly buffer Remap { int remap[]; };
layout(binding = 2) writeonly buffer Plan { uint plan[]; };
layout(binding = 3) buffer State { int state[]; };

layout(push_constant) uniform Push {
    uint n_used;
    uint n_tokens;
    uint ids_off;    // int offset of the ids and ints between tokens
    uint ids_tok;
    uint remap_off;  // int offset of the remapped ids (contiguous, n_used per token)
    uint n_expert;
    uint plan_off;   // uint offset of the plan
    uint state_off;  // int offset of this layer's cache state
    uint stage_base; // first staging slot
} p;

shared int dst_of[N_EXPERT];   // 0: not chosen, 1: chosen, then the slot it is read from
#if CACHE_SLOTS > 0
shared int owner[CACHE_SLOTS];
shared int last_use[CACHE_SLOTS];
#endif

void main() {
    const uint tid = gl_LocalInvocationID.x;
    const uint pairs = p.n_used * p.n_tokens;
    const uint map = p.state_off + 3u;
    for (uint e = tid; e < p.n_expert; e += WG) {
        dst_of[e] = 0;
    }
#if CACHE_SLOTS > 0
    const uint own = map + p.n_expert, use = own + CACHE_SLOTS;
    for (uint s = tid; s < CACHE_SLOTS; s += WG) {
        owner[s] = state[own + s];
        last_use[s] = state[use + s];
    }
#endif
    barrier();
    for (uint pair = tid; pair < pairs; pair += WG) {
        const int e = ids[p.ids_off + (pair / p.n_used) * p.ids_tok + pair % p.n_used];
        if (e >= 0 && uint(e) < p.n_expert) {
            dst_of[uint(e)] = 1;
        }
    }
    barrier();
    if (tid == 0u) {
        uint misses = 0u;
#if CACHE_SLOTS > 0
        const int clock = state[p.state_off] + 1;
        state[p.state_off] = clock;
        for (uint e = 0u; e < p.n_expert; e++) {   // hits first: their slots are not replaced
            if (dst_of[e] != 0) {
                const int s = state[map + e];
                if (s >= 0) {
                    dst_of[e] = s;
                    last_use[s] = clock;
                    state[p.state_off + 1u] += 1;
                } else {
                    dst_of[e] = -2;   // a miss, placed below
                }
            }
        }
        for (uint e = 0u; e < p.n_expert; e++) {
            if (dst_of[e] != -2) {
                continue;
            }
            int victim = -1;
            for (int s = 0; s < CACHE_SLOTS; s++) {
                if (last_use[s] != clock && (victim < 0 || last_use[s] < last_use[victim])) {
                    victim = s;
                }
            }
            int dst;
            if (victim >= 0) {
                if (owner[victim] >= 0) {
                    state[map + uint(owner[victim])] = -1;
                }
                owner[victim] = int(e);
                last_use[victim] = clock;
                state[map + e] = victim;
                dst = victim;
            } else {
                dst = int(p.stage_base + misses);   // every slot is read this step: stage only
            }
            dst_of[e] = dst;
            plan[p.plan_off + 1u + 2u * misses] = e;
            plan[p.plan_off + 2u + 2u * misses] = uint(dst);
            misses++;
        }
        state[p.state_off + 2u] += int(misses);
#else
        for (uint e = 0u; e < p.n_expert; e++) {
            if (dst_of[e] != 0) {
                dst_of[e] = int(p.stage_base + misses);
                plan[p.plan_off + 1u + 2u * misses] = e;
                plan[p.plan_off + 2u + 2u * misses] = p.stage_base + misses;
                misses++;
            }
        }
#endif
        plan[p.plan_off] = misses;
    }
    barrier();
#if CACHE_SLOTS > 0
    for (uint s = tid; s < CACHE_SLOTS; s += WG) {
        state[own + s] = owner[s];
        state[use + s] = last_use[s];
    }
#endif
    for (uint pair = tid; pair < pairs; pair += WG) {
        const int e = ids[p.ids_off + (pair / p.n_used) * p.ids_tok + pair % p.n_used];
        remap[p.remap_off + pair] = (e >= 0 && uint(e) < p.n_expert) ? dst_of[uint(e)] : -1;
    }
}
