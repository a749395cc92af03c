"""transpose: dst[.., i0, i1] = src[.., i1, i0] through 32x32 shared-memory tiles, batched over
dims 2-3, for 16- and 32-bit elements with rows contiguous on both sides (any row strides)."""

from __future__ import annotations

from ..errors import GGMLTypeError, OutOfRange
from ..memory import Tensor
from ..pipeline import PushConstants, kernel
from .binding import bind_elements
from .copy import check_destination
from .elements import element_bits, storage_defines
from .grid import ceil_div
from .split import binding_pieces

TRANSPOSE_PUSH = PushConstants(("ne0", "u32"), ("ne1", "u32"), ("ne2", "u32"), ("nbatch", "u32"),
                               ("src_nb", "u32[4]"), ("dst_nb", "u32[4]"), ("src_off", "u32"), ("dst_off", "u32"))


def tile_shape(device) -> tuple[int, int]:
    """(tile edge, rows per pass): the workgroup is tile x rows invocations."""
    return device.tuning.transpose_tile, device.tuning.transpose_rows


def transpose_kernel(device, shader: str, push: PushConstants, bits: int):
    tile, rows = tile_shape(device)
    return kernel(device, shader, push=push, workgroup=(tile, rows),
                  defines={"TILE": tile, "BITS": bits, **storage_defines(device)})


def transpose(seq, src: Tensor, dst: Tensor) -> None:
    """Record the materialised transpose of dims 0 and 1 of `src` into `dst`."""
    what = f"transpose {src.type.name}"
    if src.type != dst.type:
        raise GGMLTypeError(f"{what}: destination is {dst.type.name}; transpose does not convert")
    bits = element_bits(src.type, what)
    want = (src.ne[1], src.ne[0], src.ne[2], src.ne[3])
    if dst.ne != want:
        raise OutOfRange(f"{what}: destination of {src!r} must have ne {want}, got {dst!r}")
    size = src.type.type_size
    if src.nb[0] != size or dst.nb[0] != size:
        raise OutOfRange(f"{what}: rows must be contiguous (nb[0] == {size}) in {src!r} and {dst!r}; "
                         "use copy for other layouts")
    check_destination(dst, what)
    dev = seq.device
    k = transpose_kernel(dev, "transpose", TRANSPOSE_PUSH, bits)
    tile, _ = tile_shape(dev)
    limit = dev.profile.max_workgroup_count
    for s, dt in binding_pieces([src, dst.transpose()]):
        d = dt.transpose()
        bs, bd = bind_elements(s, what), bind_elements(d, what)
        nbatch = s.ne[2] * s.ne[3]
        groups = (min(ceil_div(s.ne[0], tile), limit[0]), min(ceil_div(s.ne[1], tile), limit[1]), min(nbatch, limit[2]))
        push = {"ne0": s.ne[0], "ne1": s.ne[1], "ne2": s.ne[2], "nbatch": nbatch, "src_nb": bs.strides,
                "dst_nb": bd.strides, "src_off": bs.offset, "dst_off": bd.offset}
        seq.dispatch(k, [bs.range, bd.range], push=push, groups=groups, label="transpose")
