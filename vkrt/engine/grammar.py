"""Constrained decoding with llguidance: a grammar (a JSON schema, GBNF or Lark) narrows each
step's tokens to those that keep the output inside it. The host fills a bitmask of the allowed
tokens (bit t % 32 of word t // 32) per step; the GPU sets the others to -inf before the argmax
or the top-k candidates (vkrt/ops/token_mask.py), so only the candidates come back, as without
a grammar. A row read back whole is masked on the host the same way (apply_mask_host)."""

from __future__ import annotations

import copy
import json
import threading
import time
import weakref

import numpy as np
from llguidance import LLMatcher, LLTokenizer

from ..model.tokenizer import TOKEN_USER_DEFINED
from ..ops.token_mask import apply_mask_host, mask_words
from .grammar_compile import brief, on_deep_stack
from .grammar_limits import GrammarError

_tokenizers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_tokenizers_lock = threading.Lock()


def grammar_tokenizer(tokenizer, vocab: int) -> LLTokenizer:
    """llguidance's view of our tokenizer (built once per tokenizer: about a second for 50k
    tokens): the same `tokenizers` JSON, the model's vocabulary size (tokens past the
    tokenizer's are never allowed) and its end-of-generation tokens as EOS."""
    key = (vocab, tuple(sorted(tokenizer.eog_ids)))
    with _tokenizers_lock:   # requests' threads ask at once: one builds it
        cached = _tokenizers.get(tokenizer)
        if cached is not None and cached[0] == key:
            return cached[1]
        llt = LLTokenizer(_text_user_tokens(tokenizer), n_vocab=vocab, eos_token=list(key[1]) or None)
        _tokenizers[tokenizer] = (key, llt)
        return llt


def _text_user_tokens(tokenizer) -> str:
    """The tokenizer's JSON with the user-defined tokens that are plain text (Gemma 3's newline
    and blank runs, its HTML tags) no longer special: llguidance takes a special token for no
    text, so a grammar's newline could not be that token. Control tokens, and user-defined ones
    written <...> (Qwen's <tool_call>, <think>), stay special, as in llguidance's llama.cpp binding."""
    data = json.loads(tokenizer.hf.to_str())
    types = tokenizer.token_types
    for t in data.get("added_tokens", ()):
        i, text = t["id"], t["content"]
        if t.get("special") and i < len(types) and types[i] == TOKEN_USER_DEFINED and not (
                text.startswith("<") and text.endswith(">")):
            t["special"] = False
    return json.dumps(data, ensure_ascii=False)


class Constraint:
    """One sequence's grammar state: the mask of the tokens allowed next, advanced token by token."""

    def __init__(self, tokenizer: LLTokenizer, grammar: str):
        self.matcher = on_deep_stack(lambda: LLMatcher(tokenizer, grammar, log_level=0))
        if self.matcher.is_error():
            raise GrammarError(brief(self.matcher.get_error()))
        self.eos = frozenset(tokenizer.eos_tokens)
        self._mask = np.zeros(mask_words(tokenizer.vocab_size), np.uint32)
        self._fresh = False
        self.mask_seconds = 0.0   # host time spent filling masks
        self.masks = 0

    def copy(self) -> "Constraint":
        """A constraint in this one's state with its own matcher (another choice of the request)."""
        twin = copy.copy(self)
        twin.matcher = self.matcher.deep_copy()
        twin._mask = np.zeros_like(self._mask)
        twin._fresh, twin.mask_seconds, twin.masks = False, 0.0, 0
        return twin

    def mask(self) -> np.ndarray:
        """The allowed next tokens as uint32 bitmask words (computed once per step)."""
        if not self._fresh:
            t0 = time.perf_counter()
            self.matcher.unsafe_compute_mask_ptr(self._mask.ctypes.data, self._mask.nbytes)
            self.mask_seconds += time.perf_counter() - t0
            self.masks += 1
            if self.matcher.is_error() or not self._mask.any():
                raise GrammarError(f"the grammar allows no next token: {brief(self.matcher.get_error() or 'dead end')}")
            self._fresh = True
        return self._mask

    def apply(self, logits: np.ndarray) -> np.ndarray:
        """A copy of a whole row with the disallowed tokens at -inf (the host's way)."""
        return apply_mask_host(logits, self.mask())

    def accept(self, token: int) -> None:
        """Advance past a sampled token (one the mask allowed)."""
        if not self.matcher.consume_token(int(token)):
            raise GrammarError(f"token {token} does not fit the grammar: {brief(self.matcher.get_error())}")
        self._fresh = False

    def ends(self, token: int) -> bool:
        """Whether `token` ends the output (an EOS the grammar allowed, or the grammar is done)."""
        return token in self.eos

    @property
    def accepting(self) -> bool:
        return self.matcher.is_accepting()
