"""Random-weight vision projector files (mmproj-*.gguf) with llama.cpp's tensor names and keys
(tools/mtmd/clip-impl.h): a tiny Qwen3-VL / Qwen3.5 tower (clip.projector_type qwen3vl_merger)
matching a tiny text model, for tests. llama-server --mmproj loads them."""

from __future__ import annotations

import os
from dataclasses import dataclass

import gguf
import numpy as np
from gguf import GGUFValueType as V

from .vision_config import QWEN3VL


@dataclass
class MmprojSpec:
    proj_dim: int = 64        # the text model's n_embd
    n_embd: int = 32
    n_head: int = 2
    n_ff: int = 64
    n_layer: int = 2
    patch_size: int = 16
    n_merge: int = 2
    n_pos_side: int = 6       # the learned position table's side (images of other grids interpolate it)
    weight_type: str = "F32"  # the matrices' type (F32 or F16); norms, biases and positions are F32
    seed: int = 0


def write_mmproj(path: str | os.PathLike, spec: MmprojSpec) -> str:
    """Write a random qwen3vl_merger projector for `spec` to `path`; returns the path."""
    s, rng = spec, np.random.default_rng(spec.seed)
    E, F, P, M = s.n_embd, s.n_ff, s.proj_dim, s.n_embd * s.n_merge ** 2
    mtype = {"F32": np.float32, "F16": np.float16}[s.weight_type.upper()]
    w = gguf.GGUFWriter(os.fspath(path), "clip")
    w.add_name("vkrt synthetic qwen3vl_merger")
    w.add_key_value("general.type", "mmproj", V.STRING)
    w.add_key_value("clip.projector_type", QWEN3VL, V.STRING)
    w.add_key_value("clip.has_vision_encoder", True, V.BOOL)
    w.add_key_value("clip.has_audio_encoder", False, V.BOOL)
    w.add_key_value("clip.use_gelu", True, V.BOOL)
    v = "clip.vision."
    for key, value in (("image_size", s.patch_size * s.n_pos_side), ("patch_size", s.patch_size),
                       ("embedding_length", E), ("feed_forward_length", F), ("projection_dim", P),
                       ("block_count", s.n_layer), ("attention.head_count", s.n_head),
                       ("spatial_merge_size", s.n_merge)):
        w.add_key_value(v + key, value, V.UINT32)
    w.add_key_value(v + "attention.layer_norm_epsilon", 1e-6, V.FLOAT32)
    w.add_key_value(v + "image_mean", [0.5, 0.5, 0.5], V.ARRAY, sub_type=V.FLOAT32)
    w.add_key_value(v + "image_std", [0.5, 0.5, 0.5], V.ARRAY, sub_type=V.FLOAT32)
    w.add_key_value(v + "is_deepstack_layers", [False] * s.n_layer, V.ARRAY, sub_type=V.BOOL)

    def normal(shape, scale, dtype=np.float32):
        return (rng.standard_normal(shape) * scale).astype(dtype)

    def matrix(name, rows, cols):   # numpy (rows, cols): ggml ne (cols, rows), y = W x maps cols -> rows
        w.add_tensor(name + ".weight", normal((rows, cols), 1.0 / np.sqrt(cols), mtype))
        w.add_tensor(name + ".bias", normal((rows,), 0.05))

    def norm(name, n):
        w.add_tensor(name + ".weight", (1.0 + normal((n,), 0.1)).astype(np.float32))
        w.add_tensor(name + ".bias", normal((n,), 0.05))

    k = 3 * s.patch_size ** 2
    for name in ("v.patch_embd.weight", "v.patch_embd.weight.1"):
        w.add_tensor(name, normal((E, 3, s.patch_size, s.patch_size), 1.0 / np.sqrt(2 * k)))
    w.add_tensor("v.patch_embd.bias", normal((E,), 0.05))
    w.add_tensor("v.position_embd.weight", normal((s.n_pos_side ** 2, E), 0.3))
    for il in range(s.n_layer):
        b = f"v.blk.{il}."
        norm(b + "ln1", E)
        matrix(b + "attn_qkv", 3 * E, E)
        matrix(b + "attn_out", E, E)
        norm(b + "ln2", E)
        matrix(b + "ffn_up", F, E)
        matrix(b + "ffn_down", E, F)
    norm("v.post_ln", E)
    matrix("mm.0", M, M)
    matrix("mm.2", P, M)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return os.fspath(path)
