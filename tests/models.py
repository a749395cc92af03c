"""The tiny generated models the model tests run (and scripts/record_llama_reference.py records)."""

from __future__ import annotations

import os

from gguf import GGUFValueType

from vkrt.model.synthetic import SyntheticSpec, write_model

F32 = GGUFValueType.FLOAT32

TINY = {
    "tiny-llama": SyntheticSpec(arch="llama", seed=1),
    "tiny-qwen2": SyntheticSpec(arch="qwen2", seed=2),
    "tiny-qwen3": SyntheticSpec(arch="qwen3", seed=3),
    "tiny-gemma3": SyntheticSpec(arch="gemma3", head_dim=32, sliding_window=8, n_layer=6, seed=4),
    "tiny-qwen3moe": SyntheticSpec(arch="qwen3moe", n_ff=0, n_expert=8, n_expert_used=2, n_ff_expert=64, seed=5),
    "tiny-qwen2moe": SyntheticSpec(arch="qwen2moe", n_ff=0, n_expert=8, n_expert_used=2, n_ff_expert=32,
                                   n_ff_shared=64, seed=6),
    # Mixtral-style: arch llama with routed experts (expert_count > 0)
    "tiny-mixtral": SyntheticSpec(arch="llama", n_ff=0, n_expert=4, n_expert_used=2, n_ff_expert=64, seed=11),
    # the IQ quants and MXFP4 on the attention / FFN / expert matrices (rows of 256 elements: their
    # block); every type once. Not TQ1_0/TQ2_0: llama.cpp's answers for them were up to 0.63 off in
    # log-probability where ours equal the F32 twin's (test_iq_model.py), so they are no reference
    **{name: SyntheticSpec(arch=arch, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, weight_type=wtype, seed=seed,
                           **(dict(n_ff=0, n_expert=4, n_expert_used=2, n_ff_expert=256, expert_type=ftype)
                              if arch == "qwen3moe" else dict(n_ff=512, ffn_type=ftype)))
       for name, arch, wtype, ftype, seed in (
           ("tiny-iq4xs", "llama", "IQ4_XS", "IQ2_XXS", 12), ("tiny-iq3xxs", "qwen3", "IQ3_XXS", "IQ2_S", 13),
           ("tiny-iq2xs", "llama", "IQ2_XS", "IQ1_M", 14),
           ("tiny-iq-moe", "qwen3moe", "IQ3_S", "IQ1_S", 16), ("tiny-mxfp4-moe", "qwen3moe", "IQ4_NL", "MXFP4", 17))},
    # gpt-oss: attention biases and sinks, sliding (window 8) and full layers in turn, YaRN as the
    # real files' (base 150000, factor 32 over 4096), MXFP4 experts with biases, the o200k regex
    "tiny-gpt-oss": SyntheticSpec(arch="gpt-oss", n_layer=4, n_ff=64, n_expert=8, n_expert_used=2, n_ff_expert=64,
                                  expert_type="MXFP4", sliding_window=8, rope_base=150000.0, rope_scaling="yarn",
                                  rope_scaling_factor=32.0, rope_orig_ctx=4096, tokenizer_pre="gpt-4o", seed=18),
    # OLMoE: q/k norms over the whole projections (n_head_kv = n_head, as llama.cpp's k norm of
    # n_embd needs), 8 experts, 2 chosen without renormalisation
    "tiny-olmoe": SyntheticSpec(arch="olmoe", n_head_kv=4, n_ff=0, n_expert=8, n_expert_used=2, n_ff_expert=32,
                                tokenizer_pre="olmo", seed=30),
    # Granite 3.x, tied output; multipliers that each move these random weights' logits by more
    # than 0.1 (the real files' 12 / 0.22 / 1/head_dim barely move them through tiny blocks)
    "tiny-granite": SyntheticSpec(arch="granite", embedding_scale=3.0, residual_scale=0.4, attention_scale=1.0,
                                  logit_scale=8.0, tokenizer_pre="refact", seed=31),
    # Granite MoE with the shared expert of GraniteMoeShared (added to the routed experts' sum)
    "tiny-granitemoe": SyntheticSpec(arch="granitemoe", n_ff=0, n_expert=4, n_expert_used=2, n_ff_expert=32,
                                     n_ff_shared=64, embedding_scale=3.0, residual_scale=0.4,
                                     attention_scale=1.0, logit_scale=6.0, tokenizer_pre="refact", seed=32),
    # Qwen3.5: DeltaNet layers (16-dim heads, 2 q/k and 4 v heads, conv 4) between gated full
    # attention (32-dim heads, a quarter rotated by IMROPE with sections 2/1/1/0)
    **{name: SyntheticSpec(arch=arch, n_layer=4, head_dim=32, rope_dims=8, full_attention_interval=interval,
                           ssm_head_dim=16, weight_type=wtype, seed=seed, tokenizer_pre="qwen35",
                           **(dict(n_ff=0, n_expert=8, n_expert_used=2, n_ff_expert=32, n_ff_shared=32)
                              if arch == "qwen35moe" else {}))
       for name, arch, wtype, interval, seed in (
           ("tiny-qwen35moe", "qwen35moe", "Q8_0", 4, 7), ("tiny-qwen35moe-f16", "qwen35moe", "F16", 4, 8),
           ("tiny-qwen35", "qwen35", "Q8_0", 2, 9), ("tiny-qwen35-f32", "qwen35", "F32", 2, 10))},
    # Qwen3-Next: qwen35moe's blocks with NEOX RoPE on a quarter of the head and the DeltaNet
    # tensors grouped by key head (2 key heads, 4 value heads: value head j reads key head j // 2);
    # the older converters' one ssm_in, and the newer ones' attn_qkv / attn_gate
    **{name: SyntheticSpec(arch="qwen3next", n_layer=4, head_dim=32, rope_dims=8, ssm_head_dim=16, n_ff=0,
                           n_expert=8, n_expert_used=2, n_ff_expert=32, n_ff_shared=32, weight_type=wtype,
                           qkvz_fused=fused, tokenizer_pre="qwen2", seed=seed)
       for name, wtype, fused, seed in (("tiny-qwen3next", "Q8_0", True, 40),
                                        ("tiny-qwen3next-qkv", "F16", False, 41))},
    # GLM-4.5-Air / 4.6 (glm4moe): attention biases, half of each 32-dim head rotated (NEOX), q/k
    # norms (4.5 / 4.6; -Air has none), 1 leading dense layer, then 8 sigmoid-routed experts (2
    # chosen by sigmoid + exp_probs_b, renormalised, times 2.5 as GLM-4.6) and a shared expert
    **{name: SyntheticSpec(arch="glm4moe", n_layer=3, head_dim=32, rope_dims=16, n_ff=96, n_expert=8, n_expert_used=2,
                           n_ff_expert=32, n_ff_shared=32, n_dense_lead=1, expert_weights_scale=scale, qk_norm=qk,
                           tokenizer_pre="glm4", seed=seed)
       for name, qk, scale, seed in (("tiny-glm4moe", True, 2.5, 42), ("tiny-glm4moe-air", False, 1.0, 43))},
    # Phi-3 / Phi-4-mini (phi3): fused attn_qkv and gate+up ffn_up, LongRoPE factors (long past a
    # 32-token original context) with the converter's attention factor sqrt(1 + ln(s) / ln(orig))
    "tiny-phi3": SyntheticSpec(arch="phi3", rope_orig_ctx=32, rope_attn_factor=1.19, seed=50,
                               name="vkrt synthetic Phi (LongRoPE)"),
    # Ministral 3 / Mistral Small 3.x text (mistral3): YaRN over a 16-token original context (base
    # 100, so the file's beta_slow 2 moves a correction dim: 2, not the default's 7) and the
    # queries' temperature from position 16 on (the recorded prompts cross its first step)
    "tiny-mistral3": SyntheticSpec(arch="mistral3", rope_scaling="yarn", rope_scaling_factor=4.0, rope_orig_ctx=16,
                                   rope_base=100.0, tokenizer_pre="tekken", seed=51,
                                   extra={"mistral3.attention.temperature_scale": (0.1, F32),
                                                   "mistral3.rope.scaling.yarn_beta_fast": (16.0, F32),
                                                   "mistral3.rope.scaling.yarn_beta_slow": (2.0, F32)}),
    # its experts branch (llama.cpp's mistral3 graph: softmax routing, the chosen renormalised)
    "tiny-mistral3-moe": SyntheticSpec(arch="mistral3", n_ff=0, n_expert=4, n_expert_used=2, n_ff_expert=64,
                                       tokenizer_pre="tekken", seed=53),
}
HYBRID = [n for n in TINY if n.startswith(("tiny-qwen35", "tiny-qwen3next"))]


def tiny_model(name: str, folder) -> str:
    """Write (once) the tiny model `name` into `folder`; returns its path."""
    path = os.path.join(os.fspath(folder), f"{name}.gguf")
    if not os.path.exists(path):
        write_model(path, TINY[name])
    return path
