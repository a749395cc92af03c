// A token's routed-expert output at one element: sum_j ew[w_base + j] * ey[y_base + j * n_embd],
// plus es[s_index] * sigmoid(eg[g_index]) with the shared expert (qwen2moe's gated one).
// The including shader declares the buffers ey (experts' outputs), ew (routing weights), es
// (shared expert output) and eg (its gate logits). moe_combine stores it; rms_norm's COMBINE adds
// it to the residual stream -- the same sum, bit for bit.
#ifndef VKRT_MOE_SUM_GLSL
#define VKRT_MOE_SUM_GLSL

// The loads come first, MOE_SUM_CHUNK experts at a time (indices clamped to a valid expert, so
// they need no branch and are all in flight together), then the sum in expert order.
#ifndef MOE_SUM_CHUNK
#define MOE_SUM_CHUNK 8
#endif
float experts_sum(uint y_base, uint w_base, uint n_used, uint n_embd, bool has_shared, uint s_index, uint g_index) {
    float sv = 0.0, g = 0.0;
    if (has_shared) {
        sv = es[s_index];
        g = eg[g_index];
    }
    precise float acc = 0.0;   // no fused multiply-add: the fused down projection (mul_mv_id_sum.comp) sums alike
    for (uint j0 = 0u; j0 < n_used; j0 += MOE_SUM_CHUNK) {
        float wv[MOE_SUM_CHUNK], yv[MOE_SUM_CHUNK];
        [[unroll]] for (uint i = 0u; i < MOE_SUM_CHUNK; i++) {
            const uint j = min(j0 + i, n_used - 1u);
            wv[i] = ew[w_base + j];
            yv[i] = ey[y_base + j * n_embd];
        }
        [[unroll]] for (uint i = 0u; i < MOE_SUM_CHUNK; i++) {
            if (j0 + i < n_used) {
                acc += wv[i] * yv[i];
            }
        }
    }
    if (has_shared) {
        acc += sv / (1.0 + exp(-g));
    }
    return acc;
}

#endif
