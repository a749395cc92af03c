"""The Walsh-Hadamard rotation of a quantised KV cache (llama.cpp's attn_rot_k / attn_rot_v, PR
#21038): K and the queries, and V and attention's output, are rotated in runs of a power-of-two
length, which spreads a head's outliers over its blocks before they are quantised; the rotation
is orthonormal and its own inverse, so attention's result does not change."""

from __future__ import annotations

import math

import numpy as np

from ..errors import UnsupportedShape
from ..memory import F32, Tensor
from ..pipeline import PushConstants, kernel
from .binding import f32_binding
from .grid import grid

HADAMARD_PUSH = PushConstants(("runs", "u32"), ("ne1", "u32"), ("n", "u32"), ("x_off", "u32"), ("s1", "u32"),
                              ("s2", "u32"), ("scale", "f32"))
MIN_RUN = 64   # llama.cpp rotates only heads of a multiple of 64, V always in runs of 64


def k_rotation(head_dim: int) -> int:
    """The run K and the queries are rotated in (llama.cpp's build_input_k_rot): the largest power
    of two from 64 that divides the head; 0 where 64 does not."""
    if head_dim % MIN_RUN:
        return 0
    n = MIN_RUN
    while head_dim % (2 * n) == 0:
        n *= 2
    return n


def v_rotation(head_dim: int) -> int:
    """The run V and attention's output are rotated in: 64 (llama.cpp found the smallest best for V);
    0 where 64 does not divide the head."""
    return MIN_RUN if head_dim % MIN_RUN == 0 else 0


def hadamard_matrix(n: int) -> np.ndarray:
    """ggml_gen_hadamard's n x n matrix (Sylvester order, entries +-1/sqrt(n))."""
    h = np.array([[1.0]])
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return (h / math.sqrt(n)).astype(np.float32)


def rotation_defines(name: str, n: int, what: str) -> dict:
    """The defines of a kernel that rotates in runs of n as hadamard() does: `name` = n and
    `name`_SCALE, hadamard()'s 1 / sqrt(n) as the f32 it pushes (so the products have its bits)."""
    if n < 2 or n & (n - 1) or n > 1024:
        raise UnsupportedShape(f"{what}: a rotation in runs of {n}; needs a power of two from 2 to 1024")
    bits = int(np.float32(1.0 / math.sqrt(n)).view(np.uint32))
    return {name: n, f"{name}_SCALE": f"uintBitsToFloat({bits:#x}u)"}


def hadamard(seq, x: Tensor, n: int) -> None:
    """Record x = H_n · x in place over each run of n consecutive elements of x's rows (x F32
    [ne0, ne1, ne2] with contiguous rows, n a power of two from 2 to 1024 dividing ne0)."""
    if x.type is not F32 or n < 2 or n & (n - 1) or n > 1024 or x.ne[0] % n or x.ne[3] != 1:
        raise UnsupportedShape(f"hadamard: runs of {n} over {x!r}; needs F32 rows that divide into runs of a power "
                               "of two up to 1024")
    xr, xo, xs = f32_binding(x, "hadamard x")
    dev = seq.device
    k = kernel(dev, "hadamard", defines={"HALF": n // 2}, push=HADAMARD_PUSH)
    runs = x.ne[0] // n
    total = runs * x.ne[1] * x.ne[2]
    seq.dispatch(k, [xr], push=dict(runs=runs, ne1=x.ne[1], n=total, x_off=xo, s1=xs[0], s2=xs[1],
                                    scale=1.0 / math.sqrt(n)),
                 groups=grid(dev, total), label=f"hadamard {n}")
