"""qwen3next's Gated DeltaNet tensors turned, at load, into the layout the kernels read (qwen35's).

A qwen3next file groups the DeltaNet's heads by key head (Hk key heads, rep = Hv / Hk value heads
each; D values a head):
    ssm_in   rows per key head g: q_g (D), k_g (D), v of heads g*rep..g*rep+rep-1, z of the same
             (older converters; newer ones write attn_qkv (all q, all k, all v) and attn_gate (z))
    ssm_ba   rows per key head g: beta of its rep value heads, then their alpha
and value head j reads key head j // rep (llama.cpp repeats q and k interleaved). The kernels
(delta_net.py) read key head n % Hk for value head n: qwen35's tiled order, which its converter
writes. So the loader gives the kernels value heads in tiled order n = r * Hk + g for file head
j = g * rep + r: the v rows of the projection, the v channels of the conv, alpha, beta, ssm_dt and
ssm_a are permuted (whole rows: any weight type), while z and ssm_out keep the file's order and the
gated norm reads the kernel's output through a view that puts each head back (delta_net_block.py).
The tensors reach the transformer under qwen35's names (attn_qkv, attn_gate, ssm_alpha, ssm_beta).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .arch import Packing
from .config import ModelConfig
from .tensors import grouped_delta_net


@dataclass(frozen=True)
class DerivedTensor:
    """A tensor the loader uploads in place of file tensors (`sources`): `make()` gives its data
    as GGUFSource.array gives a file tensor's (rows of blocks or elements)."""

    name: str
    type: object
    ne: tuple
    sources: tuple
    make: Callable[[], np.ndarray]

    @property
    def nbytes(self) -> int:
        rows = int(np.prod(self.ne[1:])) if len(self.ne) > 1 else 1
        return self.type.row_bytes(self.ne[0]) * rows


def tiled_heads(n_k_heads: int, n_v_heads: int) -> np.ndarray:
    """The file's value head at each kernel position n: n = r * Hk + g holds head g * rep + r."""
    rep = n_v_heads // n_k_heads
    n = np.arange(n_v_heads)
    return (n % n_k_heads) * rep + n // n_k_heads


def _heads_rows(heads: np.ndarray, D: int, base: int = 0) -> np.ndarray:
    """Rows of heads `heads` (D rows each) starting at row `base`."""
    return (base + heads[:, None] * D + np.arange(D)).reshape(-1)


def derived_tensors(cfg: ModelConfig, source) -> dict[str, DerivedTensor]:
    """The tensors a grouped-DeltaNet model uploads instead of its file's (empty for the rest)."""
    if not grouped_delta_net(cfg):
        return {}
    D, Hk, Hv = cfg.ssm_head_dim, cfg.ssm_k_heads, cfg.ssm_v_heads
    rep, qk = Hv // Hk, 2 * Hk * D
    order = tiled_heads(Hk, Hv)
    group, head = order // rep, order % rep            # each kernel head's key group and place in it
    file_heads = np.arange(Hv)
    out: dict[str, DerivedTensor] = {}

    def rows_of(src: str, name: str, rows: np.ndarray) -> None:
        info = source.tensor(src)
        ne = (info.ne[0], len(rows)) if len(info.ne) > 1 else (len(rows),)
        out[name] = DerivedTensor(name, info.type, ne, (src,), lambda: source.array(src)[rows])

    v_tiled = _heads_rows(order, D, qk)   # projection / conv rows: q, k as they are, v tiled
    conv_rows = np.concatenate([np.arange(qk), v_tiled])
    for il in cfg.linear_layers:
        p = f"blk.{il}."
        if cfg.spec.layers.qkvz is Packing.FUSED:
            width = 2 * D + 2 * rep * D                  # one key head's rows of ssm_in
            g = np.arange(Hk)
            q = (g[:, None] * width + np.arange(D)).reshape(-1)
            v = (group[:, None] * width + 2 * D + head[:, None] * D + np.arange(D)).reshape(-1)
            fg, fh = file_heads // rep, file_heads % rep
            z = (fg[:, None] * width + 2 * D + rep * D + fh[:, None] * D + np.arange(D)).reshape(-1)
            rows_of(p + "ssm_in.weight", p + "attn_qkv.weight", np.concatenate([q, q + D, v]))
            rows_of(p + "ssm_in.weight", p + "attn_gate.weight", z)
        else:
            rows_of(p + "attn_qkv.weight", p + "attn_qkv.weight", conv_rows)
        rows_of(p + "ssm_ba.weight", p + "ssm_beta.weight", group * 2 * rep + head)
        rows_of(p + "ssm_ba.weight", p + "ssm_alpha.weight", group * 2 * rep + rep + head)
        rows_of(p + "ssm_conv1d.weight", p + "ssm_conv1d.weight", conv_rows)
        rows_of(p + "ssm_dt.bias", p + "ssm_dt.bias", order)
        rows_of(p + "ssm_a", p + "ssm_a", order)
    return out
