"""Grammars for constrained decoding, from what requests give (a JSON schema, GBNF, Lark) to the
text llguidance compiles, checked against grammar_limits.py first and then validated by
llguidance on a deep stack. Kept apart from grammar.py (the per-sequence state, which needs the
GPU ops) so the server's sandbox worker can compile grammars without importing the runtime."""

from __future__ import annotations

import json
import threading
from concurrent.futures import Future

import llguidance
from llguidance import LLMatcher, LLTokenizer

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
    return _compiled(lambda: LLMatcher.grammar_from_json_schema(schema, defaults=options), starts=True)


def gbnf_grammar(text: str) -> str:
    """A llama.cpp GBNF grammar (root rule `root`), or Lark (llguidance reads either)."""
    check_grammar(text)
    return _compiled(lambda: llguidance.grammar_from("gbnf", text), starts=True)


def lark_grammar(text: str) -> str:
    """A grammar in llguidance's Lark dialect (with `%json {...}` schemas and `<[id]>` tokens),
    written by vkrt (tool_grammar.py checks the schemas it embeds; check_grammar a client's text)."""
    return _compiled(lambda: LLMatcher.grammar_from_lark(text))


def _compiled(convert, starts: bool = False) -> str:
    """convert()'s grammar, validated (compiled) by llguidance on a deep stack; a refusal as a
    GrammarError with the library's message in brief. With `starts`, also refused if no output
    can begin (check_starts)."""
    def compile_():
        try:
            grammar = convert()
        except ValueError as exc:
            raise GrammarError(brief(str(exc))) from None
        error = LLMatcher.validate_grammar(grammar)
        if error:
            raise GrammarError(brief(error))
        if starts:
            check_starts(grammar)
        return grammar
    return on_deep_stack(compile_)


_byte_tokenizer: LLTokenizer | None = None


def byte_tokenizer() -> LLTokenizer:
    """A tokenizer of the 256 bytes and an EOS (id 256): any output a grammar allows can start in it."""
    global _byte_tokenizer
    if _byte_tokenizer is None:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers
        alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
        vocab = {c: i for i, c in enumerate(alphabet)} | {"<eos>": len(alphabet)}
        tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens(["<eos>"])
        _byte_tokenizer = LLTokenizer(tok.to_str(), n_vocab=len(vocab), eos_token=[len(alphabet)])
    return _byte_tokenizer


def check_starts(grammar: str) -> None:
    """Raise GrammarError if the grammar allows neither a first byte nor an empty output (a rule
    that only refers to itself, `root ::= root`, or an empty character class): compiled, it
    would fail at the first token (a dead end). A grammar naming tokens the byte tokenizer
    lacks (<[id]>) is left to the model's tokenizer."""
    matcher = LLMatcher(byte_tokenizer(), grammar, log_level=0)
    if matcher.is_error():
        return
    matcher.compute_bitmask()
    if matcher.is_error():
        raise GrammarError("matches no output: no first character fits it (a rule that only refers to itself, "
                           "an empty character class?)")


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


GRAMMAR_KINDS = {"json_schema": json_schema_grammar, "gbnf": gbnf_grammar, "lark": lark_grammar}


def compile_grammar(kind: str, source) -> str:
    """The validated grammar of a source of `kind` (GRAMMAR_KINDS): what a sandbox worker runs."""
    return GRAMMAR_KINDS[kind](source)
