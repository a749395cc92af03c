"""The tiny generated models the model tests run (and scripts/record_llama_reference.py records)."""

from __future__ import annotations

import os

from vkrt.model.synthetic import SyntheticSpec, write_model

TINY = {
    "tiny-llama": SyntheticSpec(arch="llama", seed=1),
    "tiny-qwen2": SyntheticSpec(arch="qwen2", seed=2),
    "tiny-qwen3": SyntheticSpec(arch="qwen3", seed=3),
    "tiny-gemma3": SyntheticSpec(arch="gemma3", head_dim=32, sliding_window=8, n_layer=6, seed=4),
    "tiny-qwen3moe": SyntheticSpec(arch="qwen3moe", n_ff=0, n_expert=8, n_expert_used=2, n_ff_expert=64, seed=5),
    "tiny-qwen2moe": SyntheticSpec(arch="qwen2moe", n_ff=0, n_expert=8, n_expert_used=2, n_ff_expert=32,
                                   n_ff_shared=64, seed=6),
}


def tiny_model(name: str, folder) -> str:
    """Write (once) the tiny model `name` into `folder`; returns its path."""
    path = os.path.join(os.fspath(folder), f"{name}.gguf")
    if not os.path.exists(path):
        write_model(path, TINY[name])
    return path
