"""copy: dst = src converted to dst's type (f32 <-> f16, bf16 -> f32/f16, or same-type bits),
for any strides of both tensors in all four dims."""

from __future__ import annotations

from ..errors import GGMLTypeError, OutOfRange
from ..memory import BF16, F16, F32, Tensor
from ..pipeline import PushConstants, kernel
from .binding import U32_MAX, bind_elements
from .elements import element_bits, storage_defines, type_defines
from .grid import groups_for
from .split import binding_pieces

COPY_PUSH = PushConstants(("n", "u32"), ("ne0", "u32"), ("ne1", "u32"), ("ne2", "u32"),
                          ("src_nb", "u32[4]"), ("dst_nb", "u32[4]"), ("src_off", "u32"), ("dst_off", "u32"))

CONVERSIONS = {(F32, F16), (F16, F32), (BF16, F32), (BF16, F16)}


def check_types(src_type, dst_type, what: str) -> None:
    """Same type (any 2- or 4-byte plain type, moved as bits) or one of CONVERSIONS."""
    if src_type == dst_type:
        element_bits(src_type, what)
    elif (src_type, dst_type) not in CONVERSIONS:
        pairs = ", ".join(f"{a.name}->{b.name}" for a, b in sorted(CONVERSIONS, key=lambda p: (p[0].id, p[1].id)))
        raise GGMLTypeError(f"{what}: cannot convert {src_type.name} to {dst_type.name}; "
                            f"supported: same type, {pairs}")


def check_destination(dst: Tensor, what: str) -> None:
    if any(nb == 0 and n > 1 for n, nb in zip(dst.ne, dst.nb)):
        raise OutOfRange(f"{what}: destination {dst!r} has a zero stride; its elements would overlap")


def _same_shape(src: Tensor, dst: Tensor) -> tuple[Tensor, Tensor]:
    """Give src and dst one index space: a contiguous side is re-viewed in the other's shape."""
    if src.ne == dst.ne:
        return src, dst
    if src.nelements != dst.nelements:
        raise OutOfRange(f"copy: {src!r} has {src.nelements} elements, {dst!r} has {dst.nelements}")
    if dst.is_contiguous():
        return src, dst.view(src.ne)
    if src.is_contiguous():
        return src.view(dst.ne), dst
    raise OutOfRange(f"copy: {src!r} and {dst!r} differ in shape and neither is contiguous")


def copy(seq, src: Tensor, dst: Tensor) -> None:
    """Record dst[i] = src[i] (flat GGML order when the shapes differ, one side contiguous)."""
    what = f"copy {src.type.name}->{dst.type.name}"
    check_types(src.type, dst.type, what)
    check_destination(dst, what)
    src, dst = _same_shape(src, dst)
    if src.type == dst.type and src.is_contiguous() and dst.is_contiguous():
        seq.copy(src.range(), dst.range(), label="copy")
        return
    dev = seq.device
    k = kernel(dev, "copy", push=COPY_PUSH, workgroup=(dev.tuning.wg_size,),
               defines={**type_defines("SRC", src.type, what), **type_defines("DST", dst.type, what),
                        **storage_defines(dev)})
    for s, d in binding_pieces([src, dst]):
        if s.nelements > U32_MAX:
            raise OutOfRange(f"{what}: {s.nelements} elements in one dispatch exceed 32-bit indices")
        bs, bd = bind_elements(s, what), bind_elements(d, what)
        push = {"n": s.nelements, "ne0": s.ne[0], "ne1": s.ne[1], "ne2": s.ne[2],
                "src_nb": bs.strides, "dst_nb": bd.strides, "src_off": bs.offset, "dst_off": bd.offset}
        seq.dispatch(k, [bs.range, bd.range], push=push, groups=groups_for(k, s.nelements), label="copy")
