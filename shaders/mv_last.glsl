// Which workgroup of a mat-vec entry finishes last (mul_mv_route.comp routes there,
// mul_mv_id_sum.comp norms there). The including entry declares wg_count, the counters.
#ifndef VKRT_MV_LAST_GLSL
#define VKRT_MV_LAST_GLSL
shared bool wg_last;
// Whether this is the last of `of` workgroups counted at wg_count[at] to finish: each
// workgroup's rows are stored and made visible before it counts itself, so the last one reads
// them all; it resets the counter (0 between dispatches) for the next dispatch
bool last_workgroup(uint at, uint of) {
    memoryBarrierBuffer();
    barrier();
    if (gl_LocalInvocationID.x == 0u) {
        wg_last = atomicAdd(wg_count[at], 1u) == of - 1u;
    }
    barrier();
    if (wg_last) {
        memoryBarrierBuffer();
        if (gl_LocalInvocationID.x == 0u) {
            wg_count[at] = 0u;
        }
    }
    return wg_last;
}
#endif
