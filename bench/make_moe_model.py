"""Write a random-weight GGUF with the layer shapes of a real MoE model: deterministic, valid
tokenizer metadata, loadable by llama.cpp and vkrt.

  --shape qwen3-30b-a3b (default): hidden 2048, 48 layers, 128 experts (8 used) of FFN 768,
      attention head 128 with 32 query / 4 KV heads.
  --shape qwen35-35b-a3b: Qwen3.5/3.6-35B-A3B (qwen35moe): hidden 2048, 40 layers = [3 Gated
      DeltaNet + 1 gated full attention] x 10, 256 experts (8 used) of FFN 512 + a shared expert of
      512 on every layer; attention 16 query / 2 KV heads at head 256, a quarter rotated (IMROPE,
      sections 11/11/10/0); DeltaNet 16 q/k heads and 32 v heads of 128, conv 4; vocabulary 248320.
  --shape qwen3-next-80b-a3b: Qwen3-Next-80B-A3B (qwen3next): hidden 2048, 48 layers = [3 Gated
      DeltaNet + 1 gated full attention] x 12, 512 experts (10 used) of FFN 512 + a shared expert of
      512 on every layer; attention 16 query / 2 KV heads at head 256, 64 dims rotated (NEOX, base
      1e7); DeltaNet 16 q/k heads and 32 v heads of 128, conv 4, its projections in one ssm_in and one
      ssm_ba (the published GGUFs' layout); vocabulary 151936.
  --shape glm-4.5-air: GLM-4.5-Air (glm4moe): hidden 4096, 46 layers (the MTP layer past them not
      written), the first with a dense FFN of 10944, then 128 experts (8 used, chosen by sigmoid +
      selection bias) of FFN 1408 + an ungated shared expert of 1408; attention 96 query / 8 KV heads
      of 128 with q/k/v biases, half of each head rotated (NEOX, base 1e6); vocabulary 151552. Rows of
      1408 and 10944 values are not whole 256-value blocks: with --type Q4_K the FFN matrices are Q4_0
      (llama.cpp's quantize also falls back to a 32-value block type there).
  --shape gpt-oss-20b: hidden 2880, 24 layers alternating sliding-window (128) and full attention,
      32 experts (4 used) of FFN 2880 in MXFP4 with biases (whatever --type says: the published
      files' expert type), attention 64 query / 8 KV heads of 64 with sinks, YaRN (factor 32 over
      4096), vocabulary 201088; --type sets the other matrices.

  --expert-type T writes the routed experts in T instead (an "UD"-style file: K-quant attention,
      IQ experts), any type with vkrt kernels whose blocks divide the experts' rows.

    python bench/make_moe_model.py OUT.gguf [--shape S] [--layers N] [--type Q4_0|Q4_K|Q8_0|Q4_K_M]
                                   [--expert-type IQ3_XXS] [--seed 0]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time

from vkrt.errors import GGMLTypeError
from vkrt.model.quant_mix import MIXES
from vkrt.model.synthetic import SyntheticSpec, write_model
from vkrt.ops.quant import kernel_type


def qwen3_30b_a3b(layers: int, qtype: str, seed: int = 0) -> SyntheticSpec:
    return SyntheticSpec(arch="qwen3moe", n_layer=layers, n_embd=2048, n_head=32, n_head_kv=4, head_dim=128, n_ff=0,
                         n_ctx=40960, weight_type=qtype, expert_type=qtype, n_expert=128, n_expert_used=8,
                         n_ff_expert=768, seed=seed, random_blocks=True)


def qwen35_35b_a3b(layers: int, qtype: str, seed: int = 0) -> SyntheticSpec:
    return SyntheticSpec(arch="qwen35moe", n_layer=layers, n_embd=2048, n_head=16, n_head_kv=2, head_dim=256,
                         rope_dims=64, rope_base=1e7, rope_sections=(11, 11, 10, 0), n_ff=0, n_ctx=262144,
                         weight_type=qtype, expert_type=qtype, n_expert=256, n_expert_used=8, n_ff_expert=512,
                         n_ff_shared=512, full_attention_interval=4, ssm_conv_kernel=4, ssm_head_dim=128,
                         ssm_k_heads=16, ssm_v_heads=32, pad_vocab_to=248320, tokenizer_pre="qwen35", seed=seed,
                         random_blocks=True)


def qwen3_next_80b_a3b(layers: int, qtype: str, seed: int = 0) -> SyntheticSpec:
    return SyntheticSpec(arch="qwen3next", n_layer=layers, n_embd=2048, n_head=16, n_head_kv=2, head_dim=256,
                         rope_dims=64, rope_base=1e7, n_ff=0, n_ctx=262144, weight_type=qtype, expert_type=qtype,
                         n_expert=512, n_expert_used=10, n_ff_expert=512, n_ff_shared=512, full_attention_interval=4,
                         ssm_conv_kernel=4, ssm_head_dim=128, ssm_k_heads=16, ssm_v_heads=32, qkvz_fused=True,
                         pad_vocab_to=151936, tokenizer_pre="qwen2", seed=seed, random_blocks=True)


def glm_45_air(layers: int, qtype: str, seed: int = 0) -> SyntheticSpec:
    ffn = "Q4_0" if qtype.endswith("_K") else qtype
    return SyntheticSpec(arch="glm4moe", n_layer=layers, n_embd=4096, n_head=96, n_head_kv=8, head_dim=128,
                         rope_dims=64, rope_base=1e6, n_ff=10944, n_ctx=131072, weight_type=qtype, ffn_type=ffn,
                         expert_type=ffn, n_expert=128, n_expert_used=8, n_ff_expert=1408, n_ff_shared=1408,
                         n_dense_lead=1, expert_weights_scale=1.0, pad_vocab_to=151552, tokenizer_pre="glm4",
                         seed=seed, random_blocks=True)


def gpt_oss_20b(layers: int, qtype: str, seed: int = 0) -> SyntheticSpec:
    return SyntheticSpec(arch="gpt-oss", n_layer=layers, n_embd=2880, n_head=64, n_head_kv=8, head_dim=64, n_ff=0,
                         n_ctx=131072, weight_type=qtype, expert_type="MXFP4", n_expert=32, n_expert_used=4,
                         n_ff_expert=2880, sliding_window=128, rope_base=150000.0, rope_scaling="yarn",
                         rope_scaling_factor=32.0, rope_orig_ctx=4096, pad_vocab_to=201088, tokenizer_pre="gpt-4o",
                         seed=seed, random_blocks=True)


SHAPES = {"qwen3-30b-a3b": (qwen3_30b_a3b, 48), "qwen35-35b-a3b": (qwen35_35b_a3b, 40),
          "qwen3-next-80b-a3b": (qwen3_next_80b_a3b, 48), "glm-4.5-air": (glm_45_air, 46),
          "gpt-oss-20b": (gpt_oss_20b, 24)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-30b-a3b")
    ap.add_argument("--layers", type=int, default=None, help="layers (default: the real model's)")
    ap.add_argument("--type", default="Q4_0", choices=["Q4_0", "Q4_K", "Q8_0", "Q4_K_M"],
                    help="the matrices' type, or Q4_K_M: llama.cpp's mix of Q4_K, Q5_K and Q6_K (vkrt/model/quant_mix.py)")
    ap.add_argument("--expert-type", default=None, help="the routed experts' type (default: the shape's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--nextn", type=int, default=0,
                    help="MTP blocks after the trunk (qwen35 shapes: Qwen3.5/3.6 files carry one)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    make, layers = SHAPES[args.shape]
    layers = args.layers or layers
    mix = args.type if args.type in MIXES else ""
    if mix and args.expert_type:
        raise SystemExit(f"--expert-type {args.expert_type} with --type {mix}: the mix sets the experts' types "
                         "too (Q4_K, Q6_K down projections); give one or the other")
    spec = make(layers, "Q4_K" if mix else args.type, args.seed)
    if mix:
        spec = dataclasses.replace(spec, mix=mix)
    if args.expert_type:
        try:
            t = kernel_type(args.expert_type, "--expert-type")
        except GGMLTypeError as e:
            raise SystemExit(str(e)) from None
        if spec.n_ff_expert % t.block_size or spec.n_embd % t.block_size:
            raise SystemExit(f"--expert-type {t.name}: its {t.block_size}-value blocks do not divide the "
                             f"{args.shape} experts' rows ({spec.n_embd} and {spec.n_ff_expert} values)")
        spec = dataclasses.replace(spec, expert_type=t.name)
    if args.nextn:
        spec = dataclasses.replace(spec, n_nextn=args.nextn)
    write_model(args.out, spec)
    size = os.path.getsize(args.out)
    experts = "as the mix" if mix else spec.expert_type
    print(f"wrote {args.out}: {size / 2**30:.2f} GiB, {args.shape}, {layers} layers, {args.type}, "
          f"experts {experts}, {args.nextn} MTP block(s), {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
