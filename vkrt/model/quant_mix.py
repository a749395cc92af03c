"""The tensor types of a llama.cpp quantisation mix (its `llama-quantize` ftype), so that a
generated model holds the types a user's file of that mix does, not one type throughout.

Q4_K_M, after llama.cpp's llama_tensor_get_type: the output matrix Q6_K; the attn_v matrices
Q6_K where use_more_bits picks their index among the model's attn_v (the first and last eighth,
every third between), every ffn_down (dense, experts, shared expert) where it picks the layer; a
fused attn_qkv Q5_K; every other matrix Q4_K. A tensor whose rows are not whole 256-value blocks
keeps the type it was given (llama.cpp falls back there too)."""

from __future__ import annotations

import re

from gguf.constants import GGMLQuantizationType as Q

from ..errors import VkrtError

MIXES = ("Q4_K_M",)
QK_K = 256


def use_more_bits(i_layer: int, n_layer: int) -> bool:
    """llama.cpp's use_more_bits: the layers a K-quant mix gives more bits."""
    return i_layer < n_layer // 8 or i_layer >= 7 * n_layer // 8 or (i_layer - n_layer // 8) % 3 == 2


def mix_types(mix: str, tensors: list[tuple[str, int, Q]], n_layer: int) -> list[Q]:
    """The type each of `tensors` (name, values a row, the type it would have had) takes in `mix`;
    non-matrix tensors (F32, F16) and rows that are not whole 256-value blocks keep theirs."""
    if mix not in MIXES:
        raise VkrtError(f"quantisation mix {mix!r} is not one of {', '.join(MIXES)}")
    n_v = sum(name.endswith(".attn_v.weight") for name, _, _ in tensors)
    i_v, out = 0, []
    for name, row, given in tensors:
        layer = re.match(r"blk\.(\d+)\.", name)
        if name.endswith(".attn_v.weight"):
            more, i_v = use_more_bits(i_v, n_v), i_v + 1
        else:
            more = layer is not None and use_more_bits(int(layer.group(1)), n_layer)
        if given in (Q.F32, Q.F16) or row % QK_K:
            out.append(given)
        elif name == "output.weight":
            out.append(Q.Q6_K)
        elif name.endswith(".attn_qkv.weight"):
            out.append(Q.Q5_K)
        elif re.search(r"\.(attn_v|ffn_down(_exps|_shexp)?)\.weight$", name):
            out.append(Q.Q6_K if more else Q.Q4_K)
        else:
            out.append(Q.Q4_K)
    return out
