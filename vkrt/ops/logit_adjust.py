"""Logit bias, penalties and DRY applied on the GPU to rows of logits, in place, from the table
vkrt/engine/logit_adjust.py packs (shaders/logit_adjust.comp): the host reads back the best
candidates of adjusted rows instead of whole rows."""

from __future__ import annotations

import numpy as np

from ..errors import UnsupportedShape
from ..memory import Tensor
from ..pipeline import PushConstants, kernel
from .rows import logits_and_table

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
    rows = x.ne[1]
    ops = logits_and_table(x, table, table_words(rows, cap), "logit adjustments",
                           f"the logit adjustment table ({rows} rows of {cap} entries)", dev)
    wg = min(64, dev.profile.max_workgroup_invocations)
    k = kernel(dev, "logit_adjust", defines={"WG": wg}, push=ADJUST_PUSH)
    seq.dispatch(k, ops.pop("bindings"), push={**ops, "cap": cap}, groups=(rows, 1, 1), label="logit adjust")
