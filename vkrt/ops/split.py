"""Splitting an op over tensors that one storage-buffer binding cannot hold.

A binding covers at most maxStorageBufferRange bytes (128 MiB on lavapipe). Ops that iterate
over one index space shared by several tensors (same `ne`) cut that space into blocks whose
slices of every tensor fit a binding, and dispatch once per block.
"""

from __future__ import annotations

from ..errors import OutOfRange
from ..memory import Tensor
from .binding import fits_binding


def binding_pieces(tensors: list[Tensor]) -> list[list[Tensor]]:
    """Lists of same-position slices of `tensors` (all with the same ne) that each fit one
    binding, covering the whole index space. One list (the tensors themselves) when they fit."""
    ne = tensors[0].ne
    if any(t.ne != ne for t in tensors):
        raise OutOfRange(f"binding_pieces needs tensors of one shape, got {[t.ne for t in tensors]}")
    if all(fits_binding(t) for t in tensors):
        return [list(tensors)]
    # halve the dimension that stretches some tensor over the most bytes
    dims = [d for d in range(4) if ne[d] > 1]
    if not dims:
        raise OutOfRange(f"a single element of {tensors[0]!r} does not fit a storage-buffer binding")
    d = max(dims, key=lambda d: max(t.nb[d] * (ne[d] - 1) for t in tensors))
    half = ne[d] // 2
    pieces = []
    for start, stop in ((0, half), (half, ne[d])):
        pieces += binding_pieces([t.slice(d, start, stop) for t in tensors])
    return pieces
