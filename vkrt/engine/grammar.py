"""Constrained decoding with llguidance: a grammar (a JSON schema, GBNF or Lark) narrows each
step's tokens to those that keep the output inside it. The host fills a bitmask of the allowed
tokens (bit t % 32 of word t // 32) per step; the GPU sets the others to -inf before the argmax
or the top-k candidates (vkrt/ops/token_mask.py), so only the candidates come back, as without
a grammar. A row read back whole is masked on the host the same way (apply_mask_host)."""

from __future__ import annotations

import json
import threading
import time
import weakref
from concurrent.futures import Future

import llguidance
import numpy as np
from llguidance import LLMatcher, LLTokenizer

from ..model.tokenizer import TOKEN_USER_DEFINED
from ..ops.token_mask import apply_mask_host, mask_words
from .grammar_limits import GrammarError, check_grammar, check_schema

# whitespace JSON may hold between tokens: llama.cpp's json-schema-to-grammar allows at most a
# newline and 20 indenting blanks, so a model cannot spin in whitespace forever
JSON_WHITESPACE = r"[ \t\n]{0,20}"

# the compiler's native stack: 256 MiB took a chain of 30,000 $refs where the main thread's 8 MiB
# died at 2,500 (grammar_limits.py keeps requests far below either)
COMPILE_STACK_BYTES = 256 << 20
_stack_size_lock = threading.Lock()


def json_schema_grammar(schema) -> str:
    """The grammar of the JSON texts `schema` (a dict, or its JSON text) accepts."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except (ValueError, RecursionError) as exc:
            raise GrammarError(f"the JSON schema is not valid JSON: {exc}") from None
    if schema is True:
        schema = {}
    if schema is False:
        raise GrammarError("the schema false matches no JSON value")
    if not isinstance(schema, dict):
        raise GrammarError(f"a JSON schema must be an object, got {type(schema).__name__}")
    check_schema(schema)
    options = {"whitespace_pattern": JSON_WHITESPACE}
    return _compiled(lambda: LLMatcher.grammar_from_json_schema(schema, defaults=options))


def json_object_grammar() -> str:
    """Any JSON object (response_format json_object)."""
    return json_schema_grammar({"type": "object"})


def gbnf_grammar(text: str) -> str:
    """A llama.cpp GBNF grammar (root rule `root`), or Lark (llguidance reads either)."""
    check_grammar(text)
    return _compiled(lambda: llguidance.grammar_from("gbnf", text))


def lark_grammar(text: str) -> str:
    """A grammar in llguidance's Lark dialect (with `%json {...}` schemas and `<[id]>` tokens),
    written by vkrt (tool_grammar.py checks the schemas it embeds; check_grammar a client's text)."""
    return _compiled(lambda: LLMatcher.grammar_from_lark(text))


def _compiled(convert) -> str:
    """convert()'s grammar, validated (compiled) by llguidance on a deep stack; a refusal as a
    GrammarError with the library's message in brief."""
    def compile_():
        try:
            grammar = convert()
        except ValueError as exc:
            raise GrammarError(brief(str(exc))) from None
        error = LLMatcher.validate_grammar(grammar)
        if error:
            raise GrammarError(brief(error))
        return grammar
    return on_deep_stack(compile_)


def brief(message: str) -> str:
    """llguidance's message in one line of at most 200 characters, without the parser state or
    the source excerpt it may append."""
    lines = [line.strip() for line in message.split("<state>")[0].splitlines() if line.strip()]
    if not lines:
        return "refused"
    detail = next((line for line in lines[1:] if line.startswith("error:")), None)
    text = f"{lines[0].rstrip(':')}: {detail[len('error:'):].strip()}" if detail else lines[0]
    return text if len(text) <= 200 else text[:199] + "…"


def on_deep_stack(fn):
    """fn() on a thread of COMPILE_STACK_BYTES stack (the grammar compiler recurses natively and
    an overflow kills the process); its result, or its exception raised here."""
    done: Future = Future()

    def run():
        try:
            done.set_result(fn())
        except BaseException as exc:   # handed to the caller
            done.set_exception(exc)

    with _stack_size_lock:   # stack_size is process-wide: set it for this one thread only
        old = threading.stack_size(COMPILE_STACK_BYTES)
        try:
            threading.Thread(target=run, name="vkrt-grammar-compile", daemon=True).start()
        finally:
            threading.stack_size(old)
    return done.result()


_tokenizers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def grammar_tokenizer(tokenizer, vocab: int) -> LLTokenizer:
    """llguidance's view of our tokenizer (built once per tokenizer: about a second for 50k
    tokens): the same `tokenizers` JSON, the model's vocabulary size (tokens past the
    tokenizer's are never allowed) and its end-of-generation tokens as EOS."""
    key = (vocab, tuple(sorted(tokenizer.eog_ids)))
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
