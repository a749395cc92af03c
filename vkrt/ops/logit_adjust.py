"""Logit bias, penalties and DRY applied on the GPU to rows of logits, in place, from the table
vkrt/engine/logit_adjust.py packs (shaders/logit_adjust.comp): the host reads back the best
candidates of adjusted rows instead of whole rows."""

from __future__ import annotations

import numpy as np

from ..errors import UnsupportedShape
from ..memory import F32, I32, Tensor
from ..pipeline import PushConstants, kernel
from .binding import bind_tensor

ADJUST_PUSH = PushConstants(*((n, "u32") for n in ("x_off", "x_row", "n", "a_off", "rows", "cap")))
ENTRY_WORDS = 7   # vkrt/engine/logit_adjust.py: token, flags, bias, two scales, penalty, dry


def table_words(rows: int, cap: int) -> int:
    """Words of the table for `rows` rows of at most `cap` entries: the counts, then the entries."""
    return rows + rows * cap * ENTRY_WORDS


def pack_table(rows: int, cap: int, entries: list) -> np.ndarray:
    """The uint32 table for `rows` rows: entries[r] is row r's packed entries (ENTRY_WORDS words
    each, at most cap of them) or None."""
    words = np.zeros(table_words(rows, cap), np.uint32)
    for r, e in enumerate(entries):
        if e is None:
            continue
        n = len(e) // ENTRY_WORDS
        if n > cap:
            raise UnsupportedShape(f"logit adjustments: {n} entries for row {r}, the table holds {cap}")
        words[r] = n
        start = rows + r * cap * ENTRY_WORDS
        words[start:start + len(e)] = e
    return words


def logit_adjust(seq, x: Tensor, table: Tensor, cap: int) -> None:
    """Record the adjustments of `table` (I32, table_words(rows, cap)) applied in place to the F32
    logits x (n,) or (n, rows) with contiguous rows."""
    dev = seq.device
    n, rows = x.ne[0], x.ne[1]
    if x.type != F32 or x.nb[0] != 4 or x.nelements != n * rows or x.nb[1] % 4:
        raise UnsupportedShape(f"logit adjustments need F32 logits (n,) or (n, rows), got {x!r}")
    if table.type != I32 or table.nelements < table_words(rows, cap):
        raise UnsupportedShape(f"the logit adjustment table must be I32 of >= {table_words(rows, cap)} words "
                               f"({rows} rows of {cap} entries), got {table!r}")
    xr, xo = bind_tensor(x, dev)
    ar, ao = bind_tensor(table, dev)
    wg = min(64, dev.profile.max_workgroup_invocations)
    k = kernel(dev, "logit_adjust", defines={"WG": wg}, push=ADJUST_PUSH)
    seq.dispatch(k, [xr, ar], push={"x_off": xo // 4, "x_row": x.nb[1] // 4 if rows > 1 else n, "n": n,
                                    "a_off": ao // 4, "rows": rows, "cap": cap},
                 groups=(rows, 1, 1), label="logit adjust")
