"""Shared plumbing for row-wise f32 ops: shape checks and the operands of logit-row ops."""

from __future__ import annotations

from ..errors import OutOfRange, UnsupportedShape
from ..memory import F32, I32, Tensor
from .binding import bind_tensor


def same_shape(a: Tensor, b: Tensor, what: str) -> None:
    if a.ne != b.ne:
        raise OutOfRange(f"{what}: shapes differ: {list(a.ne)} vs {list(b.ne)}")


def logits_and_table(x: Tensor, table: Tensor, words: int, what: str, table_what: str, device) -> dict:
    """The operands of an op that changes F32 logit rows x ((n,) or (n, rows), contiguous rows) in
    place from an I32 table of at least `words` words: push fields x_off, x_row, n, a_off, rows,
    and the two bindings under "bindings"."""
    n, rows = x.ne[0], x.ne[1]
    if x.type != F32 or x.nb[0] != 4 or x.nelements != n * rows or x.nb[1] % 4:
        raise UnsupportedShape(f"{what} need F32 logits (n,) or (n, rows), got {x!r}")
    if table.type != I32 or table.nelements < words:
        raise UnsupportedShape(f"{table_what} must be I32 of >= {words} words, got {table!r}")
    xr, xo = bind_tensor(x, f"{what} logits", device)
    ar, ao = bind_tensor(table, table_what, device)
    return {"bindings": [xr, ar], "x_off": xo // 4, "x_row": x.nb[1] // 4 if rows > 1 else n, "n": n,
            "a_off": ao // 4, "rows": rows}
