"""SiglipEncoder: Gemma 3's vision tower (clip.projector_type gemma3) from a llama.cpp mmproj file,
run on the GPU with vkrt's ops as tools/mtmd/models/siglip.cpp builds it: the patch embedding
(the conv of stride patch_size as one matmul over the patches in raster order) and its bias, the
learned positions (one a patch: images are image_size square), pre-norm ViT blocks (LayerNorm,
q / k / v with biases, full attention without positions, GELU MLP), the post LayerNorm, then the
gemma3 projector: the patch grid average-pooled n_merge x n_merge, RMS norm times
mm.soft_emb_norm.weight, mm.input_projection to the text model's width. encode() gives one row
an image token, raster order of the pooled grid."""

from __future__ import annotations

import os

import numpy as np

from ..errors import GGUFError
from ..memory import Tensor
from ..ops.copy import copy
from ..ops.elementwise import activation, add, scale
from ..ops.layer_norm import layer_norm
from ..ops.matmul import matmul
from ..ops.norm import rms_norm
from .vision_config import GEMMA3, VisionConfig, vision_config
from .vision_layout import patch_rows
from .vision_ops import add_padded, full_attention, linear
from .vision_run import Tower
from .vision_weights import load_tower, upload_transposed, upload_weight

LAYER = ("ln1", "attn_q", "attn_k", "attn_v", "attn_out", "ln2", "ffn_up", "ffn_down")
PROJECTION = "mm.input_projection.weight"


def required_names(vc: VisionConfig) -> list[str]:
    names = ["v.patch_embd.weight", "v.patch_embd.bias", "v.position_embd.weight", "mm.soft_emb_norm.weight",
             PROJECTION]
    for il in range(vc.n_layer):
        names += [f"v.blk.{il}.{n}{s}" for n in LAYER for s in (".weight", ".bias")]
    return names


def ffn_swapped(vc: VisionConfig, tensors: dict) -> bool:
    """Whether the file names its MLP's matrices the other way round (older conversions, which
    clip.cpp's load_tensors swaps back: ffn_down.weight then takes the tower's width in)."""
    down = tensors.get("v.blk.0.ffn_down.weight")
    return down is not None and vc.n_ff != vc.n_embd and down.ne[0] == vc.n_embd


def pool_views(x: Tensor, E: int, side: int, k: int) -> list[Tensor]:
    """The k * k strided views (E, side / k, side / k) of x ([E, side * side], raster order) whose
    sum is the k x k sum pool of the grid, in ggml_pool_2d's order (rows of the kernel, then columns)."""
    s = side // k
    nb = (4, 4 * E * k, 4 * E * k * side)
    return [x.view((E, s, s), nb=nb, offset=4 * E * (dy * side + dx)) for dy in range(k) for dx in range(k)]


