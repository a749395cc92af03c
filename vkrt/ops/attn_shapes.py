"""The shapes of one attention call, checked once (GGML ggml_flash_attn_ext conventions).

    q     F32      [hsk, n_q,  n_head,    batch]   any strides (whole elements)
    k     F16/F32  [hsk, n_kv, n_head_kv, batch]  (flash attention: a quantised KV type too)
    v     F16/F32  [hsv, n_kv, n_head_kv, batch]
    mask  F16      [n_kv, n_q_padded >= n_q, nem2, nem3]  added to the scores; broadcast over heads
                   (head h uses plane h % nem2) and batch (b % nem3); -inf hides a key
    out   F32      [hsv, n_head, n_q, batch], contiguous (heads of a query row side by side)

n_head is a multiple of n_head_kv (grouped-query attention: head h reads KV head
h // (n_head / n_head_kv)). Head sizes are multiples of 8 up to 256; hsk and hsv may differ.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UnsupportedShape
from ..memory import F16, F32, Tensor

MAX_HEAD = 256
HEAD_SIZES = "multiples of 8 from 8 to 256"


@dataclass(frozen=True)
class AttnShape:
    hsk: int
    hsv: int
    n_q: int
    n_kv: int
    n_head: int
    n_head_kv: int
    batch: int
    nem2: int = 1
    nem3: int = 1

    @property
    def gqa(self) -> int:
        return self.n_head // self.n_head_kv

    def flops(self) -> int:
        """Multiply-adds x 2 of QK^T and PV over every key (masked or not)."""
        return 2 * self.n_q * self.n_kv * (self.hsk + self.hsv) * self.n_head * self.batch


def _types(t: Tensor, what: str, allowed) -> None:
    if t.type not in allowed:
        names = "/".join(a.name for a in allowed)
        raise UnsupportedShape(f"attention {what} must be {names}, got {t.type.name} ({t!r})")


def attn_shape(q: Tensor, k: Tensor, v: Tensor, out: Tensor, mask: Tensor | None = None,
               kv_types: tuple = (F16, F32)) -> AttnShape:
    """Check q, k, v, mask and out against each other (K and V of `kv_types`); raise
    UnsupportedShape saying what is wrong."""
    _types(q, "q", (F32,))
    _types(k, "k", kv_types)
    _types(v, "v", kv_types)
    _types(out, "out", (F32,))
    hsk, n_q, n_head, batch = q.ne
    hsv, n_kv, n_head_kv = v.ne[0], k.ne[1], k.ne[2]
    for size, name in ((hsk, "K"), (hsv, "V")):
        if size % 8 or not 8 <= size <= MAX_HEAD:
            raise UnsupportedShape(f"{name} head size {size} is not supported; supported: {HEAD_SIZES}")
    if k.ne != (hsk, n_kv, n_head_kv, batch):
        raise UnsupportedShape(f"k {k!r} should be [{hsk}, n_kv, n_head_kv, {batch}] for q {q!r}")
    if v.ne[1:] != k.ne[1:]:
        raise UnsupportedShape(f"v {v!r} and k {k!r} disagree in n_kv, n_head_kv or batch")
    if n_head % n_head_kv:
        raise UnsupportedShape(f"n_head {n_head} is not a multiple of n_head_kv {n_head_kv}")
    if out.ne != (hsv, n_head, n_q, batch) or not out.is_contiguous():
        raise UnsupportedShape(f"out must be contiguous F32 [{hsv}, {n_head}, {n_q}, {batch}], got {out!r}")
    nem2 = nem3 = 1
    if mask is not None:
        _types(mask, "mask", (F16,))
        nem2, nem3 = mask.ne[2], mask.ne[3]
        if mask.ne[0] != n_kv or mask.ne[1] < n_q or n_head % nem2 or batch % nem3:
            raise UnsupportedShape(f"mask {mask!r} should be [{n_kv}, >= {n_q}, a divisor of {n_head}, "
                                   f"a divisor of {batch}]")
    for t, name in ((q, "q"), (k, "k"), (v, "v"), (mask, "mask")):
        if t is not None and (t.nb[0] != t.type.type_size or any(nb % t.type.type_size for nb in t.nb)):
            raise UnsupportedShape(f"{name} strides {t.nb} must be whole {t.type.name} elements with dim 0 "
                                   "contiguous")
    return AttnShape(hsk, hsv, n_q, n_kv, n_head, n_head_kv, batch, nem2, nem3)


def element_strides(t: Tensor) -> tuple[int, int, int]:
    """nb[1..3] of `t` in elements (of a block type, whole blocks' elements)."""
    return tuple(nb // t.type.type_size * t.type.block_size for nb in t.nb[1:])
