"""Shared plumbing for row-wise f32 ops: element offsets and strides of bound tensors."""

from __future__ import annotations

from ..errors import GGMLTypeError, OutOfRange
from ..memory import F32, Tensor
from .binding import bind_tensor


def f32_binding(t: Tensor, what: str):
    """(BufferRange, element offset, element strides nb1..nb3) of an f32 tensor with unit stride in dim 0."""
    if t.type is not F32:
        raise GGMLTypeError(f"{what}: expected an F32 tensor, got {t.type.name}")
    if t.nb[0] != 4:
        raise OutOfRange(f"{what}: dim 0 must be contiguous (nb[0] = 4), got nb = {t.nb}")
    if any(s % 4 for s in t.nb):
        raise OutOfRange(f"{what}: strides {t.nb} are not multiples of 4 bytes")
    rng, off = bind_tensor(t)
    return rng, off // 4, (t.nb[1] // 4, t.nb[2] // 4, t.nb[3] // 4)


def same_shape(a: Tensor, b: Tensor, what: str) -> None:
    if a.ne != b.ne:
        raise OutOfRange(f"{what}: shapes differ: {list(a.ne)} vs {list(b.ne)}")


def row_groups(nrows: int, device) -> tuple[int, int, int]:
    """A workgroup per row, folded into y beyond the x limit."""
    max_x = min(device.profile.max_workgroup_count[0], 65535)
    if nrows <= max_x:
        return (nrows, 1, 1)
    return (max_x, -(-nrows // max_x), 1)
