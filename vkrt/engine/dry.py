"""DRY ("don't repeat yourself", llama.cpp's port of koboldcpp's sampler): a token that would
extend a sequence already seen in the context is penalised by multiplier * base^(length -
allowed_length); sequence breakers (by default newline, colon, quote, asterisk) cut how far back a
repetition may reach, and a single-token breaker is never penalised."""

from __future__ import annotations

import functools
import math

import numpy as np

DEFAULT_BREAKERS = ("\n", ":", "\"", "*")
MAX_BREAKER_CHARS = 40     # llama.cpp's limits on a breaker's text and its tokenised tail
MAX_TAIL_TOKENS = 20
FLOAT_MAX_LOG = 88.7228391   # log of the largest float32: base^exponent is clamped below it


@functools.lru_cache(maxsize=16)
def breaker_sequences(tokenizer, breakers: tuple) -> tuple:
    """(head token, tail tokens) for every token whose text contains a breaker (empty tail), or
    ends with the start of one (the tail: the rest of the breaker, tokenised). A pass over the
    vocabulary, so kept for the last few (tokenizer, breakers)."""
    texts = _token_texts(tokenizer)
    out: set = set()
    for brk in breakers:
        brk = brk[:MAX_BREAKER_CHARS]
        if not brk:
            continue
        for tok, word in enumerate(texts):
            if brk in word:
                out.add((tok, ()))
                continue
            pos = word.find(brk[0])
            while pos >= 0:
                rest = word[pos:]
                if brk.startswith(rest):   # the token ends with the breaker's first len(rest) characters
                    tail = tokenizer.encode(brk[len(rest):], add_special=False)[:MAX_TAIL_TOKENS]
                    out.add((tok, tuple(tail)))
                pos = word.find(brk[0], pos + 1)
    return tuple(sorted(out))


@functools.lru_cache(maxsize=4)
def _token_texts(tokenizer) -> list[str]:
    return [tokenizer.decode([t]) for t in range(len(tokenizer.tokens))]


class DryBreakers:
    """breaker_sequences' pairs as the sampler looks them up every step: tails by head token, and
    the single-token breakers (never penalised)."""

    def __init__(self, sequences: tuple):
        self.tails: dict[int, list[tuple]] = {}
        for head, tail in sequences:
            self.tails.setdefault(head, []).append(tail)
        self.single = frozenset(head for head, tail in sequences if not tail)


def dry_penalties(context: list[int], multiplier: float, base: float, allowed_length: int,
                  breakers: DryBreakers) -> dict[int, float]:
    """token -> the amount to subtract from its logit, for the tokens that would extend a
    repetition of at least allowed_length tokens ending the context."""
    n = len(context)
    if n <= allowed_length:
        return {}
    # a breaker sequence i tokens from the end limits a repetition to the tokens after it
    rep_limit = n
    for i in range(n):
        tails = breakers.tails.get(context[n - 1 - i])
        if tails is None:
            continue
        # the tail follows the head: tail[k] is the token k + 1 after it
        longest = max((len(t) for t in tails
                       if len(t) <= i and all(t[k] == context[n - i + k] for k in range(len(t)))), default=-1)
        if longest >= 0:
            rep_limit = i - longest
            break
    if rep_limit < allowed_length:
        return {}
    # for each earlier position holding the context's last token, how many tokens ending there
    # equal the tokens ending the context; the token after such a run would extend the repetition
    longest_after: dict[int, int] = {}
    for j in np.flatnonzero(np.asarray(context[:-1]) == context[-1]).tolist():
        m = 1
        while m <= j and context[j - m] == context[n - 1 - m]:
            m += 1
        m = min(m, rep_limit)
        if m >= allowed_length:
            nxt = context[j + 1]
            longest_after[nxt] = max(longest_after.get(nxt, 0), m)
    max_exp = int(FLOAT_MAX_LOG / math.log(base)) if base > 1.000001 else None   # base^exp stays a float32
    out = {}
    for tok, length in longest_after.items():
        if tok in breakers.single:
            continue
        exp = length - allowed_length
        if max_exp is not None:
            exp = min(exp, max_exp)
        out[tok] = multiplier * base ** exp
    return out
