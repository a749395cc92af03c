"""A generation job: what the scheduler thread works on, and the events it sends back to the
asyncio handler that waits for them."""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import NamedTuple

from ..engine.generate import Timings
from ..engine.grammar import Constraint
from ..engine.sampler import SamplingParams
from .reasoning_budget import BudgetSpec

_ids = itertools.count(1)


@dataclass
class TokenProb:
    """A generated token's log-probability under the model (the softmax of its raw logits) and the
    most likely tokens at that step (id, text, bytes, logprob), best first."""

    id: int
    text: str
    bytes: bytes
    logprob: float
    top: list = field(default_factory=list)


@dataclass
class Piece:
    """New text (may be empty while a stop string or a UTF-8 character is undecided), its tokens
    and, when the request asked for them, their log-probabilities and llama-server's `timings` so far."""

    text: str
    tokens: list[int]
    probs: list = field(default_factory=list)
    timings: dict | None = None


@dataclass
class Done:
    finish_reason: str            # "stop" | "length" (OpenAI)
    stop_type: str                # "eos" | "word" | "limit" (llama-server)
    stop_word: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    timings: Timings
    slot: int
    truncated: bool = False       # generation stopped because the slot's context was full


class Choice(NamedTuple):
    """A finished choice of a request: its text, tokens, end, and log-probabilities (if asked)."""

    text: str
    tokens: list[int]
    done: Done
    probs: list


@dataclass
class Failed:
    status: int
    message: str

    @property
    def type(self) -> str:
        """The OpenAI error type of the status."""
        return {500: "server_error", 400: "invalid_request_error"}.get(self.status, "unavailable_error")


class Events:
    """The events the scheduler thread sends a job's asyncio handler (a dataclass base: its
    __post_init__ binds the running loop)."""

    def __post_init__(self):
        self._loop = asyncio.get_running_loop()
        self._events: asyncio.Queue = asyncio.Queue()

    def emit(self, event) -> None:
        """Called from the scheduler thread."""
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody waits for this job any more
            pass

    async def next_event(self):
        return await self._events.get()


@dataclass
class Job(Events):
    """One request's generation. Created on the event loop; run by the scheduler thread."""

    prompt: list[int]
    max_tokens: int | None
    params: SamplingParams
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    cache_prompt: bool = True
    logprobs: int | None = None   # None: none; n: each token's log-probability and the n most likely
    keep_special: frozenset[int] = frozenset()   # special tokens whose text the reply keeps
    constraint: Constraint | None = None   # the grammar state the output must fit (built by routes.py)
    draft: tuple | None = None   # speculative.n_max / n_min / p_min of the request (None each: the server's)
    reasoning_budget: BudgetSpec | None = None   # thinking tokens allowed (reasoning_budget.py; None: no limit)
    images: list = field(default_factory=list)   # (first token, ImageChunk): prompt ids < 0 are an image's
    timings_per_token: bool = False   # each streamed piece carries the timings so far (llama-server's)
    id_slot: int = -1   # the slot the request asked for (llama-server's id_slot; -1: any idle one)
    id: int = field(default_factory=lambda: next(_ids))
    created: float = field(default_factory=time.time)
    cancelled: bool = False


@dataclass
class Embedded:
    """An embedding job's result: per input, its pooled vector [1, n_embd] (or with pooling
    none every token's, [n_tokens, n_embd])."""

    vectors: list


@dataclass
class EmbeddingJob(Events):
    """One embeddings request: its inputs' tokens, read one input a scheduler iteration on an
    idle slot's sequence (cleared before and after each), then pooled."""

    inputs: list[list[int]]
    pooling: str
    done: list = field(default_factory=list)   # the inputs' vectors so far
    id: int = field(default_factory=lambda: next(_ids))
    cancelled: bool = False
