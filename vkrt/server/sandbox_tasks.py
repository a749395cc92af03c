"""What sandbox workers run: the work a request's content can make unbounded in time, memory or
native stack (a model's chat template is code; grammars recurse in the compiler). Each task takes
and returns JSON values (a task given bytes takes them as `attached`, and one answering with bytes
returns (value, bytes)); a refusal comes back as {"error", "param", "refused"} and is a 400, as is
a failure ({"error"}: out of memory, a bug)."""

from __future__ import annotations

from array import array
from collections import OrderedDict

from .body_parse import parse_packed
from .chat_template import ChatTemplate
from .grammar_source import compile_source
from .tool_grammar import tool_grammar
from .validation import BadRequest

_templates: OrderedDict = OrderedDict()   # (source, bos, eos) -> ChatTemplate, the few most recent


def render(source: str, bos: str, eos: str, messages: list, tools: list | None, extra: dict, max_bytes: int,
           too_long: str) -> str:
    key = (source, bos, eos)
    template = _templates.pop(key, None) or ChatTemplate(source, bos, eos)
    _templates[key] = template
    while len(_templates) > 4:
        _templates.popitem(last=False)
    return template.render(messages, add_generation_prompt=True, tools=tools, extra=extra, max_bytes=max_bytes,
                           too_long=too_long)


def parse_body(attached: bytes) -> tuple[dict, bytes]:
    return parse_packed(attached)


TASKS = {"render": render, "grammar": compile_source, "tool_grammar": tool_grammar, "parse_body": parse_body}


def run(task, args: dict) -> tuple[dict, bytes]:
    """({"ok": task(**args)}, bytes it answered with), or the refusal it raised as
    ({"error": message, "param": field, "refused": True}, b""), or its failure."""
    try:
        result = task(**args)
    except BadRequest as exc:
        return {"error": exc.message, "param": exc.param, "refused": True}, b""
    except MemoryError:
        return {"error": "ran out of memory (the sandbox's limit)"}, b""
    except RecursionError:
        return {"error": "recursed too deeply"}, b""
    except Exception as exc:   # a bug or a refusal without a field: its message, without a traceback
        return {"error": f"failed: {type(exc).__name__}: {str(exc)[:200]}"}, b""
    return ({"ok": result[0]}, result[1]) if isinstance(result, tuple) else ({"ok": result}, b"")


_tokenizers: OrderedDict = OrderedDict()   # key -> tokenizers.Tokenizer, the two most recent


def _tokenizer(key: str, setup: str | None):
    from tokenizers import Tokenizer
    tok = _tokenizers.pop(key, None) or Tokenizer.from_str(setup)
    _tokenizers[key] = tok
    while len(_tokenizers) > 2:
        _tokenizers.popitem(last=False)
    return tok


def tokenize(key: str, attached: bytes = b"", setup: str | None = None) -> tuple[None, bytes]:
    """The token ids (no special tokens added) of the UTF-8 text attached, as int32 bytes."""
    ids = _tokenizer(key, setup).encode(attached.decode("utf-8"), add_special_tokens=False).ids
    return None, array("i", ids).tobytes()


def detokenize(key: str, skip_special: bool, attached: bytes = b"", setup: str | None = None) -> str:
    """The text of the token ids attached as int32 bytes."""
    ids = array("i")
    ids.frombytes(attached)
    return _tokenizer(key, setup).decode(ids.tolist(), skip_special_tokens=skip_special)


TASKS.update(tokenize=tokenize, detokenize=detokenize)
