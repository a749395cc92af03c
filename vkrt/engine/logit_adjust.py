"""The sampler's changes to a row of logits before any cut, as a short list: logit bias, the
repetition / frequency / presence penalties and DRY touch only the tokens they name. The host
sampler applies the list to a row (`apply`); the GPU applies the same list in place before it
picks a step's candidates (shaders/logit_adjust.comp). Both do the same float32 operations in
the same order, so they give the same bits:

    v = logit
    v = v + bias                          (BIAS: the token's logit_bias entries, summed)
    v = v * (v > 0 ? 1/repeat : repeat)   (SCALE: in the last repeat_last_n tokens, repeat != 1)
    v = v - (count * frequency + presence)  (PENALTY: in the last repeat_last_n tokens)
    v = v - dry                           (DRY: the token would extend a repetition)

The repetition penalty multiplies by float32(1 / repeat) where llama.cpp divides (at most one
unit in the last place apart), so that GPU and host round alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ops.logit_adjust import ENTRY_WORDS

BIAS, SCALE, PENALTY, DRY = 1, 2, 4, 8   # shaders/logit_adjust.comp


@dataclass(frozen=True)
class LogitAdjustments:
    """One entry per token: what to do to its logit (flags) and the operands."""

    ids: np.ndarray        # int64 token ids, each once
    flags: np.ndarray      # uint32
    bias: np.ndarray       # float32
    pos_scale: np.ndarray  # float32: the factor for a positive logit
    neg_scale: np.ndarray  # float32: for zero or negative
    penalty: np.ndarray    # float32
    dry: np.ndarray        # float32

    def __len__(self) -> int:
        return len(self.ids)

    def apply(self, logits: np.ndarray) -> np.ndarray:
        """A float32 copy of the row with the entries applied."""
        out = np.array(logits, dtype=np.float32)
        v = out[self.ids]
        for flag, op in ((BIAS, lambda x, m: x + self.bias[m]),
                         (SCALE, lambda x, m: x * np.where(x > 0, self.pos_scale[m], self.neg_scale[m])),
                         (PENALTY, lambda x, m: x - self.penalty[m]),
                         (DRY, lambda x, m: x - self.dry[m])):
            m = (self.flags & flag) != 0
            if m.any():
                v[m] = op(v[m], m)
        out[self.ids] = v
        return out

    def words(self) -> np.ndarray:
        """The entries as the GPU reads them: ENTRY_WORDS uint32 each (floats by their bits)."""
        out = np.empty((len(self), ENTRY_WORDS), np.uint32)
        out[:, 0] = self.ids
        out[:, 1] = self.flags
        for col, a in enumerate((self.bias, self.pos_scale, self.neg_scale, self.penalty, self.dry), start=2):
            out[:, col] = a.view(np.uint32)
        return out.reshape(-1)


def logit_adjustments(params, history: list[int], dry: dict[int, float] | None = None) -> LogitAdjustments | None:
    """The entries `params` (SamplingParams) call for after `history` (the sampler's recent
    tokens, oldest first); `dry`: the DRY penalties of this step. None when there are none."""
    ops: dict[int, list] = {}

    def entry(t: int) -> list:
        return ops.setdefault(int(t), [0, 0.0, 1.0, 1.0, 0.0, 0.0])

    for t, b in params.logit_bias:
        e = entry(t)
        e[0] |= BIAS
        e[1] += float(b)
    recent = history[-params.repeat_last_n:] if params.repeat_last_n > 0 else []
    if params.penalized and recent:
        ids, counts = np.unique(np.asarray(recent, dtype=np.int64), return_counts=True)
        for t, c in zip(ids.tolist(), counts.tolist()):
            e = entry(t)
            if params.repeat_penalty != 1.0:
                e[0] |= SCALE
                e[2], e[3] = 1.0 / params.repeat_penalty, params.repeat_penalty
            e[0] |= PENALTY
            e[4] = c * params.frequency_penalty + params.presence_penalty
    for t, amount in (dry or {}).items():
        e = entry(t)
        e[0] |= DRY
        e[5] = amount
    if not ops:
        return None
    cols = list(zip(*ops.values()))
    return LogitAdjustments(np.fromiter(ops, np.int64, len(ops)), np.asarray(cols[0], np.uint32),
                            *(np.asarray(c, np.float64).astype(np.float32) for c in cols[1:]))
