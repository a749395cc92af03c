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
        L = len(history)
        if n <= 0 or L < 2:
            return []
        common = 0
        limit = min(len(self.seen), L)
        while common < limit and self.seen[common] == history[common]:
            common += 1
        keep = min(self.entries, max(common - 1, 0), L - 2)   # entry L-2 is run again for its logits
        self._keep(keep)
        try:
            logits = self._run(keep, L - 2, history[keep + 1:L])
            drafts: list[int] = []
            while True:
                token = int(np.argmax(logits))
                p = 1.0 / float(np.exp((logits - logits[token]).astype(np.float64)).sum())
                if p < self.p_min and len(drafts) >= self.n_min:
                    break
                drafts.append(token)
                if len(drafts) >= n or self.engine.cache.cells.n_free() == 0:
                    break
                self.head.write_hidden(self.head_state[None])
                logits = self.engine.eval([token], self.seq_id)
        finally:
            self.engine.truncate(self.seq_id, L - 1)   # the chained entries go: the trunk's states replace them
        self.seen = list(history)
        for p in [p for p in self.trunk if p <= L - 2]:
            del self.trunk[p], self.tokens[p]
        return drafts

    def _keep(self, m: int) -> None:
        """Keep the entries of positions 0..m-1 (the head's sequence may hold another drafter's)."""
        if self.engine.sequence_length(self.seq_id) > m:
            self.engine.truncate(self.seq_id, m)
        del self.seen[m + 1:]
        if m == 0:
            self.seen = []

    def _run(self, first: int, last: int, nexts: list[int]) -> np.ndarray:
        """The entries of positions first..last (tokens `nexts`: the token after each), in steps
        of the head's micro-batch; the logits of the last."""
        E, ub = self.head.cfg.n_embd, self.engine.n_ubatch
        if self.engine.sequence_length(self.seq_id) != first:
            raise VkrtError(f"MTP head: sequence {self.seq_id} holds {self.engine.sequence_length(self.seq_id)} "
                            f"entries, expected {first}")
        logits = None
        for c0 in range(first, last + 1, ub):
            c1 = min(c0 + ub, last + 1)
            states = np.zeros((c1 - c0, E), np.float32)
            for p in range(c0, c1):
                row = self.trunk.pop(p, None)
                self.tokens.pop(p, None)
                if row is not None:
                    states[p - c0] = row
            self.head.write_hidden(states)
            logits = self.engine.eval(nexts[c0 - first:c1 - first], self.seq_id)
        return logits
