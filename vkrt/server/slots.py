"""A slot: one KV-cache sequence of at most n_ctx / --parallel cells, the tokens it holds (for
prompt-prefix reuse) and, while busy, the job it generates for."""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from ..engine.generate import Timings
from ..engine.grammar import Constraint, GrammarError
from ..engine.sampler import Sampler
from ..errors import VkrtError
from .formats import timings_of
from .jobs import Done, Job, Piece, TokenProb
from .metrics import Metrics
from .reasoning_budget import ThinkingBudget
from .text import Detokenizer, StopMatcher


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def text_ahead(pending: list[int]) -> int:
    """Prompt tokens before the next image's (its placeholder ids are negative: media_prompt.py)."""
    for i, t in enumerate(pending):
        if t < 0:
            return i
    return len(pending)


class Slot:
    """States: idle (job is None), prefill (prompt tokens pending), generating (next_token set)."""

    def __init__(self, id: int, n_ctx: int, metrics: Metrics):
        self.id = id
        self.n_ctx = n_ctx
        self.metrics = metrics
        self.cache: list[int] = []        # tokens whose K/V the sequence holds, in order
        self.job: Job | None = None
        self.last_used = 0.0
        self.pending: list[int] = []
        self.next_token: int | None = None
        self.generated: list[int] = []
        self.grammar: Constraint | None = None
        self.drafter = None               # speculative decoding: this slot's drafter (None: off)
        self.replay: list[int] = []       # accepted tokens a rewound recurrent state must read again

    @property
    def idle(self) -> bool:
        return self.job is None

    @property
    def prefilling(self) -> bool:
        return self.job is not None and bool(self.pending)

    @property
    def generating(self) -> bool:
        return self.job is not None and self.next_token is not None

    def reusable(self, prompt: list[int]) -> int:
        """Prompt tokens this slot already holds (at least one prompt token is always evaluated,
        for its logits)."""
        return min(common_prefix(self.cache, prompt), len(prompt) - 1)

    def begin(self, job: Job, tokenizer, keep: int, grammar: Constraint | None = None) -> None:
        """Take `job`, whose first `keep` prompt tokens the sequence already holds (the caller
        drops the sequence's cells from there on); `grammar`: the job's constraint."""
        self.job = job
        self.cache = self.cache[:keep]
        self.pending = job.prompt[keep:]
        self.next_token = None
        self.generated = []
        self.replay = []
        self.sampler = Sampler(job.params)
        window = self.sampler.window
        for t in job.prompt if window is None else job.prompt[-window:] if window > 0 else ():
            if t >= 0:   # not an image's placeholder
                self.sampler.accept(t)
        self.detok = Detokenizer(tokenizer, job.keep_special)
        self.stops = StopMatcher(job.stop)
        room = self.n_ctx - len(job.prompt)
        self.limit = room if job.max_tokens is None else min(job.max_tokens, room)
        self.slot_full = job.max_tokens is None or job.max_tokens > room   # the limit is the slot's room
        self.grammar = grammar
        self.budget = ThinkingBudget(job.reasoning_budget) if job.reasoning_budget is not None else None
        self.eog = frozenset() if job.ignore_eos else tokenizer.eog_ids
        if grammar is not None:   # the grammar's end is the output's end
            self.eog = self.eog | grammar.eos
        self.cached = keep
        self.timings = Timings(prompt_n=len(self.pending))
        self.t_start = time.perf_counter()
        self.t_first = None

    def prefilled(self, logits=None, top=None) -> None:
        """The last prompt token's logits (or best candidates, as sample takes them) arrived:
        sample the first token (unless none is wanted)."""
        self.t_first = time.perf_counter()
        self.timings.prompt_ms = (self.t_first - self.t_start) * 1e3
        if self.limit <= 0:
            self.finish("length", "limit")
        else:
            self.sample(logits, top)

    def sample(self, logits=None, top=None) -> None:
        """Pick the next token from a row of logits, or from the best candidates (values, ids)
        where the sampler takes them (Sampler.takes_candidates). With a grammar the candidates
        come masked (mask()); a whole row is masked here."""
        if self.grammar is not None:
            self.grammar.mask()   # a dead end is reported here
        # the reasoning budget may be closing a thinking block: its token, not a sampled one
        token = self.budget.next_forced(self._allowed) if self.budget is not None else None
        if token is None:
            token = (self.sampler.sample_top(*top, adjusted=True) if top is not None else
                     self.sampler.sample(logits if self.grammar is None else self.grammar.apply(logits)))
        if token in self.eog:
            self.finish("stop", "eos")
            return
        self.sampler.accept(token)
        if self.grammar is not None:
            self.grammar.accept(token)
        self.generated.append(token)
        self.metrics.tokens_predicted += 1
        piece = self.detok.push(token)
        if self.budget is not None:
            self.budget.accept(token, piece, whole=self.detok.read == len(self.detok.tokens))
        text = self.stops.push(piece)
        probs = [] if self.job.logprobs is None else [self._token_prob(token, logits, self.job.logprobs)]
        self.job.emit(Piece(text, [token], probs, self._timings_so_far() if self.job.timings_per_token else None))
        if self.stops.hit is not None:
            self.finish("stop", "word")
        elif len(self.generated) >= self.limit:
            self.finish("length", "limit")
        else:
            self.next_token = token

    def _timings_so_far(self) -> dict:
        """llama-server's `timings` object as of the token just sampled (timings_per_token)."""
        t = dataclasses.replace(self.timings, predicted_n=len(self.generated),
                                predicted_ms=(time.perf_counter() - self.t_first) * 1e3)
        return timings_of(t, self.cached)

    def _allowed(self, token: int) -> bool:
        """Whether the request's grammar (if any) takes `token` next."""
        if self.grammar is None:
            return True
        return bool(self.grammar.mask()[token >> 5] >> np.uint32(token & 31) & 1)

    def _token_prob(self, token: int, logits, n: int) -> TokenProb:
        """`token`'s log-probability in the row and the row's n best, from the raw logits."""
        if logits is None:
            raise VkrtError("log-probabilities need the whole row of logits")
        row = np.asarray(logits, np.float64)
        lse = row.max() + np.log(np.exp(row - row.max()).sum())
        best = np.argpartition(-row, n - 1)[:n] if 0 < n < row.size else np.arange(row.size if n else 0)
        best = best[np.lexsort((best, -row[best]))]   # best first, ties by id

        def entry(t: int):
            raw = self.detok.tokenizer.piece_bytes(int(t))
            return int(t), raw.decode("utf-8", "replace"), raw, float(row[t] - lse)

        tid, text, raw, lp = entry(token)
        return TokenProb(tid, text, raw, lp, [entry(t) for t in best])

    def fed(self) -> None:
        """next_token went into the KV cache."""
        self.cache.append(self.next_token)

    def finish(self, reason: str, stop_type: str) -> Done:
        job = self.job
        rest = "" if self.stops.hit is not None else self.stops.push(self.detok.flush())
        if self.stops.hit is None:
            rest += self.stops.flush()
        else:
            reason, stop_type = "stop", "word"
        if rest:
            job.emit(Piece(rest, []))
        t = self.timings
        t.predicted_n = len(self.generated)
        t.predicted_ms = (time.perf_counter() - self.t_first) * 1e3 if self.t_first else 0.0
        truncated = stop_type == "limit" and self.slot_full and len(self.generated) >= self.limit
        done = Done(reason, stop_type, self.stops.hit or "", len(job.prompt), self.cached, len(self.generated), t,
                    self.id, truncated)
        self.metrics.requests_finished += 1
        job.emit(done)
        self.release()
        return done

    def mask(self):
        """The grammar's mask of the next token for the GPU (None: no grammar, or a dead end that
        sample() then reports)."""
        if self.grammar is None:
            return None
        try:
            return self.grammar.mask()
        except GrammarError:
            return None

    def release(self) -> None:
        self.job = None
        self.grammar = None
        self.pending = []
        self.next_token = None
        self.replay = []
        self.last_used = time.monotonic()
