// A token's routed-expert output at one element: sum_j ew[w_base + j] * ey[y_base + j * n_embd],
// plus es[s_index] * sigmoid(eg[g_index]) with the shared expert (qwen2moe's gated one).
// The including shader declares the buffers ey (experts' outputs), ew (routing weights), es
// (shared expert output) and eg (its gate logits). moe_combine stores it; rms_norm's COMBINE adds
// it to the residual stream -- the same sum, bit for bit.
#ifndef VKRT_MOE_SUM_GLSL
#define VKRT_MOE_SUM_GLSL

float experts_sum(uint y_base, uint w_base, uint n_used, uint n_embd, bool has_shared, uint s_index, uint g_index) {
    precise float acc = 0.0;   // no fused multiply-add: the fused down projection (mul_mv MOE_SUM) sums alike
    for (uint j = 0; j < n_used; j++) {
        acc += ew[w_base + j] * ey[y_base + j * n_embd];
    }
    if (has_shared) {
        const float g = eg[g_index];
        acc += es[s_index] / (1.0 + exp(-g));
    }
    return acc;
}

#endif
