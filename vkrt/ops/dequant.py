"""Dequantise any supported weight type to f32, bit-exact with gguf.quants.dequantize."""

from __future__ import annotations

from ..errors import UnsupportedShape
from ..memory import F32, Tensor
from ..pipeline import PushConstants, kernel
from .binding import bind_words
from .grid import ceil_div, groups_for
from .quant import check_layout, chunks, exact_defines, flat_rows, kernel_type

DEQUANT_PUSH = PushConstants(("ne0", "u32"), ("rows", "u32"), ("w_off", "u32"), ("w_row", "u32"),
                             ("d_off", "u32"), ("d_row", "u32"))


def _planes(src: Tensor, dst: Tensor) -> list[tuple[Tensor, Tensor]]:
    """(src, dst) as pairs of 2-D (ne0, rows) views: one pair when both have evenly spaced rows,
    else one per (i2, i3)."""
    fs, fd = flat_rows(src), flat_rows(dst)
    if fs is not None and fd is not None:
        return [(fs, fd)]
    return [tuple(t.view((t.ne[0], t.ne[1]), (t.nb[0], t.nb[1]), offset=i2 * t.nb[2] + i3 * t.nb[3])
                  for t in (src, dst))
            for i3 in range(src.ne[3]) for i2 in range(src.ne[2])]


def dequantize(seq, src: Tensor, dst: Tensor, *, max_binding: int | None = None) -> None:
    """Record dst = src converted to f32. dst is F32 with src's sizes and contiguous rows.
    Tensors larger than one storage binding (or `max_binding` bytes) are done in row ranges."""
    typ = kernel_type(src.type, f"dequantize {src.name or 'src'}")
    if dst.type != F32 or dst.ne != src.ne:
        raise UnsupportedShape(f"dequantize: dst must be F32{list(src.ne)}, got {dst.type.name}{list(dst.ne)}")
    if dst.nb[0] != 4 or dst.offset % 4:
        raise UnsupportedShape(f"dequantize: dst {dst!r} needs contiguous, 4-byte aligned rows")
    check_layout(src, "dequantize source")
    device = seq.device
    k = kernel(device, "dequant", defines=exact_defines(typ, device), push=DEQUANT_PUSH,
               workgroup=(device.tuning.wg_size,))
    groups = ceil_div(src.ne[0], 4)
    for s2, d2 in _planes(src, dst):
        for a, b in chunks(1, device, max_binding, s2, d2):
            wr, wo = bind_words(s2.slice(1, a, b), "dequantize src", device, max_binding)
            dr, do = bind_words(d2.slice(1, a, b), "dequantize dst", device, max_binding)
            seq.dispatch(k, [wr, dr], push={"ne0": src.ne[0], "rows": b - a, "w_off": wo, "w_row": s2.nb[1],
                                            "d_off": do // 4, "d_row": d2.nb[1] // 4},
                         groups=groups_for(k, groups * (b - a)))
