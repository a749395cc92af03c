"""What a vision tower takes in VRAM: its weights as VisionEncoder uploads them (vectors as F32)
and the activations of the largest image its projector accepts, the attention scores in query
chunks of at most SCORES_BYTES (the VRAM estimate and --vram-budget count both)."""

from __future__ import annotations

import math

from ..memory import F16
from .gguf_file import GGUFFile
from .vision_config import VisionConfig, vision_config

SCORES_BYTES = 256 << 20   # attention scores held at once (queries in chunks past it)


def query_chunk(n: int, n_head: int) -> int:
    """Queries whose scores over n keys and n_head heads fit SCORES_BYTES (at least one)."""
    return max(1, min(n, SCORES_BYTES // (4 * n * n_head)))


def activation_bytes(vc: VisionConfig, n_patches: int) -> int:
    """Bytes of the encoder's buffers for an image of n_patches patches."""
    n, E = n_patches, vc.n_embd
    merged = n // (vc.n_merge ** 2)
    floats = (3 * vc.patch_size ** 2 * n + 2 * E * n + 4 * n   # patches, learned positions, rope positions
              + 3 * E * n + 3 * E * n + vc.n_ff * n + 2 * E * n   # x, cur, attn; qkv; ffn; q, k
              + query_chunk(n, vc.n_head) * n * vc.n_head         # scores
              + E * vc.n_merge ** 2 * merged + vc.proj_dim * merged)
    return 4 * floats


def encoder_vram(path: str | None) -> int:
    """Bytes of VRAM the tower of the projector at `path` takes at most (0 without one)."""
    if path is None:
        return 0
    with GGUFFile(path, progress=False) as f:
        vc = vision_config(path, f.metadata, f.tensors)
        weights = 0
        for name, t in f.tensors.items():
            if name == "v.position_embd.weight":   # kept on the host, resized there
                continue
            vector = len([d for d in t.ne if d > 1]) <= 1
            weights += 4 * math.prod(t.ne) if vector and t.type is F16 else t.nbytes
    return weights + activation_bytes(vc, vc.max_pixels // vc.patch_size ** 2)
