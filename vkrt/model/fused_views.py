"""phi3's fused weights seen, at load, as the separate ones the transformer reads: views (byte
offsets into the one uploaded tensor, no copies).

    attn_qkv  rows q (n_head * head_dim), then k, then v (n_head_kv * head_dim each)
              -> attn_q, attn_k, attn_v
    ffn_up    rows gate (feed_forward_length), then up (as llama.cpp's LLM_FFN_SWIGLU halves)
              -> ffn_gate, ffn_up

Gate and up stay adjacent in one allocation, so the decode gate+up fusion reads them in one pass
(transformer.py), and q, k, v likewise for the QKV fusion.
"""

from __future__ import annotations

from dataclasses import replace

from ..memory import Tensor
from .arch import DENSE, Packing
from .config import ModelConfig


def _rows(t: Tensor, sizes: list[int], names: list[str]) -> dict[str, Tensor]:
    """Consecutive row ranges of sizes `sizes` of the 2-D weight t, named `names`."""
    out, start = {}, 0
    for n, name in zip(sizes, names):
        out[name] = replace(t.slice(1, start, start + n), name=name)
        start += n
    return out


def fused_views(cfg: ModelConfig, weights: dict[str, Tensor]) -> tuple[dict[str, Tensor], list[str]]:
    """(the views to add to `weights`, replacing file names where they coincide; the names of
    the fused tensors they read, which leave `weights`: the model closes them apart)."""
    views: dict[str, Tensor] = {}
    fused: list[str] = []
    H, KV, Dk, Dv = cfg.n_head, cfg.n_head_kv, cfg.head_dim_k, cfg.head_dim_v
    for il in range(cfg.n_layer):
        p = f"blk.{il}."
        if cfg.spec.attn.qkv is Packing.FUSED and p + "attn_qkv.weight" in weights:
            qkv = weights[p + "attn_qkv.weight"]
            fused.append(p + "attn_qkv.weight")
            views.update(_rows(qkv, [H * Dk, KV * Dk, KV * Dv], [p + f"attn_{n}.weight" for n in "qkv"]))
        if cfg.spec.ffn.gate_up is Packing.FUSED and cfg.layers[il].ffn == DENSE and p + "ffn_up.weight" in weights:
            up = weights[p + "ffn_up.weight"]
            fused.append(p + "ffn_up.weight")
            views.update(_rows(up, [cfg.n_ff, cfg.n_ff], [p + "ffn_gate.weight", p + "ffn_up.weight"]))
    return views, fused
