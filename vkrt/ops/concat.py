"""concat: dst = a ++ b along one dim, f32/f16/i32 (sources converted to dst's float type).

The generic kernel computes every destination element from its indices and reads the source
wherever its strides say, which is catastrophic for a source stored transposed: neighbouring
threads then read elements a whole column apart. The fast path (docs/ARCHITECTURE.md §4)
handles concat along dim 0 of a row-major source and a transposed 2-D one in a single dispatch:
a coalesced copy of the row-major source into its columns and a tiled shared-memory transpose
of the other into the remaining columns. `path="generic"` forces the generic kernel (for
comparisons); `path="fast"` insists on the fast path.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import GGMLTypeError, OutOfRange, VkrtError
from ..memory import I32, Tensor
from ..pipeline import PushConstants, kernel
from .copy import check_destination, check_types, copy
from .binding import U32_MAX, bind_elements, fits_binding
from .elements import storage_defines, type_defines
from .grid import ceil_div, grid, groups_for
from .transpose import tile_shape, transpose_kernel

CONCAT_PUSH = PushConstants(("n", "u32"), ("ne0", "u32"), ("ne1", "u32"), ("ne2", "u32"), ("dim", "u32"),
                            ("split", "u32"), ("a_nb", "u32[4]"), ("b_nb", "u32[4]"), ("dst_nb", "u32[4]"),
                            ("a_off", "u32"), ("b_off", "u32"), ("dst_off", "u32"))
FAST_PUSH = PushConstants(*((name, "u32") for name in (
    "rows", "ctg_cols", "trp_cols", "trp_row", "dst_row", "ctg_off", "trp_off", "dst_ctg_off",
    "dst_trp_off", "copy_groups", "copy_col_blocks", "row_tiles")))

PATHS = ("auto", "generic", "fast")


@dataclass(frozen=True)
class FastPlan:
    """The fast path's view of a concat: the row-major source `ctg` goes to dst columns
    [ctg_col, ctg_col + ctg.ne[0]), the transposed source `trp` to [trp_col, trp_col + trp.ne[0])."""

    ctg: Tensor
    trp: Tensor
    ctg_col: int
    trp_col: int


def fast_plan(a: Tensor, b: Tensor, dst: Tensor, dim: int) -> FastPlan | str:
    """A FastPlan when the transposed-source fast path applies, else the guard that rejects it."""
    if dim != 0:
        return f"concat along dim {dim}, not 0"
    if not a.type == b.type == dst.type:
        return f"mixed types {a.type.name}, {b.type.name} -> {dst.type.name}"
    if a.type.quantized or a.type.type_size not in (2, 4):
        return f"{a.type.name} elements are not 2 or 4 bytes"
    if not (a.ne[1] == b.ne[1] == dst.ne[1] and a.ne[0] + b.ne[0] == dst.ne[0]
            and a.ne[2:] == b.ne[2:] == dst.ne[2:] == (1, 1)):
        return f"shapes {a.ne} + {b.ne} -> {dst.ne} are not 2-D and matching"
    if not dst.is_contiguous():
        return "destination is not contiguous"

    def transposed(t: Tensor) -> bool:
        return t.is_transposed() and not t.is_contiguous()

    if transposed(b) and a.is_contiguous():
        plan = FastPlan(a, b, 0, a.ne[0])
    elif transposed(a) and b.is_contiguous():
        plan = FastPlan(b, a, a.ne[0], 0)
    else:
        return "needs one contiguous source and one stored transposed (nb[1] == element size)"
    size = a.type.type_size
    if any(t.offset % size for t in (a, b, dst)):
        return "an offset is not a multiple of the element size"
    if not all(fits_binding(t) for t in (a, b, dst)):
        return "a tensor does not fit one storage-buffer binding"
    if dst.nelements > U32_MAX:
        return "element indices do not fit 32-bit push constants"
    return plan


def _check(a: Tensor, b: Tensor, dst: Tensor, dim: int, what: str) -> None:
    if not 0 <= dim <= 3:
        raise OutOfRange(f"{what}: dim must be 0..3, got {dim}")
    for name, t in (("a", a), ("b", b)):
        if (t.type == I32) != (dst.type == I32):
            raise GGMLTypeError(f"{what}: i32 concatenates only with i32 (source {name} is {t.type.name})")
        check_types(t.type, dst.type, what)
    for d in range(4):
        want = a.ne[d] + b.ne[d] if d == dim else a.ne[d]
        if (d != dim and b.ne[d] != a.ne[d]) or dst.ne[d] != want:
            raise OutOfRange(f"{what}: shapes {a.ne} + {b.ne} along dim {dim} do not give {dst.ne}")
    check_destination(dst, what)


def concat(seq, a: Tensor, b: Tensor, dst: Tensor, dim: int, *, path: str = "auto") -> str:
    """Record dst = concat(a, b) along `dim`; returns the path taken ("fast" or "generic")."""
    what = f"concat {a.type.name}+{b.type.name}->{dst.type.name} along dim {dim}"
    if path not in PATHS:
        raise VkrtError(f"{what}: path must be one of {PATHS}, got {path!r}")
    _check(a, b, dst, dim, what)
    plan = None if path == "generic" else fast_plan(a, b, dst, dim)
    if isinstance(plan, FastPlan):
        _fast(seq, plan, dst, what)
        return "fast"
    if path == "fast":
        raise VkrtError(f"{what}: the fast path does not apply: {plan}")
    _generic(seq, a, b, dst, dim, what)
    return "generic"


def _generic(seq, a: Tensor, b: Tensor, dst: Tensor, dim: int, what: str) -> None:
    if not all(fits_binding(t) for t in (a, b, dst)) or dst.nelements > U32_MAX:
        # too big for one dispatch: two strided copies, which split themselves
        copy(seq, a, dst.slice(dim, 0, a.ne[dim]))
        copy(seq, b, dst.slice(dim, a.ne[dim], dst.ne[dim]))
        return
    dev = seq.device
    k = kernel(dev, "concat", push=CONCAT_PUSH, workgroup=(dev.tuning.wg_size,),
               defines={**type_defines("A", a.type, what), **type_defines("B", b.type, what),
                        **type_defines("DST", dst.type, what), **storage_defines(dev)})
    ba, bb, bd = (bind_elements(t, what) for t in (a, b, dst))
    push = {"n": dst.nelements, "ne0": dst.ne[0], "ne1": dst.ne[1], "ne2": dst.ne[2], "dim": dim,
            "split": a.ne[dim], "a_nb": ba.strides, "b_nb": bb.strides, "dst_nb": bd.strides,
            "a_off": ba.offset, "b_off": bb.offset, "dst_off": bd.offset}
    seq.dispatch(k, [ba.range, bb.range, bd.range], push=push, groups=groups_for(k, dst.nelements),
                 label="concat")


def _fast(seq, plan: FastPlan, dst: Tensor, what: str) -> None:
    dev = seq.device
    k = transpose_kernel(dev, "concat_transposed", FAST_PUSH, 8 * dst.type.type_size)
    tile, rows = tile_shape(dev)
    ctg, trp = plan.ctg, plan.trp
    bc, bt, bd = (bind_elements(t, what) for t in (ctg, trp, dst))
    nrows = dst.ne[1]
    copy_col_blocks = ceil_div(ctg.ne[0], tile)
    copy_groups = copy_col_blocks * ceil_div(nrows, rows)
    row_tiles = ceil_div(nrows, tile)
    total = copy_groups + row_tiles * ceil_div(trp.ne[0], tile)
    push = {"rows": nrows, "ctg_cols": ctg.ne[0], "trp_cols": trp.ne[0], "trp_row": bt.strides[0],
            "dst_row": bd.strides[1], "ctg_off": bc.offset, "trp_off": bt.offset,
            "dst_ctg_off": bd.offset + plan.ctg_col, "dst_trp_off": bd.offset + plan.trp_col,
            "copy_groups": copy_groups, "copy_col_blocks": copy_col_blocks, "row_tiles": row_tiles}
    seq.dispatch(k, [bc.range, bt.range, bd.range], push=push, groups=grid(dev, total), label="concat (transposed fast path)")
