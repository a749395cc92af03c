"""Sampling the next token from logits on the host, in llama.cpp's order:
repetition penalty -> top-k -> top-p -> min-p -> temperature -> draw (greedy when temp <= 0)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import VkrtError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


GREEDY = SamplingParams(temperature=0.0)


class Sampler:
    """Stateful per sequence: the seeded generator and the recent tokens for the penalty."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)
        self.recent: list[int] = []

    def accept(self, token: int) -> None:
        self.recent.append(int(token))
        if len(self.recent) > max(self.params.repeat_last_n, 0):
            del self.recent[:len(self.recent) - self.params.repeat_last_n]

    def sample(self, logits: np.ndarray) -> int:
        p = self.params
        logits = np.asarray(logits, dtype=np.float32)
        if p.repeat_penalty != 1.0 and self.recent:
            logits = logits.copy()
            ids = np.unique(np.asarray(self.recent, dtype=np.int64))
            vals = logits[ids]
            logits[ids] = np.where(vals > 0, vals / p.repeat_penalty, vals * p.repeat_penalty)
        if p.greedy:
            return int(np.argmax(logits))
        ids = np.arange(logits.size)
        if 0 < p.top_k < logits.size:
            keep = np.argpartition(-logits, p.top_k - 1)[:p.top_k]
            ids, logits = ids[keep], logits[keep]
        order = np.argsort(-logits, kind="stable")
        return self._draw(ids[order], logits[order])

    def takes_candidates(self, n: int) -> bool:
        """Whether sample_top over the best n logits picks as sample() over the whole row would:
        greedy, or a top-k cut of at most n; no penalty (it needs every logit)."""
        p = self.params
        return p.repeat_penalty == 1.0 and (p.greedy or 0 < p.top_k <= n)

    def sample_top(self, values: np.ndarray, ids: np.ndarray) -> int:
        """Sample from the best candidates of a row (values descending, their token ids), as
        sample() would from the whole row (see takes_candidates)."""
        k = self.params.top_k
        if not self.takes_candidates(len(values)):
            raise VkrtError(f"sampling from {len(values)} candidates needs greedy or top_k in 1..{len(values)} and "
                            f"no repetition penalty, got {self.params}")
        if self.params.greedy:
            return int(ids[0])   # the best, the lowest id on ties: np.argmax's pick
        return self._draw(np.asarray(ids[:k], np.int64), np.asarray(values[:k], np.float32))

    def _draw(self, ids: np.ndarray, logits: np.ndarray) -> int:
        """top-p, min-p, temperature and the draw over candidates sorted best first."""
        p = self.params
        logits = logits.astype(np.float64)
        probs = np.exp(logits - logits[0])
        probs /= probs.sum()
        if p.top_p < 1.0:
            cut = int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1
            ids, logits, probs = ids[:cut], logits[:cut], probs[:cut]
        if p.min_p > 0.0:
            keep = probs >= p.min_p * probs[0]
            ids, logits = ids[keep], logits[keep]
        scaled = logits / p.temperature
        probs = np.exp(scaled - scaled.max())
        probs /= probs.sum()
        return int(ids[self.rng.choice(ids.size, p=probs)])
