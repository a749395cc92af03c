"""VisionEncoder: a Qwen3-VL / Qwen3.5 vision tower (clip.projector_type qwen3vl_merger) from a
llama.cpp mmproj file, run on the GPU with vkrt's ops as tools/mtmd/models/qwen3vl.cpp builds it:
the patch embedding (the two temporal conv kernels as two matmuls over the same image), the
learned positions resized to the grid, pre-norm ViT blocks (LayerNorm, fused QKV with biases,
2-D rotary positions, full attention, GELU MLP), the post norm and the 2x2 merger MLP to the
text model's width. encode() gives one row an image token."""

from __future__ import annotations

import os

import numpy as np

from ..commands import read_tensor, tensor_from_numpy, write_tensor
from ..errors import GGUFError
from ..memory import I32
from ..ops.elementwise import activation, add
from ..ops.layer_norm import layer_norm
from ..ops.matmul import matmul
from ..ops.rope import rope
from .vision_config import QWEN3VL, VisionConfig
from .vision_layout import merge_order, patch_rows, resized_positions, rope_positions
from .vision_ops import add_padded, full_attention, linear
from .vision_run import Tower
from .vision_weights import load_tower

ROPE_BASE = 10000.0   # clip.cpp's rope_multi frequency base for the Qwen-VL towers


def layer_names(il: int) -> list[str]:
    b = f"v.blk.{il}."
    return [b + n + s for n in ("ln1", "attn_qkv", "attn_out", "ln2", "ffn_up", "ffn_down")
            for s in (".weight", ".bias")]


def required_names(vc: VisionConfig) -> list[str]:
    names = ["v.patch_embd.weight", "v.patch_embd.weight.1", "v.patch_embd.bias", "v.position_embd.weight",
             "mm.0.weight", "mm.0.bias", "mm.2.weight", "mm.2.bias"]
    for il in range(vc.n_layer):
        names += layer_names(il)
    return names


