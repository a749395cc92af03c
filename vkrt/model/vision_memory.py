"""What a vision tower takes in VRAM: its weights as the towers upload them (vectors as F32, the
Qwen-VL position table kept on the host, Gemma 3's input projection transposed: vision_weights)
and the buffers of the largest image its projector accepts (vision_run: a tower holds one image
size's; attention is flash attention, no scores held) -- the VRAM estimate and --vram-budget
count both."""

from __future__ import annotations

import math

from ..memory import F16
from .gguf_file import GGUFFile
from .vision_config import GEMMA3, VisionConfig, vision_config
from .vision_ops import padded_head
from .vision_weights import is_vector, transposed_bytes


def activation_bytes(vc: VisionConfig, n_patches: int, device=None) -> int:
    """Bytes of the encoder's buffers for an image of n_patches patches (on `device`: with the
    padded heads where its attention pads them, vision_ops.padded_head)."""
    n, E = n_patches, vc.n_embd
    merged = n // (vc.n_merge ** 2)
    head = padded_head(device, vc.head_dim, n) if device is not None else vc.head_dim
    padded = 4 * head * vc.n_head * n if head != vc.head_dim else 0   # q, k, v, out
    if vc.projector == GEMMA3:   # patches; x, cur, attn, q, k, v; ffn; pooled, normed; out
        return 4 * (3 * vc.patch_size ** 2 * n + 6 * E * n + vc.n_ff * n + 2 * E * merged + vc.proj_dim * merged
                    + padded)
    floats = (3 * vc.patch_size ** 2 * n + 2 * E * n + 4 * n   # patches, learned positions, rope positions
              + 3 * E * n + 3 * E * n + vc.n_ff * n + 2 * E * n   # x, cur, attn; qkv; ffn; q, k
              + E * vc.n_merge ** 2 * merged + vc.proj_dim * merged + padded)
    return 4 * floats


def encoder_vram(path: str | None, device=None) -> int:
    """Bytes of VRAM the tower of the projector at `path` takes at most (0 without one) on `device`."""
    if path is None:
        return 0
    with GGUFFile(path, progress=False) as f:
        vc = vision_config(path, f.metadata, f.tensors)
        weights = 0
        for name, t in f.tensors.items():
            if name == "v.position_embd.weight" and vc.projector != GEMMA3:   # kept on the host, resized there
                continue
            if name == "mm.input_projection.weight":   # transposed on the host (vision_weights)
                weights += transposed_bytes(t)
                continue
            weights += 4 * math.prod(t.ne) if is_vector(t.ne) and t.type is F16 else t.nbytes
    return weights + activation_bytes(vc, vc.max_pixels // vc.patch_size ** 2, device)
