"""What sandbox workers run: the work a request's content can make unbounded in time, memory or
native stack (a model's chat template is code; grammars recurse in the compiler). Each task takes
and returns JSON values; a refusal comes back as {"error", "param"} and is a 400."""

from __future__ import annotations

from collections import OrderedDict

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


TASKS = {"render": render, "grammar": compile_source, "tool_grammar": tool_grammar}


def run(task, args: dict) -> dict:
    """{"ok": task(**args)}, or the refusal it raised as {"error": message, "param": field}."""
    try:
        return {"ok": task(**args)}
    except BadRequest as exc:
        return {"error": exc.message, "param": exc.param}
    except MemoryError:
        return {"error": "ran out of memory (the sandbox's limit)"}
    except RecursionError:
        return {"error": "recursed too deeply"}
    except Exception as exc:   # a bug or a refusal without a field: its message, without a traceback
        return {"error": f"failed: {type(exc).__name__}: {str(exc)[:200]}"}