def rope_factors(head_dim: int) -> np.ndarray:
    """Frequency factors that turn vkrt's sectioned NEOX rope (base ROPE_BASE^2 over the whole
    head) into ggml's vision rope: each of the two sections restarts its frequencies."""
    ff = np.ones(head_dim // 2, np.float32)
    ff[head_dim // 4:] = 1.0 / ROPE_BASE
    return ff


class VisionEncoder(Tower):
    """The tower of the mmproj file at `path` on `device`: its weights (uploaded once, as the
    file stores the matrices; norms and biases as F32). encode(pixels) runs one image."""

    def __init__(self, device, path: str | os.PathLike):
        super().__init__(device, path)
        try:
            self.cfg = vc = load_tower(device, self.path, QWEN3VL, "a Qwen-VL tower", required_names,
                                       ("v.post_ln.weight", "v.post_ln.bias", "v.pre_ln.weight", "v.pre_ln.bias"),
                                       self.w)
            table = self.w.pop("v.position_embd.weight")   # resized on the host for each grid
            self.pos_table = read_tensor(table).reshape(vc.n_pos_side ** 2, vc.n_embd)
            table.close()
            self.ff = tensor_from_numpy(device, rope_factors(vc.head_dim), name="vision rope factors")
        except BaseException:
            self.close()
            raise

    def encode(self, pixels: np.ndarray) -> np.ndarray:
        """The image tokens of `pixels` (float32 [3, H, W], H and W multiples of patch x merge, from
        image_input.preprocess): [n_tokens, proj_dim] float32, raster order of the merged grid."""
        vc, p, m = self.cfg, self.cfg.patch_size, self.cfg.n_merge
        if pixels.ndim != 3 or pixels.shape[0] != 3 or pixels.shape[1] % vc.align or pixels.shape[2] % vc.align:
            raise GGUFError(f"{self.path}: the encoder takes [3, H, W] with H and W multiples of {vc.align}, got "
                            f"{list(pixels.shape)}")
        gh, gw = pixels.shape[1] // p, pixels.shape[2] // p
        run = self.runs.get((gh, gw), lambda r: self._build(r, gh, gw), self.device)
        out = run.run({"patches": patch_rows(pixels, p, m)}, "out")
        return out.reshape(gh // m, gw // m, vc.proj_dim).reshape(-1, vc.proj_dim)

    def _build(self, run, gh: int, gw: int) -> None:
        """The buffers of a gh x gw patch grid (its rotary and learned positions written now) and
        the tower recorded over them."""
        vc, m, E = self.cfg, self.cfg.n_merge, self.cfg.n_embd
        n = gh * gw
        run.new("patches", (3 * vc.patch_size ** 2, n))
        positions = run.new("positions", (4 * n,), I32)
        pos_t = run.new("learned positions", (E, n))
        write_tensor(positions, rope_positions(gh, gw, m))
        learned = resized_positions(self.pos_table, vc.n_pos_side, gh, gw)
        write_tensor(pos_t, learned[merge_order(gh, gw, m)].astype(np.float32))
        for name in ("x", "cur", "attn"):
            run.new(name, (E, n))
        run.new("qkv", (3 * E, n))
        run.new("ffn", (vc.n_ff, n))
        run.new("q", (vc.head_dim, vc.n_head, n))
        run.new("k", (vc.head_dim, vc.n_head, n))
        add_padded(run, vc.head_dim, vc.n_head, n)
        run.new("merger", (E * m * m, n // (m * m)))
        run.new("out", (vc.proj_dim, n // (m * m)))
        run.record(lambda seq: self._record(seq, run.tensors, n))

    def _record(self, seq, bufs: dict, n: int) -> None:
        vc, w, E, D, H = self.cfg, self.w, self.cfg.n_embd, self.cfg.head_dim, self.cfg.n_head
        patches, positions, pos_t, x, cur, attn, qkv, ffn, q, k, mid, out = (
            bufs[name] for name in ("patches", "positions", "learned positions", "x", "cur", "attn", "qkv", "ffn", "q",
                                 "k", "merger", "out"))

        def lin(name, src, dst):
            linear(seq, w, name, src, dst, self.work)
        rows = patches.view((patches.ne[0], n))
        matmul(seq, w["v.patch_embd.weight"], rows, x, work=self.work)
        matmul(seq, w["v.patch_embd.weight.1"], rows, cur, work=self.work)
        seq.barrier()
        add(seq, x, cur, x)
        seq.barrier()
        add(seq, x, w["v.patch_embd.bias"], x)
        seq.barrier()
        add(seq, x, pos_t.view((E, n)), x)
        seq.barrier()
        if "v.pre_ln.weight" in w:
            layer_norm(seq, x, x, w["v.pre_ln.weight"], w["v.pre_ln.bias"], vc.eps)
            seq.barrier()
        rope_args = dict(n_dims=D, freq_base=ROPE_BASE ** 2, sections=(D // 4, D // 4, 0, 0), freq_factors=self.ff)
        row = 4 * 3 * E
        for il in range(vc.n_layer):
            b = f"v.blk.{il}."
            layer_norm(seq, x, cur, w[b + "ln1.weight"], w[b + "ln1.bias"], vc.eps)
            seq.barrier()
            lin(b + "attn_qkv", cur, qkv)
            rope(seq, qkv.view((D, H, n), nb=(4, 4 * D, row)), positions, q, **rope_args)
            rope(seq, qkv.view((D, H, n), nb=(4, 4 * D, row), offset=4 * E), positions, k, **rope_args)
            seq.barrier()
            full_attention(seq, self.device, q, k, qkv.view((D, H, n), nb=(4, 4 * D, row), offset=8 * E),
                           attn.view((D, H, n)), self.work, f"vision attention {il}", bufs)
            lin(b + "attn_out", attn, cur)
            add(seq, x, cur, x)
            seq.barrier()
            layer_norm(seq, x, cur, w[b + "ln2.weight"], w[b + "ln2.bias"], vc.eps)
            seq.barrier()
            lin(b + "ffn_up", cur, ffn)
            activation(seq, "gelu", ffn, ffn)
            seq.barrier()
            lin(b + "ffn_down", ffn, cur)
            add(seq, x, cur, x)
            seq.barrier()
        if "v.post_ln.weight" in w:
            layer_norm(seq, x, x, w["v.post_ln.weight"], w["v.post_ln.bias"], vc.eps)
            seq.barrier()
        merged = x.view((mid.ne[0], mid.ne[1]))
        lin("mm.0", merged, mid)
        activation(seq, "gelu", mid, mid)
        seq.barrier()
        lin("mm.2", mid, out)

    def _release(self) -> None:
        if getattr(self, "ff", None) is not None:
            self.ff.close()
        super()._release()
