"""A grammar's allowed-token bitmask applied on the GPU to rows of logits, in place
(shaders/token_mask.comp): disallowed tokens become -inf before the argmax or the top-k
candidates pass, so the host reads back candidates, not rows."""

from __future__ import annotations

import numpy as np

from ..errors import UnsupportedShape
from ..memory import Tensor
from ..pipeline import PushConstants, kernel
from .grid import ceil_div
from .rows import logits_and_table

MASK_PUSH = PushConstants(*((n, "u32") for n in ("x_off", "x_row", "n", "a_off", "rows", "words")))


def mask_words(vocab: int) -> int:
    """uint32 words of one row's bitmask (bit t % 32 of word t // 32 for token t)."""
    return (vocab + 31) // 32


def table_words(rows: int, vocab: int) -> int:
    """Words of the table for `rows` rows: a flag a row, then each row's mask."""
    return rows + rows * mask_words(vocab)


def pack_masks(rows: int, vocab: int, masks: list, out: np.ndarray | None = None) -> np.ndarray:
    """The uint32 table for `rows` rows: masks[r] is row r's bitmask (mask_words(vocab) words) or
    None (the row is left alone); written into `out` (uint32, e.g. a host-visible buffer's
    memory) when given. Rows without a mask keep whatever words they held."""
    words = mask_words(vocab)
    out = np.zeros(table_words(rows, vocab), np.uint32) if out is None else out[:table_words(rows, vocab)]
    out[:rows] = 0
    for r, m in enumerate(masks):
        if m is None:
            continue
        m = np.asarray(m).view(np.uint32).reshape(-1)
        if m.size != words:
            raise UnsupportedShape(f"token mask of row {r}: {m.size} words, a row of {vocab} logits takes {words}")
        out[r] = 1
        out[rows + r * words:rows + (r + 1) * words] = m
    return out


def apply_mask_host(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """A float32 copy of one row with the tokens `mask` clears set to -inf (what the shader does)."""
    out = np.array(logits, dtype=np.float32)
    bits = np.unpackbits(np.asarray(mask).view(np.uint8), bitorder="little")[:out.size].astype(bool)
    out[~bits] = -np.inf
    return out


def token_mask(seq, x: Tensor, table: Tensor) -> None:
    """Record the masks of `table` (I32, table_words(rows, n)) applied in place to the F32 logits
    x (n,) or (n, rows) with contiguous rows."""
    dev = seq.device
    n, rows = x.ne[0], x.ne[1]
    ops = logits_and_table(x, table, table_words(rows, n), "token masks",
                           f"the token mask table ({rows} rows of {n} tokens)", dev)
    wg = min(64, dev.profile.max_workgroup_invocations)
    words = mask_words(n)
    k = kernel(dev, "token_mask", defines={"WG": wg}, push=MASK_PUSH)
    seq.dispatch(k, ops.pop("bindings"), push={**ops, "words": words}, groups=(ceil_div(words, wg), rows, 1),
                 label="token mask")
