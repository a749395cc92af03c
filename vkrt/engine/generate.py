"""Text generation on an Engine: prefill the prompt, then sample token by token."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np

from ..errors import ConfigError
from ..model.media_prompt import MediaPrompt
from .grammar import Constraint
from .media import eval_prompt
from .readback import ADJUST_CAP, CANDIDATES
from .sampler import Sampler, SamplingParams
from .speculative import RowPicker, SpecCounts, Speculation, speculate


@dataclass
class Timings:
    prompt_n: int = 0
    prompt_ms: float = 0.0
    predicted_n: int = 0
    predicted_ms: float = 0.0
    draft_n: int = 0            # speculative decoding: tokens drafted
    draft_n_accepted: int = 0   # ... and accepted

    @property
    def prompt_per_second(self) -> float:
        return self.prompt_n / (self.prompt_ms / 1e3) if self.prompt_ms else 0.0

    @property
    def predicted_per_second(self) -> float:
        return self.predicted_n / (self.predicted_ms / 1e3) if self.predicted_ms else 0.0

    def to_dict(self) -> dict:
        return {"prompt_n": self.prompt_n, "prompt_ms": self.prompt_ms, "prompt_per_second": self.prompt_per_second,
                "predicted_n": self.predicted_n, "predicted_ms": self.predicted_ms,
                "predicted_per_second": self.predicted_per_second,
                **({"draft_n": self.draft_n, "draft_n_accepted": self.draft_n_accepted} if self.draft_n else {})}


@dataclass
class Generation:
    prompt_tokens: list[int]
    tokens: list[int] = field(default_factory=list)
    stop_reason: str = "length"   # "length" | "eos" | "stop"
    timings: Timings = field(default_factory=Timings)


def generate(engine, prompt_tokens: list[int] | MediaPrompt, n_predict: int, params: SamplingParams, *, seq_id: int = 0,
             stop_tokens: Iterable[int] = (), on_token: Callable[[int], bool | None] | None = None,
             grammar: Constraint | None = None, speculation: Speculation | None = None) -> Generation:
    """Prefill `prompt_tokens` (after the sequence's cached ones) and sample up to n_predict tokens.
    on_token(token) may return True to stop early. grammar: only tokens it allows are sampled
    (masked on the GPU before the candidates are picked), and its EOS tokens end generation.
    speculation: draft tokens and verify them in one step (speculative.py; the same tokens
    are generated, the same way distributed; with images only an MTP head drafts). A MediaPrompt
    (images in the prompt) is read as media.eval_prompt reads it; its image tokens are no tokens to
    the sampler."""
    media = prompt_tokens if isinstance(prompt_tokens, MediaPrompt) else None
    if media is not None and speculation is not None and not getattr(speculation.drafter, "takes_images", False):
        raise ConfigError("n-gram and draft-model speculation do not take prompts with images (they would draft "
                          "the image's placeholder ids); the MTP head does (--spec-type mtp)")
    text = media.text_tokens if media is not None else prompt_tokens
    sampler = Sampler(params)
    for t in text[-params.repeat_last_n:] if params.repeat_last_n > 0 else ():
        sampler.accept(t)
    gen = Generation(list(media.tokens if media is not None else prompt_tokens))
    stops = set(stop_tokens)
    t0 = time.perf_counter()
    logits = eval_prompt(engine, media, seq_id) if media is not None else engine.eval(prompt_tokens, seq_id)
    gen.timings.prompt_n = len(prompt_tokens)
    gen.timings.prompt_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    if speculation is not None and n_predict > 0:
        _generate_speculative(engine, logits, seq_id, n_predict, sampler, stops, on_token, gen, grammar, speculation)
    elif params.greedy and not params.needs_row and grammar is None and n_predict > 0:
        _generate_greedy(engine, int(np.argmax(logits)), seq_id, n_predict, stops, on_token, gen)
    else:
        _generate_sampled(engine, logits, seq_id, n_predict, sampler, stops, on_token, gen,
                          candidates=sampler.takes_candidates(CANDIDATES, adjusted=True), grammar=grammar)
    gen.timings.predicted_n = len(gen.tokens)
    gen.timings.predicted_ms = (time.perf_counter() - t0) * 1e3
    return gen


def _take(token: int, stops, on_token, gen: Generation) -> bool:
    """Record a generated token; whether generation stops here."""
    if token in stops:
        gen.stop_reason = "eos"
        return True
    gen.tokens.append(token)
    if on_token is not None and on_token(token):
        gen.stop_reason = "stop"
        return True
    return False


def _generate_greedy(engine, first: int, seq_id: int, n_predict: int, stops, on_token, gen: Generation) -> None:
    """Greedy decoding with the argmax on the GPU (Engine.greedy): the host reads 4 bytes a token."""
    if _take(first, stops, on_token, gen) or n_predict == 1:
        return
    tokens = engine.greedy(first, seq_id, n_predict - 1)
    try:
        for token in tokens:
            if _take(token, stops, on_token, gen):
                return
    finally:
        tokens.close()   # a step submitted ahead for a token not taken is forgotten


def _generate_speculative(engine, logits, seq_id: int, n_predict: int, sampler: Sampler, stops, on_token,
                          gen: Generation, grammar: Constraint | None, spec: Speculation) -> None:
    """Sampling with speculation (speculative.speculate) after the prompt's logits."""
    ends = stops | grammar.eos if grammar is not None else stops

    def take(token: int) -> bool:
        if _take(token, ends, on_token, gen):
            return True
        sampler.accept(token)
        if grammar is not None:
            grammar.accept(token)
        return False

    first = sampler.sample(logits if grammar is None else grammar.apply(logits))
    if take(first):
        return
    counts = SpecCounts()
    speculate(engine, seq_id, first, list(gen.prompt_tokens) + [first], n_predict - 1, spec,
              RowPicker(sampler, grammar), take, counts)
    gen.timings.draft_n, gen.timings.draft_n_accepted = counts.drafted, counts.accepted


def _generate_sampled(engine, logits, seq_id: int, n_predict: int, sampler: Sampler, stops, on_token,
                      gen: Generation, candidates: bool = False, grammar: Constraint | None = None) -> None:
    """Sampling on the host: from the whole row, or (`candidates`: a top-k of at most CANDIDATES)
    from the best logits the GPU picked after applying the sampler's logit bias, penalties and
    DRY to the row, the same draw for the host's 512 bytes (the whole row when those name more
    than ADJUST_CAP tokens). A grammar's mask goes with the adjustments (or masks a whole row here)."""
    top = None
    ends = stops | grammar.eos if grammar is not None else stops
    for i in range(n_predict):
        if top is None:
            token = sampler.sample(logits if grammar is None else grammar.apply(logits))
        else:
            token = sampler.sample_top(*top, adjusted=True)
        if _take(token, ends, on_token, gen):
            return
        sampler.accept(token)
        if grammar is not None:
            grammar.accept(token)
        if i + 1 >= n_predict:
            return
        adjust = sampler.adjustments() if candidates else None
        if candidates and (adjust is None or len(adjust) <= ADJUST_CAP):
            masks = None if grammar is None else [grammar.mask()]
            values, ids = engine.decode_candidates([(seq_id, token)], [adjust], masks)
            top = values[0], ids[0]
        else:
            top, logits = None, engine.eval([token], seq_id)


class TextStream:
    """Turns a growing token list into text pieces, holding back incomplete UTF-8 sequences."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self.emitted = 0

    def push(self, token: int) -> str:
        self.tokens.append(token)
        text = self.tokenizer.decode(self.tokens, skip_special=True)
        if text.endswith("\ufffd"):
            return ""
        piece = text[self.emitted:]
        self.emitted = len(text)
        return piece

    def flush(self) -> str:
        text = self.tokenizer.decode(self.tokens, skip_special=True)
        piece = text[self.emitted:]
        self.emitted = len(text)
        return piece


def random_tokens(n: int, vocab: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab, n).tolist()
