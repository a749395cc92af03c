"""Random-weight vision projector files (mmproj-*.gguf) with llama.cpp's tensor names and keys
(tools/mtmd/clip-impl.h, as convert_hf_to_gguf.py writes them): a tiny Qwen3-VL / Qwen3.5 tower
(clip.projector_type qwen3vl_merger) or Gemma 3 SigLIP tower (gemma3) matching a tiny text model,
for tests. llama-server --mmproj loads them."""

from __future__ import annotations

import os
from dataclasses import dataclass

import gguf
import numpy as np
from gguf import GGUFValueType as V

from .vision_config import GEMMA3, GEMMA3_MERGE, QWEN3VL


@dataclass
class MmprojSpec:
    proj_dim: int = 64        # the text model's n_embd
    n_embd: int = 32
    n_head: int = 2
    n_ff: int = 64
    n_layer: int = 2
    patch_size: int = 16
    n_merge: int = 2          # Qwen: the spatial merge; Gemma 3: the pooling kernel
    n_pos_side: int = 6       # the learned position table's side (Qwen: images of other grids interpolate
    #                           it; Gemma 3: images are patch_size * n_pos_side square)
    weight_type: str = "F32"  # the matrices' type (F32 or F16); norms, biases and positions are F32
    seed: int = 0
    projector: str = QWEN3VL
    mean: tuple = (0.5, 0.5, 0.5)
    std: tuple = (0.5, 0.5, 0.5)


class _Writer:
    """Random tensors of one spec into one file, drawn in the order they are written."""

    def __init__(self, w: gguf.GGUFWriter, spec: MmprojSpec):
        self.w, self.rng = w, np.random.default_rng(spec.seed)
        self.mtype = {"F32": np.float32, "F16": np.float16}[spec.weight_type.upper()]

    def normal(self, shape, scale, dtype=np.float32):
        return (self.rng.standard_normal(shape) * scale).astype(dtype)

    def matrix(self, name, rows, cols, scale=1.0):   # numpy (rows, cols): ggml ne (cols, rows), y = W x maps cols -> rows
        self.w.add_tensor(name + ".weight", self.normal((rows, cols), scale / np.sqrt(cols), self.mtype))
        self.w.add_tensor(name + ".bias", self.normal((rows,), 0.05))

    def norm(self, name, n):
        self.w.add_tensor(name + ".weight", (1.0 + self.normal((n,), 0.1)).astype(np.float32))
        self.w.add_tensor(name + ".bias", self.normal((n,), 0.05))


def write_mmproj(path: str | os.PathLike, spec: MmprojSpec) -> str:
    """Write a random projector (spec.projector) for `spec` to `path`; returns the path."""
    s = spec
    gemma = s.projector == GEMMA3
    w = gguf.GGUFWriter(os.fspath(path), "clip")
    w.add_name(f"vkrt synthetic {s.projector}")
    w.add_key_value("general.type", "mmproj", V.STRING)
    w.add_key_value("clip.projector_type", s.projector, V.STRING)
    w.add_key_value("clip.has_vision_encoder", True, V.BOOL)
    w.add_key_value("clip.has_audio_encoder", False, V.BOOL)
    w.add_key_value("clip.use_gelu", True, V.BOOL)
    v = "clip.vision."
    keys = [("image_size", s.patch_size * s.n_pos_side), ("patch_size", s.patch_size), ("embedding_length", s.n_embd),
            ("feed_forward_length", s.n_ff), ("projection_dim", s.proj_dim), ("block_count", s.n_layer),
            ("attention.head_count", s.n_head)]
    if not gemma:
        keys.append(("spatial_merge_size", s.n_merge))
    elif s.n_merge != GEMMA3_MERGE:   # the converter writes it for test models only (tinygemma3)
        keys.append(("projector.scale_factor", s.n_merge))
    for key, value in keys:
        w.add_key_value(v + key, value, V.UINT32)
    w.add_key_value(v + "attention.layer_norm_epsilon", 1e-6, V.FLOAT32)
    w.add_key_value(v + "image_mean", list(s.mean), V.ARRAY, sub_type=V.FLOAT32)
    w.add_key_value(v + "image_std", list(s.std), V.ARRAY, sub_type=V.FLOAT32)
    if not gemma:
        w.add_key_value(v + "is_deepstack_layers", [False] * s.n_layer, V.ARRAY, sub_type=V.BOOL)
    (_gemma3_tensors if gemma else _qwen_tensors)(_Writer(w, s), s)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return os.fspath(path)


def _qwen_tensors(t: _Writer, s: MmprojSpec) -> None:
    E, F, P, M = s.n_embd, s.n_ff, s.proj_dim, s.n_embd * s.n_merge ** 2
    k = 3 * s.patch_size ** 2
    for name in ("v.patch_embd.weight", "v.patch_embd.weight.1"):
        t.w.add_tensor(name, t.normal((E, 3, s.patch_size, s.patch_size), 1.0 / np.sqrt(2 * k)))
    t.w.add_tensor("v.patch_embd.bias", t.normal((E,), 0.05))
    t.w.add_tensor("v.position_embd.weight", t.normal((s.n_pos_side ** 2, E), 0.3))
    for il in range(s.n_layer):
        b = f"v.blk.{il}."
        t.norm(b + "ln1", E)
        t.matrix(b + "attn_qkv", 3 * E, E)
        t.matrix(b + "attn_out", E, E)
        t.norm(b + "ln2", E)
        t.matrix(b + "ffn_up", F, E)
        t.matrix(b + "ffn_down", E, F)
    t.norm("v.post_ln", E)
    t.matrix("mm.0", M, M)
    t.matrix("mm.2", P, M)


def _gemma3_tensors(t: _Writer, s: MmprojSpec) -> None:
    """SigLIP's tensors as the Gemma 3 converter names them; mm.soft_emb_norm.weight holds
    1 + the checkpoint's weight (Gemma's RMS norm), mm.input_projection.weight the checkpoint's
    [tower width, text width] matrix as it is (ggml ne [text width, tower width])."""
    E, F, P = s.n_embd, s.n_ff, s.proj_dim
    k = 3 * s.patch_size ** 2
    t.w.add_tensor("v.patch_embd.weight", t.normal((E, 3, s.patch_size, s.patch_size), 1.0 / np.sqrt(k)))
    t.w.add_tensor("v.patch_embd.bias", t.normal((E,), 0.05))
    t.w.add_tensor("v.position_embd.weight", t.normal((s.n_pos_side ** 2, E), 0.3))
    for il in range(s.n_layer):
        b = f"v.blk.{il}."
        t.norm(b + "ln1", E)
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            t.matrix(b + name, E, E)
        t.norm(b + "ln2", E)
        t.matrix(b + "ffn_up", F, E)
        t.matrix(b + "ffn_down", E, F)
    t.norm("v.post_ln", E)
    t.w.add_tensor("mm.soft_emb_norm.weight", (1.0 + t.normal((E,), 0.1)).astype(np.float32))
    t.w.add_tensor("mm.input_projection.weight", t.normal((E, P), 1.0 / np.sqrt(E), t.mtype))
