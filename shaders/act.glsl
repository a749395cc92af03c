// Activations shared by the gated-activation kernel and the mat-vec that fuses it into its
// input loads: ACT_SILU x / (1 + e^-x); ACT_GELU the tanh approximation (as llama.cpp);
// ACT_SIGMOID 1 / (1 + e^-x); ACT_SWIGLU_OAI gpt-oss's (llama.cpp's swiglu_oai): the gate
// x = min(g, 7) gives x / (1 + e^(-1.702 x)), the up value enters as clamp(u, -7, 7) + 1.
// `precise` keeps compilers from contracting these into FMAs differently in the two kernels,
// so the fused and separate paths give the same bits.
#ifndef VKRT_ACT_GLSL
#define VKRT_ACT_GLSL

#define ACT_SILU 0
#define ACT_GELU 1
#define ACT_SIGMOID 2
#define ACT_SWIGLU_OAI 3
#define OAI_ALPHA 1.702   // llama.cpp's graph sets these two for gpt-oss
#define OAI_LIMIT 7.0

float act_fn(float x) {
#if ACT == ACT_SILU
    precise float d = 1.0 + exp(-x);
    precise float r = x / d;
    return r;
#elif ACT == ACT_SWIGLU_OAI
    const float g = min(x, OAI_LIMIT);
    precise float d = 1.0 + exp(OAI_ALPHA * -g);
    precise float r = g / d;
    return r;
#elif ACT == ACT_SIGMOID
    precise float d = 1.0 + exp(-x);
    precise float r = 1.0 / d;
    return r;
#else
    const float c = 0.7978845608028654;  // sqrt(2 / pi)
    precise float inner = c * x * (1.0 + 0.044715 * x * x);
    precise float r = 0.5 * x * (1.0 + tanh(inner));
    return r;
#endif
}

float glu_fn(float g, float u) {
#if ACT == ACT_SWIGLU_OAI
    precise float r = act_fn(g) * (clamp(u, -OAI_LIMIT, OAI_LIMIT) + 1.0);
    return r;
#else
    precise float r = act_fn(g) * u;
    return r;
#endif
}

#endif
