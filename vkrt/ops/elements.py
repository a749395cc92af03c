"""Tensors of plain 16/32-bit elements as kernels see them: bound range, element offset and
element strides, and the shader defines of their types (shaders/elements.glsl)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import GGMLTypeError, OutOfRange
from ..memory import BufferRange, GGMLType, Tensor
from .binding import RangeTooLarge, bind_tensor

U32_MAX = 0xFFFFFFFF


@dataclass(frozen=True)
class Bound:
    """A tensor bound to a kernel: the range to bind, the element index of its first element
    inside that range, and its strides in elements."""

    range: BufferRange
    offset: int
    strides: tuple[int, int, int, int]


def element_bits(typ: GGMLType, what: str) -> int:
    """16 or 32 for a plain type whose elements kernels move as raw bits."""
    if typ.quantized or typ.type_size not in (2, 4):
        raise GGMLTypeError(f"{what}: {typ.name} is not a type of 2- or 4-byte elements")
    return 8 * typ.type_size


def type_defines(prefix: str, typ: GGMLType, what: str) -> dict[str, int]:
    return {f"{prefix}_TYPE": typ.id, f"{prefix}_BITS": element_bits(typ, what)}


def storage_defines(device) -> dict[str, int]:
    """16-bit elements are uint16_t where the device has 16-bit storage, halves of words otherwise."""
    return {"STORAGE16": int(bool(device.profile.storage_16bit))}


def fits_binding(t: Tensor) -> bool:
    try:
        bind_tensor(t)
    except RangeTooLarge:
        return False
    return True


def bind_elements(t: Tensor, what: str) -> Bound:
    """Bind `t`; raises OutOfRange when its offset or strides are not whole elements or the
    element indices would not fit the kernels' 32-bit push constants."""
    size = t.type.type_size
    rng, first = bind_tensor(t)
    if first % size or any(nb % size for nb in t.nb):
        raise OutOfRange(f"{what}: {t!r} has an offset or stride that is not a multiple of its "
                         f"{size}-byte elements")
    strides = tuple(nb // size for nb in t.nb)
    if (rng.size + size - 1) // size > U32_MAX or max(strides) > U32_MAX:
        raise OutOfRange(f"{what}: {t!r} spans more elements than 32-bit indices reach")
    return Bound(rng, first // size, strides)