class SiglipEncoder(Tower):
    """The Gemma 3 tower of the mmproj file at `path` on `device`: its weights (uploaded once, as
    the file stores the matrices, norms, biases and positions as F32, the input projection
    transposed).
    encode(pixels) runs one image."""

    def __init__(self, device, path: str | os.PathLike):
        super().__init__(device, path)
        try:
            swap = []

            def upload(f, name):
                if name == PROJECTION:
                    return name, upload_transposed(device, f, name)
                if not swap:
                    swap.append(ffn_swapped(vision_config(self.path, f.metadata, f.tensors), f.tensors))
                key = name
                if swap[0] and ".ffn_" in name:   # stored under the other's name
                    key = name.replace("ffn_up", "ffn_@").replace("ffn_down", "ffn_up").replace("ffn_@", "ffn_down")
                return key, upload_weight(device, f, name)
            self.cfg = load_tower(device, self.path, GEMMA3, "Gemma 3's SigLIP tower", required_names,
                                  ("v.post_ln.weight", "v.post_ln.bias"), self.w, upload)
        except BaseException:
            self.close()
            raise

    def encode(self, pixels: np.ndarray) -> np.ndarray:
        """The image tokens of `pixels` (float32 [3, S, S], S the projector's image_size, from
        image_input.preprocess): [n_tokens, proj_dim] float32, raster order of the pooled grid."""
        vc, S = self.cfg, self.cfg.image_size
        if pixels.shape != (3, S, S):
            raise GGUFError(f"{self.path}: the encoder takes [3, {S}, {S}], got {list(pixels.shape)}")
        run = self.runs.get(S, self._build, self.device)
        out = run.run({"patches": patch_rows(pixels, vc.patch_size, 1)}, "out")
        return out.reshape(-1, vc.proj_dim)

    def _build(self, run) -> None:
        """The buffers of an image (the tower's one size) and the tower recorded over them."""
        vc, E = self.cfg, self.cfg.n_embd
        side = vc.image_size // vc.patch_size
        n, n_out = side * side, (side // vc.n_merge) ** 2
        run.new("patches", (3 * vc.patch_size ** 2, n))
        for name in ("x", "cur", "attn", "q", "k", "v"):
            run.new(name, (E, n))
        run.new("ffn", (vc.n_ff, n))
        add_padded(run, vc.head_dim, vc.n_head, n)
        run.new("pooled", (E, n_out))
        run.new("normed", (E, n_out))
        run.new("out", (vc.proj_dim, n_out))
        run.record(lambda seq: self._record(seq, run.tensors, n, side))

    def _record(self, seq, b: dict, n: int, side: int) -> None:
        vc, w, E, D, H = self.cfg, self.w, self.cfg.n_embd, self.cfg.head_dim, self.cfg.n_head
        x, cur, attn = b["x"], b["cur"], b["attn"]

        def lin(name, src, dst):
            linear(seq, w, name, src, dst, self.work)
        lin("v.patch_embd", b["patches"].view((b["patches"].ne[0], n)), x)
        add(seq, x, w["v.position_embd.weight"].view((E, n)), x)
        seq.barrier()
        for il in range(vc.n_layer):
            p = f"v.blk.{il}."
            layer_norm(seq, x, cur, w[p + "ln1.weight"], w[p + "ln1.bias"], vc.eps)
            seq.barrier()
            for name in ("q", "k", "v"):
                matmul(seq, w[p + f"attn_{name}.weight"], cur, b[name], work=self.work)
            seq.barrier()
            for name in ("q", "k", "v"):
                add(seq, b[name], w[p + f"attn_{name}.bias"], b[name])
            seq.barrier()
            heads = [b[name].view((D, H, n)) for name in ("q", "k", "v")]
            full_attention(seq, self.device, *heads, attn.view((D, H, n)), self.work, f"vision attention {il}", b)
            lin(p + "attn_out", attn, cur)
            add(seq, x, cur, x)
            seq.barrier()
            layer_norm(seq, x, cur, w[p + "ln2.weight"], w[p + "ln2.bias"], vc.eps)
            seq.barrier()
            lin(p + "ffn_up", cur, b["ffn"])
            activation(seq, "gelu", b["ffn"], b["ffn"])
            seq.barrier()
            lin(p + "ffn_down", b["ffn"], cur)
            add(seq, x, cur, x)
            seq.barrier()
        if "v.post_ln.weight" in w:
            layer_norm(seq, x, x, w["v.post_ln.weight"], w["v.post_ln.bias"], vc.eps)
            seq.barrier()
        self._project(seq, b, side)

    def _project(self, seq, b: dict, side: int) -> None:
        """The gemma3 projector: sum pool (pool_views), / k^2, RMS norm * soft_emb_norm, projection."""
        vc, w, k = self.cfg, self.w, self.cfg.n_merge
        pooled, s = b["pooled"], side // k
        grid = pooled.view((vc.n_embd, s, s))
        for i, view in enumerate(pool_views(b["x"], vc.n_embd, side, k)):
            if i == 0:
                copy(seq, view, grid)
            else:
                copy(seq, view, b["normed"].view((vc.n_embd, s, s)))
                seq.barrier()
                add(seq, pooled, b["normed"], pooled)
            seq.barrier()
        scale(seq, pooled, 1.0 / (k * k), pooled)
        seq.barrier()
        rms_norm(seq, pooled, b["normed"], vc.eps, w["mm.soft_emb_norm.weight"])
        seq.barrier()
        matmul(seq, w[PROJECTION], b["normed"], b["out"], work=self.work)

