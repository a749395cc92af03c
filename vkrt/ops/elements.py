"""Plain 16/32-bit element types as kernels see them: their bit widths and the shader defines
of their types (shaders/elements.glsl); binding.bind_elements binds such tensors."""

from __future__ import annotations

from ..errors import GGMLTypeError
from ..memory import GGMLType

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

