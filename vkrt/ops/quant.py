"""Weight types in the generic kernels (shaders/quant/): which types have kernels, the define
that selects one, and cutting weights into chunks that fit one storage binding (bound as words:
binding.bind_words)."""

from __future__ import annotations

from ..errors import GGMLTypeError, UnsupportedShape
from ..memory import TYPES, GGMLType, Tensor, ggml_type
from ..pipeline.quant_tables import grid_base
from .binding import WORD_ALIGN, RangeTooLarge, binding_limit

# types whose includes read large lookup tables (IQ_GRID in shaders/quant/<type>.glsl)
TABLE_TYPES = ("IQ3_XXS", "IQ3_S", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M")
CODEBOOK_TYPES = ("IQ4_NL", "IQ4_XS", "MXFP4")


def supported_types() -> list[GGMLType]:
    """The types the dequantise and matmul kernels read."""
    return [t for t in TYPES.values() if t.glsl]


def kernel_type(typ, what: str = "weight") -> GGMLType:
    """`typ` as a GGMLType, or a GGMLTypeError naming it and the supported types."""
    t = ggml_type(typ)
    if not t.glsl:
        names = ", ".join(s.name for s in supported_types())
        raise GGMLTypeError(f"{what}: type {t.name} has no vkrt kernels; supported types are {names}")
    return t


def type_defines(t: GGMLType, tuning) -> dict[str, int]:
    """The define that makes shaders/quant/types.glsl include `t`'s block layout, and where the
    tuning says so, that its lookup tables or codebook are read from shared memory (iq_common.glsl),
    the tables filled from the device's grid buffer (pipeline/quant_tables.py)."""
    defines = {f"QTYPE_{t.name}": 1}
    if tuning.quant_tables_shared and t.name in TABLE_TYPES:
        defines["QTABLES_SHARED"] = 1
        if tuning.quant_tables_buffer:
            defines["QTABLES_BUFFER"] = 1
            defines["QGRID_BASE"] = grid_base(t.glsl)
    if tuning.quant_codebook_shared and t.name in CODEBOOK_TYPES:
        defines["QCODEBOOK_SHARED"] = 1
    return defines


def exact_defines(t: GGMLType, device) -> dict[str, int]:
    """type_defines for kernels whose values must equal gguf.quants.dequantize bit for bit
    (dequant, get_rows): fp32 subnormals kept where the device can (common.glsl)."""
    defines = type_defines(t, device.tuning)
    if device.profile.denorm_preserve_fp32:
        defines["DENORM_PRESERVE"] = 1
    return defines


def block_align(t: GGMLType) -> int:
    """Byte alignment the kernels assume for blocks of `t` (QALIGN in its include)."""
    return 4 if t.type_size % 4 == 0 else 2 if t.type_size % 2 == 0 else 1


def check_layout(t: Tensor, what: str) -> None:
    """Dim 0 contiguous whole blocks; rows and slabs at offsets the word reads can reach."""
    if not t.type.quantized and t.nb[0] != t.type.type_size:
        raise UnsupportedShape(f"{what} {t!r}: dim 0 must be contiguous (nb[0] = {t.type.type_size}), got {t.nb[0]}")
    a = block_align(t.type)
    bad = [f"offset {t.offset}"] if t.offset % a else []
    bad += [f"nb[{i}] = {t.nb[i]}" for i in (1, 2, 3) if t.ne[i] > 1 and t.nb[i] % a]
    if bad:
        raise UnsupportedShape(f"{what} {t!r}: {t.type.name} data must be {a}-byte aligned; {', '.join(bad)} is not")


def chunks(dim: int, device, max_binding: int | None, *tensors: Tensor) -> list[tuple[int, int]]:
    """Split dim `dim` (the same size in every tensor) into [start, stop) pieces whose bytes fit
    one binding in each tensor."""
    slack = max(device.profile.min_storage_buffer_offset_alignment, WORD_ALIGN) + 4
    usable = binding_limit(device, max_binding) - slack
    n = tensors[0].ne[dim]
    per = n
    for t in tensors:
        one = t.slice(dim, 0, 1).span
        if one > usable:
            raise RangeTooLarge(f"{t!r}: one slice along dim {dim} spans {one} bytes; one binding may cover "
                                f"{usable + slack}")
        if n > 1:
            per = min(per, (usable - one) // max(t.nb[dim], 1) + 1)
    return [(a, min(a + per, n)) for a in range(0, n, per)]


def flat_rows(t: Tensor) -> Tensor | None:
    """t as a 2-D view (ne0, ne1 * ne2 * ne3) when its rows are evenly spaced, else None."""
    if any(t.ne[i] > 1 and t.nb[i] != t.nb[1] * t.ne[1] * (t.ne[2] if i == 3 else 1) for i in (2, 3)):
        return None
    return t.view((t.ne[0], t.ne[1] * t.ne[2] * t.ne[3]), (t.nb[0], t.nb[1]), offset=0)
