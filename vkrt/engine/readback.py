"""Readback: what a step's last stage hands the host, and the tables the host hands that stage.

A step ends in one of four ways (the graph records which, step_graph.py): its logits rows are
copied to a host-visible buffer; an argmax on the GPU writes the greedy token (4 bytes, two
copies: the next chained step's input); the CANDIDATES best logits of each row are picked on
the GPU after the host's logit adjustments and grammar masks (512 bytes a row); or every
token's final hidden state is copied back. The adjustment and mask tables are read by the GPU
where the host wrote them (a few hundred bytes, a few KB a row: not worth a copy to VRAM).
"""

from __future__ import annotations

import numpy as np

from ..errors import VkrtError
from ..memory import I32, Buffer, BufferRange, MemoryKind, Tensor
from ..ops.argmax import MAX_PARTS, argmax
from ..ops.logit_adjust import logit_adjust, pack_table, table_words
from ..ops.token_mask import pack_masks, table_words as mask_table_words, token_mask
from ..ops.topk import scratch_words, top_candidates
from ..owned import Owned

CANDIDATES = 64   # the best logits Engine.candidates reads back (a sampler's top-k up to this)
CANDIDATE_ROWS = 64   # the most tokens a step reads candidates of (decode_candidates' batch)
ADJUST_CAP = 128   # logit adjustments (bias, penalties, DRY: tokens) a candidates row takes on the GPU


