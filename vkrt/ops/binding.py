"""Binding tensors to kernels: aligned descriptor ranges within maxStorageBufferRange."""

from __future__ import annotations

from ..errors import OutOfRange
from ..memory import BufferRange, Tensor


class RangeTooLarge(OutOfRange):
    """A tensor spans more bytes than one storage-buffer binding may; split the dispatch."""


def bind_tensor(t: Tensor, device=None) -> tuple[BufferRange, int]:
    """(range to bind, byte offset of the tensor's first element inside it).

    The range starts at the tensor's offset rounded down to minStorageBufferOffsetAlignment
    and ends at its last byte (rounded up to 4 where the buffer allows). Raises RangeTooLarge
    when that exceeds maxStorageBufferRange: bind slices (`t.slice`) in several dispatches.
    """
    profile = (device or t.buffer.device).profile
    align = profile.min_storage_buffer_offset_alignment
    start = t.offset // align * align
    end = min(-(-(t.offset + t.span) // 4) * 4, t.buffer.size)
    size = end - start
    if size > profile.max_storage_buffer_range:
        raise RangeTooLarge(f"{t!r} spans {size} bytes; one binding may cover {profile.max_storage_buffer_range}")
    return BufferRange(t.buffer, start, size), t.offset - start


def rows_per_binding(t: Tensor, device=None) -> int:
    """How many dim-1 rows of `t` (with its dim-1 stride) fit in one binding, allowing for the
    worst-case alignment slack at the start."""
    profile = (device or t.buffer.device).profile
    usable = profile.max_storage_buffer_range - profile.min_storage_buffer_offset_alignment
    row = max(t.nb[1], 1)
    first = t.type.row_bytes(t.ne[0]) if t.type.quantized else (t.ne[0] - 1) * t.nb[0] + t.type.type_size
    return max(1, (usable - first) // row + 1)
