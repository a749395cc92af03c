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

Images (their tokens are placeholder ids, model/media_prompt.py): the trunk hands over each
image row's state and input embedding (Engine.embed). The entry of a position whose next token
is an image row reads that row where a token's embedding would go, and every entry of a
position inside an image takes the trunk's rotary positions there (M-RoPE: the image's grid)
and its `after`, so the entries after the image go on where the trunk's text does: the head
reads what the trunk read, at the positions it read it (as ik_llama.cpp's MTP with mtmd).
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
    takes_images = True   # a request with images drafts too (the scheduler asks)

    def __init__(self, head, engine, seq_id: int = 0, p_min: float = 0.0, n_min: int = 0, target=None):
        self.head, self.engine, self.seq_id, self.p_min, self.n_min = head, engine, seq_id, p_min, n_min
        self.target = target   # the trunk's engine: the rotary positions of its cells (images)
        self.seen: list[int] = []   # t_0..t_m: the head holds the entries of positions 0..m-1
        self.trunk: dict[int, np.ndarray] = {}   # the trunk's states of positions without an entry yet
        self.tokens: dict[int, int] = {}         # the tokens the trunk read at those positions
        self.rows: dict[int, np.ndarray] = {}    # the input embeddings it read there (an image's rows)
        self.head_state: np.ndarray | None = None
        self.flush_at = 2 * engine.n_ubatch   # states kept before a long prompt's entries are made

    @property
    def entries(self) -> int:
        return max(len(self.seen) - 1, 0)

    # -- states handed over ------------------------------------------------------------------------
    def on_trunk(self, pos: np.ndarray, ids: np.ndarray, states: np.ndarray, rows: np.ndarray | None = None) -> None:
        """The trunk read tokens `ids` at positions `pos`, ending in `states`; `rows`: the input
        embeddings it read instead of the ids' (an image's rows, the ids its placeholders)."""
        first = int(pos.min())
        for p in [p for p in self.trunk if p >= first]:   # read again: the older states are stale
            del self.trunk[p], self.tokens[p]
        for p in [p for p in self.rows if p >= first]:
            del self.rows[p]
        for k, (p, t, r) in enumerate(zip(pos.tolist(), ids.tolist(), states)):
            self.trunk[p], self.tokens[p] = np.array(r, np.float32), t
            if rows is not None:
                self.rows[p] = np.array(rows[k], np.float32)
        if len(self.trunk) > self.flush_at:   # a long prompt: make its entries as it goes
            self._flush()

    def on_head(self, rows: np.ndarray) -> None:
        self.head_state = np.array(rows[-1], np.float32)

    def _flush(self) -> None:
        """The entries of every position whose next token the trunk has read, in order. A
        position the trunk read again with another token takes back the entries from the one
        before it on; read again with the same one (a rewound recurrent state's replay), the
        entries stand (a state depends on the tokens up to it only)."""
        e = self.entries
        other = [p for p in self.tokens if p <= e and (p >= len(self.seen) or self.tokens[p] != self.seen[p])]
        m = min([e] + [max(p - 1, 0) for p in other])
        for p in [p for p in self.trunk if p < m]:   # read again: the head's entries hold them
            del self.trunk[p], self.tokens[p]
        self._keep(m)
        q = m
        while q + 1 in self.tokens:
            q += 1
        if q > m:
            seen = self.seen[:m + 1] if self.seen else [self.tokens.get(0, 0)]
            read = [self.tokens[p] for p in range(m + 1, q + 1)]   # _run takes those of m..q-1
            self._run(m, q - 1, seen[m:] + read)
            self.seen = seen + read

    # -- drafting ----------------------------------------------------------------------------------
    def draft(self, history: list[int], n: int) -> list[int]:
        return draft_together([(self, history, n)])[0]

    def _catch_up(self, history: list[int]) -> int:
        """Keep the entries `history` shares with the last one (entry L-2 is run again for its
        logits); the first entry to make (those from there to L-2 follow)."""
        L = len(history)
        common = 0
        limit = min(len(self.seen), L)
        while common < limit and self.seen[common] == history[common]:
            common += 1
        keep = min(self.entries, max(common - 1, 0), L - 2)
        self._keep(keep)
        return keep

    def _done(self, history: list[int]) -> None:
        """The chained entries go (the trunk's states replace them): the head holds 0..L-2."""
        L = len(history)
        self.engine.truncate(self.seq_id, L - 1)
        self.seen = list(history)
        for p in [p for p in self.trunk if p <= L - 2]:
            del self.trunk[p], self.tokens[p]
        for p in [p for p in self.rows if p <= L - 1]:
            del self.rows[p]

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

    def _run(self, first: int, last: int, tokens: list[int]) -> np.ndarray:
        """The entries of positions first..last (`tokens`: those at first..last + 1, each entry's
        own and the one after it), in steps of the head's micro-batch, the entries of an image's
        positions (placeholders: negative) in steps of input embeddings; the logits of the last."""
        self._check_length(first)
        states, ub, logits = self._states(first, last + 1), self.engine.n_ubatch, None
        image = [tokens[k] < 0 or tokens[k + 1] < 0 for k in range(last + 1 - first)]
        a = 0
        while a < len(image):
            b = a + 1
            while b < len(image) and b - a < ub and image[b] == image[a]:
                b += 1
            self.head.write_hidden(states[a:b])
            logits = self._embedded(first + a, tokens[a + 1:b + 1]) if image[a] else \
                self.engine.eval(tokens[a + 1:b + 1], self.seq_id)
            a = b
        return logits

    def _embedded(self, first: int, nexts: list[int]) -> np.ndarray:
        """Append the entries of positions first.. whose next tokens are `nexts` as input
        embeddings: an image row the trunk read (zeros where it handed none over) or a token's
        embedding, at the trunk's rotary positions; the logits of the last."""
        rows = np.zeros((len(nexts), self.head.cfg.n_embd), np.float32)
        text = [k for k, t in enumerate(nexts) if t >= 0]
        if text:
            rows[text] = self.head.token_rows([nexts[k] for k in text])
        for k, t in enumerate(nexts):
            row = self.rows.pop(first + 1 + k, None) if t < 0 else None
            if row is not None:
                rows[k] = row
        rope, after = self._positions(first, len(nexts))
        return self.engine.embed(rows, rope, after, self.seq_id)

    def _positions(self, first: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The rotary positions (rope [n, 3], after [n]) of the trunk's positions first..first+n-1."""
        if self.target is None:
            raise VkrtError("MTP head: a sequence with images needs the trunk's engine (its rotary positions)")
        cells = self.target.cache.cells
        held = cells.cells_of(self.seq_id, first + n)[first:]
        return cells.rope[held], cells.after[held]

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
        firsts = [d._catch_up(h) for _, d, h, _ in live]
        for (_, d, _, _), first in zip(live, firsts):
            d._check_length(first)
        # text only and within a micro-batch: one step; else each its own (_run: an image's entries)
        if sum(len(h) - 1 - f for (_, _, h, _), f in zip(live, firsts)) <= engine.n_ubatch and \
                all(min(h[f:]) >= 0 for (_, _, h, _), f in zip(live, firsts)):
            head.write_hidden(np.concatenate([d._states(f, len(h) - 1) for (_, d, h, _), f in zip(live, firsts)]))
            rows = list(engine.mixed([(d.seq_id, h[f + 1:]) for (_, d, h, _), f in zip(live, firsts)]))
        else:
            rows = [d._run(f, len(h) - 2, h[f:]) for (_, d, h, _), f in zip(live, firsts)]
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