class Readback(Owned):
    """The readback and table buffers of an engine on `device` for a vocabulary of `vocab`
    tokens, states of `n_embd` and steps of at most `n_ubatch` tokens: logits rows, greedy
    tokens with the argmax's partials, top-k candidates with their scratch, the logit
    adjustments; the token masks' table and the hidden states' buffer are made on first use.
    Candidates are read for at most `candidate_rows` tokens a step."""

    def __init__(self, device, vocab: int, n_embd: int, n_ubatch: int):
        super().__init__("readback")
        self.device, self.vocab, self.n_embd, self.n_ubatch = device, vocab, n_embd, n_ubatch
        self.candidate_rows = min(CANDIDATE_ROWS, n_ubatch)
        self._tokens = self._argmax_part = self._top = self._adjust = self._logits = None
        self._masks = self._hidden = None
        self._top_scratch = ()
        try:
            self._tokens = Buffer(device, 64, MemoryKind.READBACK, label="greedy tokens")
            self._argmax_part = Tensor.empty(device, I32, (2 * MAX_PARTS,), name="argmax partials")
            words = scratch_words(vocab, CANDIDATES, self.candidate_rows)
            self._top_scratch = tuple(Tensor.empty(device, I32, (words,), name="top-k scratch") for _ in range(2))
            self._top = Buffer(device, 8 * CANDIDATES * self.candidate_rows, MemoryKind.READBACK,
                               label="top-k candidates")
            self._adjust = Buffer(device, 4 * table_words(self.candidate_rows, ADJUST_CAP), MemoryKind.HOST,
                                  label="logit adjustments")
            self._logits = Buffer(device, 4 * vocab * n_ubatch, MemoryKind.READBACK, label="logits readback")
        except BaseException:
            self.close()
            raise

    # -- recording: how a step's graph ends --------------------------------------------------------
    def record_rows(self, seq, logits: Tensor, n: int, row: int) -> None:
        """Copy n rows of `logits` to the readback buffer from row `row` on."""
        row_bytes = 4 * self.vocab
        seq.copy(logits.range(), self._logits.range(row * row_bytes, n * row_bytes), n * row_bytes)

    def record_argmax(self, seq, logits: Tensor, ids: Tensor, parity: int) -> None:
        """The argmax of the first row of `logits` into `ids` (the next chained step's input)
        and greedy token copy `parity` (the host's)."""
        token = Tensor.on(BufferRange(self._tokens, 16 * parity, 4), I32, (1,), name="greedy token")
        argmax(seq, logits.slice(1, 0, 1).view((self.vocab,)), self._argmax_part, ids.slice(0, 0, 1), token)

    def record_candidates(self, seq, logits: Tensor, n: int, row: int, adjust: bool, masked: bool) -> None:
        """The CANDIDATES best of n rows of `logits` into the candidates buffer from row `row` on,
        after the adjustment table (adjust) and then the token masks (masked) the host wrote."""
        logits = logits.slice(1, 0, n)
        if adjust:   # candidates rows fit one slice of logits: row is 0
            words = table_words(n, ADJUST_CAP)
            logit_adjust(seq, logits, Tensor.on(self._adjust.range(0, 4 * words), I32, (words,),
                                                name="logit adjustments"), ADJUST_CAP)
        if masked:
            words = mask_table_words(n, self.vocab)
            token_mask(seq, logits, Tensor.on(self._mask_table().range(0, 4 * words), I32, (words,),
                                              name="token masks"))
        per_row = 8 * CANDIDATES
        top_candidates(seq, logits, CANDIDATES, self._top_scratch,
                       Tensor.on(self._top.range(row * per_row, n * per_row), I32, (2 * CANDIDATES * n,),
                                 name="candidates"))

    def record_hidden(self, seq, cur: Tensor) -> None:
        """Copy every token's normed final state `cur` to the hidden states' buffer."""
        seq.copy(cur.range(), self._hidden.range(0, cur.nbytes), cur.nbytes)

    # -- the host's side ---------------------------------------------------------------------------
    def logits(self, rows: int) -> np.ndarray:
        """The first `rows` rows of logits a step copied back, [rows, vocab]."""
        return self._logits.read(np.float32, 4 * self.vocab * rows).reshape(rows, self.vocab)

    def token(self, parity: int) -> int:
        """The token a chain step's argmax wrote (copy `parity`)."""
        return int(self._tokens.read(np.int32, 4, 16 * parity)[0])

    def candidates(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """The candidates of `rows` rows: (values, token ids), [rows, k] each, best first."""
        pairs = self._top.read(np.uint32, 8 * CANDIDATES * rows).reshape(rows, CANDIDATES, 2)
        k = int((pairs[0, :, 1] != 0xFFFFFFFF).sum())   # a vocabulary smaller than CANDIDATES pads the list
        return pairs[:, :k, 0].view(np.float32), pairs[:, :k, 1].astype(np.int64)

    def open_hidden(self) -> None:
        """Make the hidden states' buffer (before the first hidden_states step records)."""
        if self._hidden is None:
            self._hidden = Buffer(self.device, 4 * self.n_embd * self.n_ubatch, MemoryKind.READBACK,
                                  label="hidden states")

    def hidden(self, rows: int) -> np.ndarray:
        """The hidden states of `rows` tokens a step copied back, [rows, n_embd]."""
        return self._hidden.read(np.float32, 4 * self.n_embd * rows).reshape(rows, self.n_embd)

    @staticmethod
    def check_tables(adjustments: list | None, masks: list | None, n: int, what: str) -> None:
        """Refuse a step of n rows with other than n adjustments or token masks (None: none)."""
        for name, rows in (("adjustments", adjustments), ("token masks", masks)):
            if rows is not None and len(rows) != n:
                raise VkrtError(f"{what}: {len(rows)} {name} for {n} tokens")

    def write_tables(self, adjustments: list | None, masks: list | None, rows: int) -> None:
        """The logit adjustments (the table logit_adjust reads: a count a row, then ADJUST_CAP
        entries a row) and token masks of a step's `rows` rows (None: none; group_rows padded
        the callers' lists, check_tables checked, to `rows`)."""
        if adjustments is not None:
            words = pack_table(rows, ADJUST_CAP, [None if a is None else a.words() for a in adjustments])
            self._adjust.host_bytes[:words.nbytes] = words.view(np.uint8)
        if masks is not None:
            self.write_masks(masks, rows)

    def write_masks(self, masks: list | None, rows: int) -> bool:
        """The table token_mask reads (a flag a row, then its bitmask); whether any row has a mask."""
        if masks is None or all(m is None for m in masks):
            return False
        if len(masks) != rows:
            raise VkrtError(f"{len(masks)} token masks for {rows} tokens")
        pack_masks(rows, self.vocab, masks, out=self._mask_table().host_bytes.view(np.uint32))
        return True

    def _mask_table(self) -> Buffer:
        """The token masks' table, made on first use."""
        if self._masks is None:
            words = mask_table_words(self.candidate_rows, self.vocab)
            self._masks = Buffer(self.device, 4 * words, MemoryKind.HOST, label="token masks")
        return self._masks

    def _release(self) -> None:
        for obj in (self._logits, self._tokens, self._argmax_part, self._top, self._adjust, self._hidden, self._masks,
                    *self._top_scratch):
            if obj is not None:
                obj.close()
