// attn_qk's and attn_qk_vec's operands: Q, K (F16 with K_F16, else F32), the scores, and their
// push constants (after attn_common.glsl)
layout(binding = 0) readonly buffer Q { float q[]; };
#if K_F16
layout(binding = 1) readonly buffer K { uint k_u32[]; };
#define load_k(i) attn_half(k_u32, i)
#else
layout(binding = 1) readonly buffer K { float k_f32[]; };
#define load_k(i) k_f32[i]
#endif
layout(binding = 2) writeonly buffer S { float s[]; };

layout(push_constant) uniform Push {
    uint N; uint KV; uint hsk; uint n_head;
    uint gqa; uint q_off; uint q_nb1; uint q_nb2;
    uint q_nb3; uint k_off; uint k_nb1; uint k_nb2;
    uint k_nb3;
} p;
