// attn_pv's and attn_pv_vec's operands: P (softmaxed scores), V (F16 with V_F16, else F32), the
// output, and their push constants (after attn_common.glsl)
layout(binding = 0) readonly buffer P { float prob[]; };
#if V_F16
layout(binding = 1) readonly buffer V { uint v_u32[]; };
#define load_v(i) attn_half(v_u32, i)
#else
layout(binding = 1) readonly buffer V { float v_f32[]; };
#define load_v(i) v_f32[i]
#endif
layout(binding = 2) writeonly buffer O { float o[]; };

layout(push_constant) uniform Push {
    uint N; uint KV; uint hsv; uint n_head;
    uint gqa; uint v_off; uint v_nb1; uint v_nb2;
    uint v_nb3; uint o_off;
} p;
