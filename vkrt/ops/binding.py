"""Binding tensors to kernels: `bind` is the one place an operand's type, layout, offset,
alignment and size are checked (errors name the op and operand) and its descriptor range is
chosen, aligned and within maxStorageBufferRange. The presets (bind_tensor, bind_words,
f32_binding, bind_elements) only pick its options and the shape of what it returns;
bind_together covers several tensors of one buffer with one range."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import GGMLTypeError, OutOfRange
from ..memory import F32, BufferRange, GGMLType, Tensor

U32_MAX = 0xFFFFFFFF
WORD_ALIGN = 16  # word operands' binding starts are 16-byte aligned, so f32 ones can be read as vec4


class RangeTooLarge(OutOfRange):
    """A tensor spans more bytes than one storage-buffer binding may; split the dispatch."""


@dataclass(frozen=True)
class Bound:
    """A tensor bound to a kernel: the range to bind, the byte offset of its first element inside
    that range, and in the kernel's index units (`unit` bytes) that offset and its strides."""

    range: BufferRange
    byte_offset: int
    unit: int
    strides: tuple[int, int, int, int]

    @property
    def offset(self) -> int:
        return self.byte_offset // self.unit


def binding_limit(device, max_binding: int | None = None) -> int:
    """Bytes one storage-buffer binding may cover (maxStorageBufferRange, or less when asked)."""
    limit = device.profile.max_storage_buffer_range
    return min(limit, max_binding) if max_binding else limit


def bind(t: Tensor, what: str, device=None, *, unit: int | None = None, dtype: GGMLType | None = None,
         contiguous: bool = False, min_align: int = 1, max_binding: int | None = None,
         whole_words: bool = False) -> Bound:
    """Bind `t` for a kernel; `what` ("op operand") names it in every error.

    dtype: the type t must have. unit: the bytes a kernel index counts (4 for f32 or word
    operands, the element size for plain elements; None: bytes, unchecked): t's offset inside
    the range and its strides must be whole units, and its units indexable with 32 bits. contiguous: dim 0 must be one unit
    apart (nb[0] == unit). The range starts at t's offset rounded down to
    minStorageBufferOffsetAlignment (or `min_align` if larger) and ends at its last byte rounded
    up to 4, clamped to the buffer, or with `whole_words` an error when the buffer ends inside
    that word. Raises RangeTooLarge when it exceeds one binding (`binding_limit`): bind slices
    (`t.slice`) in several dispatches.
    """
    device = device or t.buffer.device
    if t.buffer.device is not device:   # another device's memory: undefined in this device's descriptor set
        raise OutOfRange(f"{what}: {t!r} lives on {t.buffer.device.profile.name!r}, not on the dispatch's device "
                         f"{device.profile.name!r} (logical devices of one GPU included)")
    if dtype is not None and t.type is not dtype:
        raise GGMLTypeError(f"{what}: expected an {dtype.name} tensor, got {t.type.name}")
    if contiguous and t.nb[0] != unit:
        raise OutOfRange(f"{what}: dim 0 must be contiguous (nb[0] = {unit}), got nb = {t.nb}")
    align = max(device.profile.min_storage_buffer_offset_alignment, min_align)
    start = t.offset // align * align
    end = -(-(t.offset + t.span) // 4) * 4
    if end > t.buffer.size:
        if whole_words:
            raise OutOfRange(f"{what}: {t!r} ends at byte {t.offset + t.span} of buffer {t.buffer.label!r}, "
                             f"whose {t.buffer.size} bytes are not a whole number of 32-bit words")
        end = t.buffer.size
    limit = binding_limit(device, max_binding)
    if end - start > limit:
        raise RangeTooLarge(f"{what}: {t!r} spans {end - start} bytes; one binding may cover {limit}")
    first = t.offset - start
    if unit is None:
        return Bound(BufferRange(t.buffer, start, end - start), first, 1, tuple(t.nb))
    if first % unit or any(nb % unit for nb in t.nb):
        raise OutOfRange(f"{what}: {t!r} has an offset or stride that is not a multiple of {unit} bytes")
    strides = tuple(nb // unit for nb in t.nb)
    if -(-(end - start) // unit) > U32_MAX or max(strides) > U32_MAX:
        raise OutOfRange(f"{what}: {t!r} spans more elements than 32-bit indices reach")
    return Bound(BufferRange(t.buffer, start, end - start), first, unit, strides)


def bind_tensor(t: Tensor, what: str, device=None, **options) -> tuple[BufferRange, int]:
    """`bind` as (range, byte offset of t's first element inside it)."""
    b = bind(t, what, device, **options)
    return b.range, b.byte_offset


def bind_words(t: Tensor, what: str, device, max_binding: int | None = None) -> tuple[BufferRange, int]:
    """`bind` as uint[] / float[] (weights and their f32 operands): (range, byte offset of t's
    first element inside it)."""
    return bind_tensor(t, what, device, min_align=WORD_ALIGN, max_binding=max_binding, whole_words=True)


def f32_binding(t: Tensor, what: str):
    """`bind` of an F32 tensor with contiguous rows: (range, float offset, float strides nb1..nb3)."""
    b = bind(t, what, unit=4, dtype=F32, contiguous=True)
    return b.range, b.offset, b.strides[1:]


def bind_elements(t: Tensor, what: str) -> Bound:
    """`bind` in units of t's elements (offset and strides whole elements, 32-bit indices)."""
    return bind(t, what, unit=t.type.type_size)


def fits_binding(t: Tensor, max_binding: int | None = None) -> bool:
    """Whether `t` fits one storage-buffer binding."""
    try:
        bind(t, "fits_binding", max_binding=max_binding)
    except RangeTooLarge:
        return False
    return True


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
