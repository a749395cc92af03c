"""Speculative decoding: a drafter proposes the next tokens, one step of the model checks them all.

A verification step appends the sampled token and its drafts to the sequence (Engine.verify)
and reads the next-token output after each. The sampler then draws from those rows in order,
as it would one step at a time (llama.cpp's rule: the draw at row i counts only while every
draft before it matched, so what is generated is distributed exactly as without
speculation): a draw equal to the draft moves to the next row, the first that differs is the
step's last token. The rejected drafts are taken back (Engine.truncate): KV cells are freed;
a recurrent state (DeltaNet layers) goes back to the snapshot taken before the step and forward
over the accepted tokens' kept inputs (a step of at most KEEP_COLUMNS tokens); after a longer
step the tokens it accepted are fed again at the front of the next step (replay), so a partly
rejected step costs a few more tokens in the next one, not a step of its own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import VkrtError
from .readback import CANDIDATES

SPEC_TYPES = ("ngram", "draft", "mtp")


@dataclass(frozen=True)
class SpecOptions:
    """How to speculate (llama-server's names): `type` ngram (lookup in the history), draft (a
    draft model) or mtp (the model's own MTP head); at most draft_max tokens a step, none when
    fewer than draft_min are proposed; a draft model or MTP head stops drafting below p_min;
    n-grams of ngram_min..ngram_max tokens."""

    type: str = "ngram"
    draft_max: int = 16
    draft_min: int = 0
    p_min: float = 0.75
    ngram_min: int = 2
    ngram_max: int = 8

    def __post_init__(self):
        if self.type not in SPEC_TYPES:
            raise VkrtError(f"--spec-type must be one of {', '.join(SPEC_TYPES)}; got {self.type!r}")
        if not 1 <= self.draft_max <= 256:
            raise VkrtError(f"--draft-max must be 1..256, got {self.draft_max}")
        if not 0 <= self.draft_min <= self.draft_max:
            raise VkrtError(f"--draft-min must be 0..--draft-max ({self.draft_max}), got {self.draft_min}")
        if not 0.0 <= self.p_min <= 1.0:
            raise VkrtError(f"--draft-p-min must be in [0, 1], got {self.p_min}")
        if not 1 <= self.ngram_min <= self.ngram_max <= 64:
            raise VkrtError(f"n-gram sizes must satisfy 1 <= min <= max <= 64, got {self.ngram_min}..{self.ngram_max}")

    def step_tokens(self, sequences: int = 1) -> int:
        """The most tokens a verification step of `sequences` takes: each one's draft_max drafts
        and its sampled token (Engine's verify_tokens)."""
        return sequences * (self.draft_max + 1)


@dataclass
class SpecCounts:
    """Verification steps run, draft tokens proposed and accepted."""

    steps: int = 0
    drafted: int = 0
    accepted: int = 0


@dataclass
class Speculation:
    """What a generation speculates with: the options and the drafter (drafters.py)."""

    options: SpecOptions
    drafter: object


class RowPicker:
    """Draws the generated token from each row of a verification step, with the sampler's state
    moving token by token: from the GPU's candidates where they stand for the row (top), else
    from the whole row (penalties, bias, DRY and a grammar applied on the host)."""

    def __init__(self, sampler, grammar=None):
        self.sampler, self.grammar = sampler, grammar
        self.top = grammar is None and not sampler.params.needs_row and sampler.takes_candidates(CANDIDATES)
        self.greedy = self.top and sampler.params.greedy   # the best token is all a row gives

    def pick(self, out, i: int) -> int:
        if self.top:
            values, ids = out
            return self.sampler.sample_top(values[i], ids[i])
        row = out[i]
        return self.sampler.sample(row if self.grammar is None else self.grammar.apply(row))


def step_room(engine, top: bool, replay: int) -> int:
    """The most drafts a verification step can carry after `replay` replayed tokens
    and the sampled one: Engine.verify_tokens (the candidates' rows with `top`) and the free cells."""
    rows = min(engine.candidate_rows if top else engine.n_ubatch, engine.verify_tokens)
    return max(0, min(rows - 1 - replay, engine.cache.cells.n_free() - 1 - replay))


def speculate(engine, seq_id: int, first: int, history: list[int], n_left: int, spec: Speculation,
              picker: RowPicker, take: Callable[[int], bool], counts: SpecCounts) -> int:
    """Generate after `first` (sampled, taken, not yet fed) by speculation until take(token) says
    stop or n_left more tokens are taken; `history`: the tokens so far (prompt and output, first
    included), extended here. Returns the final token sampled (the one the sequence does not
    hold: afterwards it holds exactly the tokens before it)."""
    opts = spec.options
    token, replay = first, []
    while n_left > 0:
        room = min(opts.draft_max, n_left - 1, step_room(engine, picker.top, len(replay)))
        if len(replay) > opts.draft_max:   # rewound again and again: catch up before drafting on
            room = 0
        drafts = spec.drafter.draft(history, room) if room > 0 else []
        drafts = [int(t) for t in drafts[:room]] if len(drafts) >= max(1, opts.draft_min) else []
        start = engine.sequence_length(seq_id)
        if drafts:
            engine.snapshot(seq_id)
        step = replay + [token] + drafts
        reads_states = getattr(spec.drafter, "reads_states", False)   # an MTP head: every step hands states over
        if len(step) == 1 and picker.greedy and not reads_states:   # a plain decode step: the GPU's argmax
            best = list(engine.greedy(token, seq_id, 1, pipeline=False))[0]
            rows = np.zeros((1, 1), np.float32), np.array([[best]], np.int64)
        elif len(step) == 1:
            rows = engine.decode_candidates([(seq_id, token)]) if picker.top else engine.eval([token], seq_id)[None]
        else:
            out = engine.verify(step, seq_id, top=picker.top)
            rows = (out[0][len(replay):], out[1][len(replay):]) if picker.top else out[len(replay):]
        counts.steps += 1
        counts.drafted += len(drafts)
        i, stop = 0, False
        while True:
            token = picker.pick(rows, i)
            history.append(token)
            n_left -= 1
            if take(token) or n_left <= 0:
                stop = True
                break
            if i < len(drafts) and token == drafts[i]:
                i += 1
                continue
            break
        counts.accepted += i
        keep = start + len(step) - len(drafts) + i   # replayed tokens, the fed one, the accepted drafts
        kept = engine.truncate(seq_id, keep)
        replay = step[kept - start:keep - start]
        if stop:
            if replay:   # the sequence holds every token before the final one
                engine.eval(replay, seq_id)
            return token
    return token


def check_draft_vocab(target, draft) -> None:
    """A draft model must share the target's vocabulary (same ids for the same tokens)."""
    tv, dv = target.tokenizer, draft.tokenizer
    if target.cfg.vocab_size != draft.cfg.vocab_size:
        raise VkrtError(f"the draft model's vocabulary has {draft.cfg.vocab_size} tokens, the model's "
                        f"{target.cfg.vocab_size}: speculative decoding needs the same vocabulary")
    probe = [i for i in np.linspace(0, min(len(tv.tokens), len(dv.tokens)) - 1, 64).astype(int)]
    if any(tv.tokens[i] != dv.tokens[i] for i in probe):
        raise VkrtError("the draft model's tokens differ from the model's (same vocabulary size, other "
                        "tokens): speculative decoding needs the same tokenizer")
