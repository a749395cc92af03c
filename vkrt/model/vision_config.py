"""The hyperparameters of a llama.cpp vision projector file (mmproj-*.gguf, general.architecture
"clip"), read and checked as tools/mtmd/clip.cpp reads them. vkrt runs the Qwen3-VL / Qwen3.5
tower (clip.projector_type "qwen3vl_merger") without deepstack layers."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import GGUFError

QWEN3VL = "qwen3vl_merger"
SUPPORTED = (QWEN3VL,)
MIN_TOKENS, MAX_TOKENS = 8, 4096   # clip.cpp's image token limits of the Qwen-VL projectors


@dataclass(frozen=True)
class VisionConfig:
    path: str
    projector: str
    n_embd: int          # the tower's width
    n_ff: int
    n_layer: int
    n_head: int
    patch_size: int
    image_size: int
    n_merge: int         # spatial merge: n_merge x n_merge patches make one image token
    proj_dim: int        # the width of an image token (the text model's n_embd)
    eps: float
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    min_pixels: int
    max_pixels: int
    n_pos_side: int      # the learned position table is n_pos_side x n_pos_side

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def align(self) -> int:
        """Image sides are multiples of this (a merged patch)."""
        return self.patch_size * self.n_merge


def _get(meta: dict, path: str, key: str, kind=int):
    if key not in meta:
        raise GGUFError(f"{path}: the vision projector lacks {key}")
    return kind(meta[key])


def vision_config(path: str, meta: dict, tensors: dict) -> VisionConfig:
    """The VisionConfig of an opened mmproj file (`meta`: its metadata, `tensors`: name -> TensorInfo
    with `.ne`); GGUFError naming the file and the key for anything vkrt cannot run."""
    arch = meta.get("general.architecture")
    if arch != "clip":
        raise GGUFError(f"{path}: general.architecture is {arch!r}, expected 'clip' "
                        "(a vision projector, mmproj-*.gguf)")
    if not meta.get("clip.has_vision_encoder", False):
        raise GGUFError(f"{path}: clip.has_vision_encoder is not true: the file has no vision encoder")
    proj = meta.get("clip.vision.projector_type", meta.get("clip.projector_type"))
    if proj not in SUPPORTED:
        raise GGUFError(f"{path}: clip.projector_type {proj!r} is not supported (supported: {', '.join(SUPPORTED)})")
    deep = meta.get("clip.vision.is_deepstack_layers") or []
    if any(deep):
        raise GGUFError(f"{path}: clip.vision.is_deepstack_layers marks {sum(map(bool, deep))} deepstack layer(s) "
                        "(Qwen3-VL); vkrt runs towers without deepstack features (Qwen3.5 / 3.6)")
    v = "clip.vision."
    n_embd, n_head = _get(meta, path, v + "embedding_length"), _get(meta, path, v + "attention.head_count")
    if n_head < 1 or n_embd % n_head or (n_embd // n_head) % 4:
        raise GGUFError(f"{path}: {v}embedding_length {n_embd} over {v}attention.head_count {n_head} must give a "
                        "head size that is a multiple of 4")
    patch, merge = _get(meta, path, v + "patch_size"), int(meta.get(v + "spatial_merge_size", 2))
    mean, std = tuple(_get(meta, path, v + "image_mean", list)), tuple(_get(meta, path, v + "image_std", list))
    if len(mean) != 3 or len(std) != 3:
        raise GGUFError(f"{path}: {v}image_mean and {v}image_std must hold 3 values, got {mean} / {std}")
    pos = tensors.get("v.position_embd.weight")
    if pos is None:
        raise GGUFError(f"{path}: tensor v.position_embd.weight is missing")
    side = math.isqrt(pos.ne[1])
    if side * side != pos.ne[1] or pos.ne[0] != n_embd:
        raise GGUFError(f"{path}: v.position_embd.weight has shape {list(pos.ne)}, expected [{n_embd}, a square]")
    out = tensors.get("mm.2.bias")
    if out is None:
        raise GGUFError(f"{path}: tensor mm.2.bias is missing")
    align2 = (patch * merge) ** 2
    return VisionConfig(
        path=path, projector=proj, n_embd=n_embd, n_ff=_get(meta, path, v + "feed_forward_length"),
        n_layer=_get(meta, path, v + "block_count"), n_head=n_head, patch_size=patch,
        image_size=_get(meta, path, v + "image_size"), n_merge=merge, proj_dim=int(out.ne[0]),
        eps=float(meta.get(v + "attention.layer_norm_epsilon", 1e-6)),
        mean=tuple(float(m) for m in mean), std=tuple(float(s) for s in std),
        min_pixels=int(meta.get(v + "image_min_pixels", MIN_TOKENS * align2)),
        max_pixels=int(meta.get(v + "image_max_pixels", MAX_TOKENS * align2)), n_pos_side=side)


def check_against_text(vc: VisionConfig, n_embd: int, text_path: str) -> None:
    """The projector must give rows as wide as the text model's embeddings."""
    if vc.proj_dim != n_embd:
        raise GGUFError(f"{vc.path}: mm.2.bias (the projection width) is {vc.proj_dim} but the text model "
                        f"{text_path} has embedding_length {n_embd}: the projector belongs to another model")
