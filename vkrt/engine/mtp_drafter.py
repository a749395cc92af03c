"""MtpDrafter: drafts with the model's own MTP head (mtp_head.py) for one sequence.

The head's KV cache holds one entry a trunk position p: the block run on the trunk's state h_p
and the token t_{p+1} after it. The trunk hands its states over after every step (Engine.
keep_hidden); at a draft the head first catches up to the token just sampled (the entries of
the positions the trunk read since, in one step), then chains: its argmax is the first draft,
fed back with the head's own state as the next position's h, while the head is confident
(p_min). The chained entries are taken back afterwards: the trunk's states replace them once
it has read those tokens.

A history that is not an extension of the last one (a rejected draft, a new request) keeps
the entries of the tokens it shares. A state the trunk did not hand over (a step outside
Engine.steps.step) reads as zeros: the drafts get worse, never the output.
"""

from __future__ import annotations

import numpy as np

from ..errors import VkrtError
from .drafters import take_drafts


class MtpDrafter:
    """The MTP drafts of sequence `seq_id` with the head `head` run by `engine` (an Engine of
    the MtpHead, the same sequence id); p_min and n_min as ModelDrafter's. The trunk's states
    arrive through on_trunk, the head's own through on_head (Drafting routes them)."""

    reads_states = True   # speculate(): steps without drafts must hand the trunk's states over too

    def __init__(self, head, engine, seq_id: int = 0, p_min: float = 0.0, n_min: int = 0):
        self.head, self.engine, self.seq_id, self.p_min, self.n_min = head, engine, seq_id, p_min, n_min
        self.seen: list[int] = []   # t_0..t_m: the head holds the entries of positions 0..m-1
        self.trunk: dict[int, np.ndarray] = {}   # the trunk's states of positions without an entry yet
        self.tokens: dict[int, int] = {}         # the tokens the trunk read at those positions
        self.head_state: np.ndarray | None = None
        self.flush_at = 2 * engine.n_ubatch   # states kept before a long prompt's entries are made

    @property
    def entries(self) -> int:
        return max(len(self.seen) - 1, 0)

    # -- states handed over ------------------------------------------------------------------------
    def on_trunk(self, pos: np.ndarray, ids: np.ndarray, rows: np.ndarray) -> None:
        """The trunk read tokens `ids` at positions `pos`, ending in states `rows`."""
        first = int(pos.min())
        for p in [p for p in self.trunk if p >= first]:   # read again: the older states are stale
            del self.trunk[p], self.tokens[p]
        for p, t, r in zip(pos.tolist(), ids.tolist(), rows):
            self.trunk[p], self.tokens[p] = np.array(r, np.float32), t
        if len(self.trunk) > self.flush_at:   # a long prompt: make its entries as it goes
            self._flush()

    def on_head(self, rows: np.ndarray) -> None:
        self.head_state = np.array(rows[-1], np.float32)

    def _flush(self) -> None:
        """The entries of every position whose next token the trunk has read, in order (a
        position the trunk read again takes back the entries from the one before it on)."""
        m = min(self.entries, max(min(self.tokens) - 1, 0))
        self._keep(m)
        q = m
        while q + 1 in self.tokens:
            q += 1
        if q > m:
            seen = self.seen[:m + 1] if self.seen else [self.tokens.get(0, 0)]
            self._run(m, q - 1, [self.tokens[p] for p in range(m + 1, q + 1)])
            self.seen = seen + [self.tokens[p] for p in range(m + 1, q + 1)]

    # -- drafting ----------------------------------------------------------------------------------
    def draft(self, history: list[int], n: int) -> list[int]:
        return draft_together([(self, history, n)])[0]

    def _catch_up(self, history: list[int]) -> tuple[list[int], np.ndarray]:
        """Keep the entries `history` shares with the last one (entry L-2 is run again for its
        logits); the tokens and the trunk's states of the entries from there to L-2."""
        L = len(history)
        common = 0
        limit = min(len(self.seen), L)
        while common < limit and self.seen[common] == history[common]:
            common += 1
        keep = min(self.entries, max(common - 1, 0), L - 2)
        self._keep(keep)
        return history[keep + 1:L], self._states(keep, L - 1)

    def _done(self, history: list[int]) -> None:
        """The chained entries go (the trunk's states replace them): the head holds 0..L-2."""
        L = len(history)
        self.engine.truncate(self.seq_id, L - 1)
        self.seen = list(history)
        for p in [p for p in self.trunk if p <= L - 2]:
            del self.trunk[p], self.tokens[p]

    def _confident(self, logits: np.ndarray, drafts: list[int]) -> int | None:
        """The head's next draft after `drafts`, or None where it is not confident enough."""
        token = int(np.argmax(logits))
        p = 1.0 / float(np.exp((logits - logits[token]).astype(np.float64)).sum())
        return None if p < self.p_min and len(drafts) >= self.n_min else token

    def _keep(self, m: int) -> None:
        """Keep the entries of positions 0..m-1 (the head's sequence may hold another drafter's)."""
        if self.engine.sequence_length(self.seq_id) > m:
            self.engine.truncate(self.seq_id, m)
        del self.seen[m + 1:]
        if m == 0:
            self.seen = []

    def _states(self, first: int, stop: int) -> np.ndarray:
        """The trunk's states of positions first..stop-1 (taken; zeros where none arrived)."""
        states = np.zeros((max(stop - first, 0), self.head.cfg.n_embd), np.float32)
        for p in range(first, stop):
            row = self.trunk.pop(p, None)
            self.tokens.pop(p, None)
            if row is not None:
                states[p - first] = row
        return states

    def _run(self, first: int, last: int, nexts: list[int]) -> np.ndarray:
        """The entries of positions first..last (tokens `nexts`: the token after each), in steps
        of the head's micro-batch; the logits of the last."""
        self._check_length(first)
        states, ub, logits = self._states(first, last + 1), self.engine.n_ubatch, None
        for c in range(0, len(nexts), ub):
            self.head.write_hidden(states[c:c + ub])
            logits = self.engine.eval(nexts[c:c + ub], self.seq_id)
        return logits

    def _check_length(self, n: int) -> None:
        if self.engine.sequence_length(self.seq_id) != n:
            raise VkrtError(f"MTP head: sequence {self.seq_id} holds {self.engine.sequence_length(self.seq_id)} "
                            f"entries, expected {n}")


