"""Tensor: a typed, shaped, strided window into a buffer, with GGML's conventions.

`ne[0]` is the innermost dimension; `nb[i]` is the byte stride of dimension i. For block-
quantised types nb[0] is the bytes of one block and ne[0] a multiple of the block size. A numpy
array of shape (n3, n2, n1, n0) corresponds to ne = (n0, n1, n2, n3); `shape` gives the numpy
order of the tensor's `ndim` dimensions. Views (slice, permute, transpose, reshape) share memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..errors import GGMLTypeError, OutOfRange
from .allocator import allocate
from .buffer import BufferRange
from .ggml_types import GGMLType, ggml_type
from .memory_types import MemoryKind


def contiguous_strides(typ: GGMLType, ne: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    nb0 = typ.type_size
    nb1 = typ.row_bytes(ne[0])
    return (nb0, nb1, nb1 * ne[1], nb1 * ne[1] * ne[2])


def _ne4(shape_ne) -> tuple[int, int, int, int]:
    ne = tuple(int(x) for x in shape_ne)
    if not 1 <= len(ne) <= 4 or any(x < 1 for x in ne):
        raise OutOfRange(f"tensor dims must be 1 to 4 positive sizes, got {ne}")
    return ne + (1,) * (4 - len(ne))


def _ndim(ne, at_least: int) -> int:
    nontrivial = [i for i, n in enumerate(ne) if n > 1]
    return max(at_least, nontrivial[-1] + 1 if nontrivial else 1)


@dataclass(frozen=True)
class Tensor:
    """`buffer` + byte `offset` + GGML type, sizes `ne` and byte strides `nb` (4 each)."""

    buffer: object          # Buffer, or anything with .handle/.size/.label (e.g. a host import)
    offset: int
    type: GGMLType
    ne: tuple[int, int, int, int]
    nb: tuple[int, int, int, int]
    ndim: int = 4
    name: str = ""
    owner: object = None    # the Allocation keeping the memory, if this tensor created it

    # -- construction ----------------------------------------------------------------------------
    @staticmethod
    def on(rng, typ, ne, name: str = "") -> "Tensor":
        """A contiguous tensor at the start of BufferRange-like `rng` (which must be large enough)."""
        typ = ggml_type(typ)
        ne_t = tuple(int(x) for x in ne)
        ne4 = _ne4(ne_t)
        t = Tensor(rng.buffer, rng.offset, typ, ne4, contiguous_strides(typ, ne4), len(ne_t), name)
        if t.nbytes > rng.size:
            raise OutOfRange(f"tensor {name or ''} {typ.name}{list(ne_t)} needs {t.nbytes} bytes; "
                             f"the range has {rng.size}")
        return t

    @staticmethod
    def empty(device, typ, ne, name: str = "", kind: MemoryKind = MemoryKind.DEVICE) -> "Tensor":
        """A new contiguous tensor in suballocated memory; close() it (or its owner) to free."""
        typ = ggml_type(typ)
        ne_t = tuple(int(x) for x in ne)
        ne4 = _ne4(ne_t)
        nbytes = contiguous_strides(typ, ne4)[3] * ne4[3]
        alloc = allocate(device, nbytes, kind, label=name or f"{typ.name}{list(ne_t)}")
        return Tensor(alloc.buffer, alloc.offset, typ, ne4, contiguous_strides(typ, ne4), len(ne_t), name, alloc)

    @staticmethod
    def empty_group(device, specs, kind: MemoryKind = MemoryKind.DEVICE, align: int = 256) -> list["Tensor"]:
        """New contiguous tensors for `specs` ((type, ne, name) each) in one allocation, in order,
        each starting at a multiple of `align` from the first, which owns the allocation (so one
        binding can cover several of them)."""
        parts, end = [], 0
        for typ, ne, name in specs:
            typ = ggml_type(typ)
            ne_t = tuple(int(x) for x in ne)
            ne4 = _ne4(ne_t)
            end = -(-end // align) * align
            parts.append((end, typ, ne4, len(ne_t), name))
            end += contiguous_strides(typ, ne4)[3] * ne4[3]
        alloc = allocate(device, end, kind, label=" + ".join(name for *_, name in parts))
        return [Tensor(alloc.buffer, alloc.offset + off, typ, ne4, contiguous_strides(typ, ne4), ndim, name,
                       alloc if i == 0 else None) for i, (off, typ, ne4, ndim, name) in enumerate(parts)]

    def close(self) -> None:
        if self.owner is not None:
            self.owner.close()

    # -- geometry ---------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        """numpy order: (ne[ndim-1], ..., ne[0])."""
        return tuple(reversed(self.ne[:self.ndim]))

    @property
    def nelements(self) -> int:
        return math.prod(self.ne)

    @property
    def nbytes(self) -> int:
        """Bytes of the elements (as if contiguous)."""
        return self.type.row_bytes(self.ne[0]) * self.ne[1] * self.ne[2] * self.ne[3]

    @property
    def span(self) -> int:
        """Bytes from the first to one past the last byte any element occupies."""
        outer = sum((n - 1) * st for n, st in zip(self.ne[1:], self.nb[1:]))
        if self.type.quantized:  # dim 0 is always whole contiguous blocks
            return outer + self.type.row_bytes(self.ne[0])
        return outer + (self.ne[0] - 1) * self.nb[0] + self.type.type_size

    @property
    def element_size(self) -> int:
        if self.type.quantized:
            raise GGMLTypeError(f"{self.type.name} has no per-element size (block-quantised)")
        return self.type.type_size

    def is_contiguous(self) -> bool:
        """Elements packed in GGML order with no gaps; strides of size-1 dims do not matter."""
        want = contiguous_strides(self.type, self.ne)
        return all(n == 1 or nb == w for n, nb, w in zip(self.ne, self.nb, want))

    def is_transposed(self) -> bool:
        """2-D with dim 1 innermost: nb[1] is one element, nb[0] a column of ne[1] elements."""
        return (not self.type.quantized and self.ne[2] == self.ne[3] == 1 and self.nb[1] == self.type.type_size
                and self.nb[0] == self.ne[1] * self.type.type_size)

    def range(self) -> BufferRange:
        """The buffer bytes this tensor's elements occupy."""
        return BufferRange(self.buffer, self.offset, self.span)

    def overlaps(self, other: "Tensor") -> bool:
        """Whether the bytes the two tensors' elements span share any (same buffer)."""
        return self.buffer is other.buffer and self.offset < other.offset + other.span and \
            other.offset < self.offset + self.span

    def __repr__(self) -> str:
        dims = "x".join(str(n) for n in self.ne[:self.ndim])
        label = f"{self.name} " if self.name else ""
        return f"<Tensor {label}{self.type.name}[{dims}] nb={self.nb} @{self.offset}>"

    # -- views --------------------------------------------------------------------------------------
    def view(self, ne, nb=None, offset: int = 0, name: str | None = None) -> "Tensor":
        """A view with new sizes/strides starting `offset` bytes into this tensor."""
        ne_t = tuple(int(x) for x in ne)
        ne4 = _ne4(ne_t)
        nb4 = tuple(nb) + (0,) * (4 - len(nb)) if nb is not None else contiguous_strides(self.type, ne4)
        if nb is not None and len(nb) < 4:
            full = list(nb4)
            for i in range(len(nb), 4):  # continue contiguously; nb[0] of a quantised type is a block
                if i == 0:
                    full[i] = self.type.type_size
                elif i == 1:
                    full[i] = full[0] * ne4[0] // self.type.block_size
                else:
                    full[i] = full[i - 1] * ne4[i - 1]
            nb4 = tuple(full)
        t = replace(self, offset=self.offset + offset, ne=ne4, nb=nb4, ndim=len(ne_t),
                    name=self.name if name is None else name, owner=None)
        end = t.offset + t.span
        if offset < 0 or end > self.buffer.size:
            raise OutOfRange(f"view {t!r} reaches byte {end} of buffer {self.buffer.label!r} ({self.buffer.size})")
        return t

    def reshape(self, *ne) -> "Tensor":
        if not self.is_contiguous():
            raise OutOfRange(f"reshape needs a contiguous tensor; {self!r} is strided (copy it first)")
        if math.prod(ne) != self.nelements:
            raise OutOfRange(f"cannot reshape {self.nelements} elements into {list(ne)}")
        return self.view(ne)

    def permute(self, *axes: int) -> "Tensor":
        """GGML permute: source dim i becomes dim axes[i]."""
        if sorted(axes) != [0, 1, 2, 3]:
            raise OutOfRange(f"permute needs a permutation of 0..3, got {axes}")
        ne, nb = [0] * 4, [0] * 4
        for i, a in enumerate(axes):
            ne[a], nb[a] = self.ne[i], self.nb[i]
        return replace(self, ne=tuple(ne), nb=tuple(nb), ndim=_ndim(ne, self.ndim), owner=None)

    def transpose(self) -> "Tensor":
        """Swap dims 0 and 1 (a view; the result is not contiguous)."""
        return replace(self, ne=(self.ne[1], self.ne[0], *self.ne[2:]), nb=(self.nb[1], self.nb[0], *self.nb[2:]),
                       ndim=max(self.ndim, 2), owner=None)

    def slice(self, dim: int, start: int, stop: int) -> "Tensor":
        """Elements start..stop-1 along `dim` (for quantised dim 0, block-aligned)."""
        if dim not in range(4):
            raise OutOfRange(f"slice of dim {dim}: a tensor has dims 0..3")
        if not 0 <= start < stop <= self.ne[dim]:
            raise OutOfRange(f"slice {start}:{stop} of dim {dim} (size {self.ne[dim]})")
        ne = list(self.ne)
        ne[dim] = stop - start
        if dim == 0 and self.type.quantized:
            off = self.type.row_bytes(start)
        else:
            off = start * self.nb[dim]
        return replace(self, offset=self.offset + off, ne=tuple(ne), owner=None)
