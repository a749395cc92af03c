"""Row gather (the embedding lookup): dst[:, t] = table[ids[t]] as f32, ids read on the GPU so a
recorded sequence replays for new tokens. Tables larger than one binding run in row ranges."""

from __future__ import annotations

from ..errors import GGMLTypeError, OutOfRange
from ..memory import I32, Tensor
from ..pipeline import PushConstants, kernel
from .binding import bind_words, f32_binding
from .grid import ceil_div, groups_for
from .quant import check_layout, chunks, exact_defines, kernel_type

GET_ROWS_PUSH = PushConstants(("ne0", "u32"), ("n_ids", "u32"), ("row0", "u32"), ("rows", "u32"),
                              ("w_off", "u32"), ("w_row", "u32"), ("ids_off", "u32"), ("d_off", "u32"),
                              ("d_row", "u32"))


def get_rows(seq, table: Tensor, ids: Tensor, dst: Tensor, *, max_binding: int | None = None) -> None:
    """Record dst[:, t] = table[:, ids[t]] for table (ne0, n_rows) of any kernel type, ids I32
    [n_ids] and dst F32 (ne0, n_ids)."""
    typ = kernel_type(table.type, f"get_rows table {table.name}".rstrip())
    check_layout(table, "get_rows table")
    if table.ne[2] != 1 or table.ne[3] != 1:
        raise OutOfRange(f"get_rows: the table must be 2-D, got {list(table.ne)}")
    if ids.type is not I32 or not ids.is_contiguous():
        raise GGMLTypeError(f"get_rows: ids must be a contiguous I32 tensor, got {ids!r}")
    n_ids = ids.nelements
    if dst.ne[0] != table.ne[0] or dst.ne[1] * dst.ne[2] * dst.ne[3] != n_ids:
        raise OutOfRange(f"get_rows: dst {list(dst.ne)} must be ({table.ne[0]}, {n_ids})")
    dr, do, ds = f32_binding(dst, "get_rows dst")
    dev = seq.device
    ir, io = bind_words(ids, "get_rows ids", dev)
    k = kernel(dev, "get_rows", defines=exact_defines(typ, dev), push=GET_ROWS_PUSH,
               workgroup=(dev.tuning.wg_size,))
    groups = groups_for(k, ceil_div(table.ne[0], 4) * n_ids)
    for a, b in chunks(1, dev, max_binding, table):
        wr, wo = bind_words(table.slice(1, a, b), "get_rows table", dev, max_binding)
        seq.dispatch(k, [wr, ir, dr], push=dict(ne0=table.ne[0], n_ids=n_ids, row0=a, rows=b - a, w_off=wo,
                                                w_row=table.nb[1], ids_off=io // 4, d_off=do, d_row=ds[0]),
                     groups=groups, label="get_rows")
