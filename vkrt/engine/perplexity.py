"""Perplexity as llama-perplexity computes it: the text cut into chunks of n_ctx tokens, each
evaluated afresh (its first token replaced by BOS when the vocabulary adds one) and scored on
its second half, from position n_ctx // 2 on, by the negative log-likelihood of the next token."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..errors import VkrtError
from .kl_file import scored_rows

if TYPE_CHECKING:   # the command line imports this module before Vulkan is known to load
    from .engine import Engine


class PerplexityError(VkrtError):
    """Input perplexity cannot be computed on (a text too short for the context, ...)."""


def chunk_count(n_tokens: int, n_ctx: int, n_chunks: int = -1) -> int:
    """Chunks llama-perplexity scores: n_tokens // n_ctx, at most n_chunks (when >= 0); it needs
    at least 2 * n_ctx tokens."""
    if n_tokens < 2 * n_ctx:
        raise PerplexityError(f"you need at least {2 * n_ctx} tokens to evaluate perplexity with a context of "
                              f"{n_ctx}; the data file you provided tokenizes to only {n_tokens} tokens")
    if n_chunks == 0:
        raise PerplexityError("--chunks 0: no chunk to evaluate (-1: all the text makes)")
    most = n_tokens // n_ctx
    return most if n_chunks < 0 else min(n_chunks, most)


def chunk_logits(engine: Engine, chunk: np.ndarray, n_batch: int, bos: int | None) -> np.ndarray:
    """Evaluate one chunk from an empty cache, in batches of n_batch tokens, with its first token
    replaced by `bos` (unless None); returns the logits of its scored rows [scored_rows, vocab]."""
    n_ctx = chunk.size
    first = n_ctx // 2
    tokens = chunk.astype(np.int32)
    if bos is not None:
        tokens[0] = bos
    engine.reset()
    rows = []
    for b0 in range(0, n_ctx, n_batch):
        batch = tokens[b0:b0 + n_batch]
        if b0 + batch.size <= first:
            engine.eval(batch)   # no scored row in this batch: only the last token's logits come back
            continue
        logits = engine.eval(batch, all_logits=True)
        rows.append(logits[max(0, first - b0):])
    return np.concatenate(rows)[:scored_rows(n_ctx)]


def row_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """-log softmax(row)[target] of each row, float64 (exponentials in float32, summed in
    float64, as llama-perplexity)."""
    logits = np.asarray(logits, np.float32)
    hi = logits.max(axis=1)
    sum_exp = np.exp(logits - hi[:, None]).sum(axis=1, dtype=np.float64)
    picked = logits[np.arange(logits.shape[0]), targets]
    return np.log(sum_exp) - (picked - hi).astype(np.float64)


@dataclass
class NllSums:
    """Running sums of the scored tokens' negative log-likelihoods."""

    nll: float = 0.0
    nll2: float = 0.0
    count: int = 0

    def add(self, values: np.ndarray) -> None:
        self.nll += float(values.sum())
        self.nll2 += float((values * values).sum())
        self.count += values.size

    @property
    def ppl(self) -> float:
        return math.exp(self.nll / self.count)

    @property
    def ppl_error(self) -> float | None:
        """llama-perplexity's uncertainty of the final PPL: ppl * sqrt(var(nll) / (count - 1));
        None when the variance is not positive."""
        mean = self.nll / self.count
        var = self.nll2 / self.count - mean * mean
        if var <= 0 or self.count < 2:
            return None
        return math.sqrt(var / (self.count - 1)) * self.ppl


def chunk_scores(engine: Engine, tokens: np.ndarray, n_ctx: int, n_batch: int, n_chunk: int, bos: int | None):
    """Yield (chunk index, logits of its scored rows, the tokens they predict) for each chunk."""
    tokens = np.asarray(tokens, np.int32)
    first = n_ctx // 2
    for i in range(n_chunk):
        chunk = tokens[i * n_ctx:(i + 1) * n_ctx]
        yield i, chunk_logits(engine, chunk, n_batch, bos), chunk[first + 1:]
