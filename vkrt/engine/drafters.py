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
    the softmax gives it at least p_min (and at least n_min tokens whatever it gives).
    draft_models drafts for several sequences of one engine at once."""

    def __init__(self, engine, seq_id: int = 0, p_min: float = 0.75, n_min: int = 0):
        self.engine, self.seq_id, self.p_min, self.n_min = engine, seq_id, p_min, n_min
        self.fed: list[int] = []   # the tokens the draft engine's sequence holds

    def _plan(self, history: list[int]) -> list[int]:
        """Keep the prefix of history[:-1] the sequence shares (or can rewind to): the tokens to feed."""
        common = 0
        limit = min(len(self.fed), len(history) - 1)
        while common < limit and self.fed[common] == history[common]:
            common += 1
        if not self.engine.can_truncate(self.seq_id, common):   # a recurrent state from another history
            self.reset()
            common = 0
        kept = self.engine.truncate(self.seq_id, common)
        del self.fed[kept:]
        return history[kept:]

    def _confident(self, logits: np.ndarray, drafts: list[int]) -> int | None:
        """The argmax of `logits`, or None where its probability is below p_min after n_min drafts."""
        token = int(np.argmax(logits))
        p = 1.0 / float(np.exp((logits - logits[token]).astype(np.float64)).sum())
        return None if p < self.p_min and len(drafts) >= self.n_min else token

    def draft(self, history: list[int], n: int) -> list[int]:
        return draft_models([(self, history, n)])[0]

    def reset(self) -> None:
        self.engine.reset(self.seq_id)
        self.fed = []


def _catch_up_parts(engine, rest: dict[int, list[int]]) -> list[tuple[int, int]]:
    """The (request, tokens) parts of one catch-up step: as many as the micro-batch and the
    outputs take; of one size where the model keeps a recurrent state (Engine.mixed)."""
    budget, keys = engine.n_ubatch, list(rest)
    if engine.recurrent:
        size = min(min(len(rest[k]) for k in keys), budget)
        return [(k, size) for k in keys[:budget // size]]
    parts = []
    for k in keys:
        if budget == 0:
            break
        parts.append((k, min(len(rest[k]), budget)))
        budget -= parts[-1][1]
    return parts


def _catch_up(drafters: list[ModelDrafter], todos: list[list[int]]) -> list[np.ndarray]:
    """Feed each drafter's tokens, several sequences a step: the logits after each one's last."""
    engine, rest, out = drafters[0].engine, {k: list(t) for k, t in enumerate(todos)}, {}
    while rest:
        parts = _catch_up_parts(engine, rest)
        logits = engine.mixed([(drafters[k].seq_id, rest[k][:c]) for k, c in parts])
        for (k, c), row in zip(parts, logits):
            drafters[k].fed.extend(rest[k][:c])
            del rest[k][:c]
            if not rest[k]:
                out[k] = row
                del rest[k]
    return [out[k] for k in range(len(todos))]


def draft_models(requests: list[tuple[ModelDrafter, list[int], int]]) -> list[list[int]]:
    """The drafts of (drafter, history, at most n) for drafters of one draft engine: their
    catch-ups read together (Engine.mixed), then one decode step a draft position
    for every sequence still drafting; each draft as its drafter would make it alone."""
    out: list[list[int]] = [[] for _ in requests]
    live = [(i, d, h, n) for i, (d, h, n) in enumerate(requests) if n > 0 and h]
    if not live:
        return out
    engine = live[0][1].engine
    if any(d.engine is not engine for _, d, _, _ in live):
        raise VkrtError("draft_models: the drafters must share one draft engine")
    try:
        for _, d, _, _ in live:
            engine.snapshot(d.seq_id)   # a recurrent draft model rewinds to here next time
        rows = _catch_up([d for _, d, _, _ in live], [d._plan(h) for _, d, h, _ in live])
        going = list(range(len(live)))
        while going:
            going = _chain_step(live, rows, going, out)
    except BaseException:
        for _, d, _, _ in live:   # the engine's sequences and `fed` may disagree: start over next time
            d.reset()
        raise
    return out


def take_drafts(live, rows, going: list[int], out: list[list[int]]) -> list[int]:
    """Append each going request's next draft (live[k] = (index into out, drafter, history, n):
    its drafter's _confident pick of rows[k]) to its drafts; the requests that draft on."""
    step = []
    for k in going:
        i, d, _, n = live[k]
        token = d._confident(rows[k], out[i])
        if token is None:
            continue
        out[i].append(token)
        if len(out[i]) < n:
            step.append(k)
    return step


def _chain_step(live, rows, going: list[int], out: list[list[int]]) -> list[int]:
    """Take each going request's next draft from its logits `rows` and feed those that draft
    on in decode steps: the requests still going."""
    step = take_drafts(live, rows, going, out)
    engine = live[0][1].engine
    if not step or engine.cache.cells.n_free() < len(step):
        return []
    cap = engine.n_ubatch
    for c in range(0, len(step), cap):
        chunk = step[c:c + cap]
        logits = engine.decode([(live[k][1].seq_id, out[live[k][0]][-1]) for k in chunk])
        for j, k in enumerate(chunk):
            rows[k] = logits[j]
            live[k][1].fed.append(out[live[k][0]][-1])
    return step
