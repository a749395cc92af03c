// Gated DeltaNet gates and norms shared by the recurrent and chunked kernels (vkrt/ops/delta_net.py).
#ifndef VKRT_GDN_GLSL
#define VKRT_GDN_GLSL

// log-decay g = softplus(alpha + dt_bias) * ssm_a (ssm_a = -exp(A_log) < 0, so g <= 0);
// softplus as ggml: x above 20 passes through
float gdn_log_decay(float alpha, float dt_bias, float ssm_a) {
    const float x = alpha + dt_bias;
    const float sp = x > 20.0 ? x : log(1.0 + exp(x));
    return sp * ssm_a;
}

// write strength b = sigmoid(beta)
float gdn_strength(float beta) {
    return 1.0 / (1.0 + exp(-beta));
}

// the factor of an L2 normalisation: 1 / max(||x||, eps), from the sum of squares
float gdn_inv_norm(float sum_sq, float eps) {
    return 1.0 / max(sqrt(sum_sq), eps);
}

#endif
