"""Drafters for speculative decoding: what proposes the tokens a verification step checks.

NgramDrafter looks the last few tokens up in the sequence's own history (prompt and output) and
proposes what followed them last time: no weights, and it pays where text repeats (code edits,
quoted files, tool-call arguments). ModelDrafter runs a small model of the same vocabulary on
an engine of its own and proposes its greedy continuation while it is confident (p_min)."""

from __future__ import annotations

import numpy as np

from ..errors import VkrtError


_HASH_BASE = np.uint64(0x9E3779B97F4A7C15)


def _hash(grams: np.ndarray) -> np.ndarray:
    """A 64-bit polynomial hash of each row of `grams` (token ids as uint64), wrapping."""
    out = np.zeros(grams.shape[0], np.uint64)
    with np.errstate(over="ignore"):
        for j in range(grams.shape[1]):
            out = out * _HASH_BASE + grams[:, j] + np.uint64(1)
    return out


def _hash_one(tokens: list[int]) -> int:
    """_hash of one n-gram, in Python."""
    out = 0
    for t in tokens:
        out = (out * _HASH_BASE_INT + t + 1) & _MASK
    return out


_HASH_BASE_INT, _MASK = int(_HASH_BASE), (1 << 64) - 1
MAX_BACKOFF = 16   # the most tokens n-gram drafting pauses for after drafts that missed whole


class NgramDrafter:
    """Drafts by n-gram lookup: the longest n in [n_min, n_max] whose last n tokens occurred
    before in the history; the tokens that followed their latest earlier occurrence are the
    draft, at most twice n of them (a longer match predicts further) and at most what the last
    draft earned: the draft's accepted length + 1 after a rejection, twice the last length after
    a draft accepted whole (read from the history: what followed the last draft); after a draft
    rejected whole it pauses for 1, 2, 4 ... up to MAX_BACKOFF tokens (where the text does not
    repeat, a miss costs a step's extra rows for nothing). The index maps a hash of each n-gram
    to where its latest occurrence ends (a hit is compared token by token); it grows with the
    history, a long prompt hashed in one pass, and a history that is not an extension of the
    last one (a new request) rebuilds it."""

    def __init__(self, n_min: int = 2, n_max: int = 8):
        if not 1 <= n_min <= n_max:
            raise VkrtError(f"n-gram sizes: 1 <= min <= max, got {n_min}..{n_max}")
        self.n_min, self.n_max = n_min, n_max
        self._tokens: list[int] = []
        self._index: list[dict[int, int]] = [{} for _ in range(n_max + 1)]
        self._last: tuple[int, list[int]] = (0, [])   # (history length, draft) of the last draft
        self._cap: int | None = None   # the most the next draft may hold (None: no draft yet)
        self._backoff = 0              # tokens to wait after a draft rejected whole (doubling, at most MAX_BACKOFF)
        self._resume = 0               # the history length drafting resumes at

    def _earned(self, history: list[int]) -> None:
        at, draft = self._last
        if not draft or len(history) <= at:
            return
        got = history[at:at + len(draft)]
        accepted = next((i for i, (a, b) in enumerate(zip(draft, got)) if a != b), min(len(draft), len(got)))
        self._cap = 2 * len(draft) if accepted == len(draft) else accepted + 1
        self._backoff = 0 if accepted else min(MAX_BACKOFF, 2 * self._backoff or 1)
        self._resume = at + 1 + self._backoff
        self._last = (0, [])

    def _extend(self, history: list[int]) -> None:
        known = self._tokens
        if len(history) < len(known) or history[:len(known)] != known:
            self._tokens, self._index = [], [{} for _ in range(self.n_max + 1)]
            self._last, self._cap, self._backoff, self._resume = (0, []), None, 0, 0
            known = self._tokens
        first = len(known)
        if first == len(history):
            return
        known.extend(history[first:])
        if len(known) - first <= 32:   # a step's few tokens: cheaper in Python than numpy's calls
            for end in range(first, len(known)):
                for n in range(self.n_min, min(self.n_max, end) + 1):
                    self._index[n][_hash_one(known[end - n:end])] = end
            return
        base = max(0, first - self.n_max)   # the tokens the new n-grams start from
        window = np.asarray(known[base:], np.int64).view(np.uint64)
        for n in range(self.n_min, self.n_max + 1):
            ends = np.arange(max(first, n), len(known))   # the n-grams ending before token `end`
            if ends.size:
                grams = np.lib.stride_tricks.sliding_window_view(window, n)[ends - n - base]
                self._index[n].update(zip(_hash(grams).tolist(), ends.tolist()))   # later ones win

    def draft(self, history: list[int], n: int) -> list[int]:
        """Up to n tokens to follow `history` (empty: no match)."""
        self._extend(history)
        self._earned(history)
        if len(history) < self._resume:   # the last drafts missed whole: wait a while
            return []
        for size in range(min(self.n_max, len(history)), self.n_min - 1, -1):
            tail = history[-size:]
            at = self._index[size].get(_hash_one(tail))
            if at is not None and history[at - size:at] == tail:
                limit = min(n, 2 * size, n if self._cap is None else self._cap)
                out = list(history[at:at + limit])
                self._last = (len(history), out)
                return out
        return []


class ModelDrafter:
    """Drafts with a draft model's engine (sequence `seq_id`): it follows the history (keeping
    the prefix it shares with the last one), then proposes its argmax token after token while
    the softmax gives it at least p_min (and at least n_min tokens whatever it gives)."""

    def __init__(self, engine, seq_id: int = 0, p_min: float = 0.75, n_min: int = 0):
        self.engine, self.seq_id, self.p_min, self.n_min = engine, seq_id, p_min, n_min
        self.fed: list[int] = []   # the tokens the draft engine's sequence holds

    def _sync(self, history: list[int]) -> np.ndarray:
        """Make the draft sequence hold history[:-1] and feed the last token: its logits."""
        common = 0
        limit = min(len(self.fed), len(history) - 1)
        while common < limit and self.fed[common] == history[common]:
            common += 1
        if not self.engine.can_truncate(self.seq_id, common):   # a recurrent state from another history
            self.reset()
            common = 0
        kept = self.engine.truncate(self.seq_id, common)
        del self.fed[kept:]
        todo = history[kept:]
        logits = self.engine.eval(todo, self.seq_id)
        self.fed.extend(todo)
        return logits

    def draft(self, history: list[int], n: int) -> list[int]:
        if n <= 0 or not history:
            return []
        self.engine.snapshot(self.seq_id)   # a recurrent draft model rewinds to here next time
        logits = self._sync(history)
        out: list[int] = []
        while True:
            token = int(np.argmax(logits))
            z = logits - logits[token]
            p = 1.0 / float(np.exp(z.astype(np.float64)).sum())
            if p < self.p_min and len(out) >= self.n_min:
                break
            out.append(token)
            if len(out) >= n:
                break
            logits = self.engine.eval([token], self.seq_id)
            self.fed.append(token)
        return out

    def reset(self) -> None:
        self.engine.reset(self.seq_id)
        self.fed = []
