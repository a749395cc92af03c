"""DRY ("don't repeat yourself", llama.cpp's port of koboldcpp's sampler): a token that would
extend a sequence already seen in the context is penalised by multiplier * base^(length -
allowed_length); sequence breakers (by default newline, colon, quote, asterisk) cut how far back a
repetition may reach, and a single-token breaker is never penalised."""

from __future__ import annotations

import math

DEFAULT_BREAKERS = ("\n", ":", "\"", "*")
MAX_BREAKER_CHARS = 40     # llama.cpp's limits on a breaker's text and its tokenised tail
MAX_TAIL_TOKENS = 20
FLOAT_MAX_LOG = 88.7228391   # log of the largest float32: base^exponent is clamped below it


def breaker_sequences(tokenizer, breakers) -> tuple:
    """(head token, tail tokens) for every token whose text contains a breaker (empty tail), or
    ends with the start of one (the tail: the rest of the breaker, tokenised)."""
    cache = tokenizer.__dict__.setdefault("_dry_breakers", {})
    key = tuple(breakers)
    if key not in cache:
        cache[key] = _breaker_sequences(tokenizer, key)
    return cache[key]


def _breaker_sequences(tokenizer, breakers: tuple) -> tuple:
    texts = tokenizer.__dict__.get("_dry_texts")
    if texts is None:   # once per tokenizer: every token's text
        texts = tokenizer.__dict__["_dry_texts"] = [tokenizer.decode([t]) for t in range(len(tokenizer.tokens))]
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


def dry_penalties(context: list[int], multiplier: float, base: float, allowed_length: int,
                  breakers: tuple) -> dict[int, float]:
    """token -> the amount to subtract from its logit, for the tokens that would extend a
    repetition of at least allowed_length tokens ending the context."""
    n = len(context)
    if n <= allowed_length:
        return {}
    heads: dict[int, list[tuple]] = {}
    for head, tail in breakers:
        heads.setdefault(head, []).append(tail)
    # a breaker sequence i tokens from the end limits a repetition to the tokens after it
    rep_limit = n
    for i in range(n):
        tails = heads.get(context[n - 1 - i])
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
    # for each earlier position, how many tokens ending there equal the tokens ending the context;
    # the token after such a run would extend the repetition
    longest_after: dict[int, int] = {}
    for j in range(n - 1):
        m = 0
        while m <= j and context[j - m] == context[n - 1 - m]:
            m += 1
        m = min(m, rep_limit)
        if m >= allowed_length:
            nxt = context[j + 1]
            longest_after[nxt] = max(longest_after.get(nxt, 0), m)
    single = {head for head, tail in breakers if not tail}
    max_exp = int(FLOAT_MAX_LOG / math.log(base)) if base > 1.000001 else 0
    out = {}
    for tok, length in longest_after.items():
        if tok in single:
            continue
        exp = length - allowed_length
        if max_exp > 0:
            exp = min(exp, max_exp)
        out[tok] = multiplier * base ** exp
    return out
