"""A request's grammar as given (response_format, json_schema, grammar), and its compilation: the
part that runs in a sandbox worker (sandbox.py), where a grammar that takes the compiler too long,
too much memory or down takes only the worker with it."""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.grammar_compile import GRAMMAR_KINDS, GrammarError
from ..engine.grammar_limits import GrammarLimitError
from .validation import BadRequest

JSON_OBJECT = {"type": "object"}


@dataclass(frozen=True)
class GrammarSource:
    """kind: a GRAMMAR_KINDS key; source: the schema (a dict or bool) or grammar text; field: the
    request field it came from (errors name it)."""

    kind: str
    source: object
    field: str


def compile_source(kind: str, source, field: str) -> str:
    """The validated grammar; a refusal is a 400 naming `field` with the library's message in brief."""
    if kind == "json_schema" and not isinstance(source, (dict, bool)):
        raise BadRequest(f"'{field}' must be a JSON schema object", field)
    try:
        return GRAMMAR_KINDS[kind](source)
    except GrammarLimitError as exc:
        raise BadRequest(f"'{field}' {exc}", field) from None
    except GrammarError as exc:
        raise BadRequest(f"'{field}' was refused by the grammar library (llguidance): {exc}", field) from None