def draft_together(requests: list[tuple[MtpDrafter, list[int], int]]) -> list[list[int]]:
    """The drafts of several sequences' MTP drafters (sharing one head and its engine) for
    (drafter, history, at most n): their catch-ups in one step of the head (each its own when
    they do not fit its micro-batch together), then one step a chained draft for every
    sequence still drafting."""
    out: list[list[int]] = [[] for _ in requests]
    live = [(i, d, h, n) for i, (d, h, n) in enumerate(requests) if n > 0 and len(h) >= 2]
    if not live:
        return out
    head, engine = live[0][1].head, live[0][1].engine
    try:
        plans = [d._catch_up(h) for _, d, h, _ in live]
        for (_, d, h, _), (nexts, _) in zip(live, plans):
            d._check_length(len(h) - 1 - len(nexts))
        if sum(len(nx) for nx, _ in plans) <= engine.n_ubatch:
            head.write_hidden(np.concatenate([st for _, st in plans]))
            rows = list(engine.mixed([(d.seq_id, nx) for (_, d, _, _), (nx, _) in zip(live, plans)]))
        else:
            rows = []
            for (_, d, h, _), (nexts, states) in zip(live, plans):
                d.trunk.update({len(h) - 1 - len(nexts) + k: r for k, r in enumerate(states)})   # _run takes them
                rows.append(d._run(len(h) - 1 - len(nexts), len(h) - 2, nexts))
        going = list(range(len(live)))
        while going:
            step = [(k, out[live[k][0]][-1]) for k in take_drafts(live, rows, going, out)]
            if not step or engine.cache.cells.n_free() < len(step):
                break
            head.write_hidden(np.stack([live[k][1].head_state for k, _ in step]))
            logits = engine.decode([(live[k][1].seq_id, t) for k, t in step])
            for (k, _), row in zip(step, logits):
                rows[k] = row
            going = [k for k, _ in step]
    finally:
        for _, d, h, _ in live:
            d._done(h)
    return out
