"""Binding tensors to kernels: aligned descriptor ranges within maxStorageBufferRange."""

from __future__ import annotations

from ..errors import OutOfRange
from ..memory import BufferRange, Tensor


class RangeTooLarge(OutOfRange):
    """A tensor spans more bytes than one storage-buffer binding may; split the dispatch."""


def binding_limit(device, max_binding: int | None = None) -> int:
    """Bytes one storage-buffer binding may cover (maxStorageBufferRange, or less when asked)."""
    limit = device.profile.max_storage_buffer_range
    return min(limit, max_binding) if max_binding else limit


def bind_tensor(t: Tensor, device=None, *, min_align: int = 1, max_binding: int | None = None,
                whole_words: bool = False) -> tuple[BufferRange, int]:
    """(range to bind, byte offset of the tensor's first element inside it).

    The range starts at the tensor's offset rounded down to minStorageBufferOffsetAlignment (or
    `min_align` if larger) and ends at its last byte rounded up to 4 — clamped to the buffer, or
    with `whole_words` an error when the buffer ends inside that word. Raises RangeTooLarge when
    it exceeds one binding (`binding_limit`): bind slices (`t.slice`) in several dispatches.
    """
    device = device or t.buffer.device
    align = max(device.profile.min_storage_buffer_offset_alignment, min_align)
    start = t.offset // align * align
    end = -(-(t.offset + t.span) // 4) * 4
    if end > t.buffer.size:
        if whole_words:
            raise OutOfRange(f"{t!r} ends at byte {t.offset + t.span} of buffer {t.buffer.label!r}, whose "
                             f"{t.buffer.size} bytes are not a whole number of 32-bit words")
        end = t.buffer.size
    limit = binding_limit(device, max_binding)
    if end - start > limit:
        raise RangeTooLarge(f"{t!r} spans {end - start} bytes; one binding may cover {limit}")
    return BufferRange(t.buffer, start, end - start), t.offset - start


def bind_together(tensors, device, *, min_align: int = 1, max_binding: int | None = None):
    """One range covering every tensor of `tensors` (all in one buffer) and each one's byte offset
    inside it; None when they lie in different buffers or together exceed one binding."""
    buf = tensors[0].buffer
    if any(t.buffer is not buf for t in tensors):
        return None
    align = max(device.profile.min_storage_buffer_offset_alignment, min_align)
    start = min(t.offset for t in tensors) // align * align
    end = -(-max(t.offset + t.span for t in tensors) // 4) * 4
    if end > buf.size or end - start > binding_limit(device, max_binding):
        return None
    return BufferRange(buf, start, end - start), [t.offset - start for t in tensors]
