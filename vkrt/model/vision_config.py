"""The hyperparameters of a llama.cpp vision projector file (mmproj-*.gguf, general.architecture
"clip"), read and checked as tools/mtmd/clip.cpp reads them. vkrt runs the Qwen3-VL / Qwen3.5
tower (clip.projector_type "qwen3vl_merger") without deepstack layers and Gemma 3's SigLIP tower
(clip.projector_type "gemma3")."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import GGUFError

QWEN3VL = "qwen3vl_merger"
GEMMA3 = "gemma3"
SUPPORTED = (QWEN3VL, GEMMA3)
MIN_TOKENS, MAX_TOKENS = 8, 4096   # clip.cpp's image token limits of the Qwen-VL projectors
GEMMA3_MERGE = 4                   # clip.cpp's default pooling kernel of gemma3 (the file may set another)


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
    n_merge: int         # n_merge x n_merge patches make one image token (Qwen: merged, Gemma 3: pooled)
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

    def token_grid(self, height: int, width: int) -> tuple[int, int]:
        """(rows, columns) of image tokens an input of height x width pixels gives."""
        return height // self.align, width // self.align

    @property
    def fixed_size(self) -> bool:
        """Every image is resized to image_size x image_size (Gemma 3), not sized to fit its area."""
        return self.projector == GEMMA3

    @property
    def bidirectional(self) -> bool:
        """The text model reads an image's rows with attention among all of them, not causal
        (mtmd_decode_use_non_causal: Gemma 3)."""
        return self.projector == GEMMA3


def _get(meta: dict, path: str, key: str, kind=int):
    if key not in meta:
        raise GGUFError(f"{path}: the vision projector lacks {key}")
    return kind(meta[key])


def _tensor(path: str, tensors: dict, name: str):
    t = tensors.get(name)
    if t is None:
        raise GGUFError(f"{path}: tensor {name} is missing")
    return t


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
    v = "clip.vision."
    n_embd, n_head = _get(meta, path, v + "embedding_length"), _get(meta, path, v + "attention.head_count")
    if n_head < 1 or n_embd % n_head or (n_embd // n_head) % 4:
        raise GGUFError(f"{path}: {v}embedding_length {n_embd} over {v}attention.head_count {n_head} must give a "
                        "head size that is a multiple of 4")
    mean, std = tuple(_get(meta, path, v + "image_mean", list)), tuple(_get(meta, path, v + "image_std", list))
    if len(mean) != 3 or len(std) != 3:
        raise GGUFError(f"{path}: {v}image_mean and {v}image_std must hold 3 values, got {mean} / {std}")
    pos = _tensor(path, tensors, "v.position_embd.weight")
    side = math.isqrt(pos.ne[1])
    if side * side != pos.ne[1] or pos.ne[0] != n_embd:
        raise GGUFError(f"{path}: v.position_embd.weight has shape {list(pos.ne)}, expected [{n_embd}, a square]")
    common = dict(path=path, projector=proj, n_embd=n_embd, n_ff=_get(meta, path, v + "feed_forward_length"),
                  n_layer=_get(meta, path, v + "block_count"), n_head=n_head,
                  patch_size=_get(meta, path, v + "patch_size"), image_size=_get(meta, path, v + "image_size"),
                  eps=float(meta.get(v + "attention.layer_norm_epsilon", 1e-6)),
                  mean=tuple(float(m) for m in mean), std=tuple(float(s) for s in std), n_pos_side=side)
    if proj == GEMMA3:
        return _gemma3(meta, tensors, common)
    deep = meta.get("clip.vision.is_deepstack_layers") or []
    if any(deep):
        raise GGUFError(f"{path}: clip.vision.is_deepstack_layers marks {sum(map(bool, deep))} deepstack layer(s) "
                        "(Qwen3-VL); vkrt runs towers without deepstack features (Qwen3.5 / 3.6)")
    merge = int(meta.get(v + "spatial_merge_size", 2))
    align2 = (common["patch_size"] * merge) ** 2
    return VisionConfig(**common, n_merge=merge, proj_dim=int(_tensor(path, tensors, "mm.2.bias").ne[0]),
                        min_pixels=int(meta.get(v + "image_min_pixels", MIN_TOKENS * align2)),
                        max_pixels=int(meta.get(v + "image_max_pixels", MAX_TOKENS * align2)))


def _gemma3(meta: dict, tensors: dict, common: dict) -> VisionConfig:
    """Gemma 3: square images of image_size, the learned positions one a patch (no resize), the
    patch grid average-pooled by n_merge (clip.vision.projector.scale_factor, default 4) and
    projected by mm.input_projection.weight ([text width, tower width])."""
    path, size, patch, side = common["path"], common["image_size"], common["patch_size"], common["n_pos_side"]
    merge = int(meta.get("clip.vision.projector.scale_factor", GEMMA3_MERGE))
    if merge < 1 or size % (patch * merge):
        raise GGUFError(f"{path}: clip.vision.image_size {size} is not a multiple of patch_size {patch} x the "
                        f"pooling {merge} (clip.vision.projector.scale_factor)")
    if side != size // patch:
        raise GGUFError(f"{path}: v.position_embd.weight holds {side} x {side} positions, but image_size {size} over "
                        f"patch_size {patch} makes {size // patch} x {size // patch} patches")
    proj = _tensor(path, tensors, "mm.input_projection.weight")
    if len(proj.ne) < 2 or proj.ne[1] != common["n_embd"]:
        raise GGUFError(f"{path}: mm.input_projection.weight has shape {list(proj.ne)}, expected "
                        f"[the text width, {common['n_embd']}]")
    return VisionConfig(**common, n_merge=merge, proj_dim=int(proj.ne[0]), min_pixels=size * size,
                        max_pixels=size * size)


def check_against_text(vc: VisionConfig, n_embd: int, text_path: str, text_arch: str | None = None,
                       mrope: bool | None = None) -> None:
    """The projector must give rows as wide as the text model's embeddings, and belong to its
    kind of model: a Qwen-VL projector to a text model with M-RoPE (`mrope`), a Gemma 3 one to
    architecture gemma3 (`text_arch`); None skips that check."""
    what = "mm.input_projection.weight (the projection width)" if vc.projector == GEMMA3 else \
        "mm.2.bias (the projection width)"
    if vc.proj_dim != n_embd:
        raise GGUFError(f"{vc.path}: {what} is {vc.proj_dim} but the text model "
                        f"{text_path} has embedding_length {n_embd}: the projector belongs to another model")
    if vc.projector == GEMMA3 and text_arch is not None and text_arch != "gemma3":
        raise GGUFError(f"{vc.path}: a gemma3 vision projector goes with a Gemma 3 text model, but {text_path} is "
                        f"{text_arch!r}: the projector belongs to another model")
    if vc.projector == QWEN3VL and mrope is False:
        raise GGUFError(f"{vc.path}: a {QWEN3VL} vision projector goes with a Qwen-VL text model (M-RoPE), but "
                        f"{text_path} ({text_arch or 'its architecture'}) has none: the projector belongs to another "
                        "model")
