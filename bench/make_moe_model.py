"""Write a random-weight GGUF with the layer shapes of Qwen3-30B-A3B (hidden 2048, 128 experts,
8 used, expert FFN 768, head 128, 32 query / 4 KV heads): deterministic, valid tokenizer
metadata, loadable by llama.cpp and vkrt.

    python bench/make_moe_model.py OUT.gguf [--layers 48] [--type Q4_0|Q4_K] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import time

from vkrt.model.synthetic import SyntheticSpec, write_model


def qwen3_30b_a3b(layers: int, qtype: str, seed: int = 0) -> SyntheticSpec:
    return SyntheticSpec(arch="qwen3moe", n_layer=layers, n_embd=2048, n_head=32, n_head_kv=4, head_dim=128, n_ff=0,
                         n_ctx=40960, weight_type=qtype, expert_type=qtype, n_expert=128, n_expert_used=8,
                         n_ff_expert=768, seed=seed, random_blocks=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--type", default="Q4_0", choices=["Q4_0", "Q4_K", "Q8_0"])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.perf_counter()
    write_model(args.out, qwen3_30b_a3b(args.layers, args.type, args.seed))
    size = os.path.getsize(args.out)
    print(f"wrote {args.out}: {size / 2**30:.2f} GiB, {args.layers} layers, {args.type}, "
          f"{time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
