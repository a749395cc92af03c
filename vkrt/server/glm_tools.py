"""GLM-4.5 / 4.6 tool calls (llama-server's GLM 4.5 format, chosen when the template holds
`[gMASK]<sop>`, `<arg_key>` and `<arg_value>`):

    <tool_call>NAME
    <arg_key>KEY</arg_key>
    <arg_value>VALUE</arg_value>
    </tool_call>

A value is JSON where it parses as JSON and its schema's type is not string, else the text as it
is. parse(text, partial, tools) -> (content, calls), as tool_calls.parse."""

from __future__ import annotations

import re

from .tool_calls import CALL_OPEN, JsonScanner, ToolCall, args_prefix, tagged, typed_value

GLM45 = "glm-4.5"

KEY_OPEN, KEY_CLOSE = "<arg_key>", "</arg_key>"
VALUE_OPEN, VALUE_CLOSE = "<arg_value>", "</arg_value>"
MARKERS = (CALL_OPEN, "</tool_call>", KEY_OPEN, KEY_CLOSE, VALUE_OPEN, VALUE_CLOSE)

_NAME_END = re.compile(r"\n|<arg_key>|</tool_call>")
_ARG = re.compile(r"\s*<arg_key>(.*?)</arg_key>\s*<arg_value>", re.S)


def detect(source: str) -> bool:
    return "[gMASK]<sop>" in source and KEY_OPEN in source and VALUE_OPEN in source


def _call(text: str, i: int, partial: bool, tools: dict) -> tuple[ToolCall | None, int, bool]:
    """The call after `<tool_call>` at text[i:]: (call, end, ok), as tool_calls.tagged's body."""
    m = _NAME_END.search(text, i)
    if m is None:   # the name is still being written
        name = text[i:].strip()
        if partial or not name:
            return None, len(text), True
        return ToolCall(name, "{}"), len(text), True
    name = text[i:m.start()].strip()
    if not name:
        return None, m.start(), False
    props = (tools.get(name) or {}).get("properties") or {}
    args: dict = {}
    pos = m.end() if m.group() == "\n" else m.start()
    while True:
        a = _ARG.match(text, pos)
        if a is None:
            break
        close = text.find(VALUE_CLOSE, a.end())
        if close < 0:
            return ToolCall(name, args_prefix(args, not partial)), len(text), True
        key = a.group(1).strip()
        args[key] = typed_value(text[a.end():close], props.get(key))
        pos = close + len(VALUE_CLOSE)
    rest = text[pos:]
    whole = not partial or rest.strip() != "" and not (KEY_OPEN.startswith(rest.lstrip()) or
                                                       rest.lstrip().startswith(KEY_OPEN))
    return ToolCall(name, args_prefix(args, whole)), pos if whole else len(text), True


def parse(text: str, partial: bool, tools: dict, scan: JsonScanner | None = None) -> tuple[str, list[ToolCall]]:
    return tagged(text, partial, lambda i: _call(text, i, partial, tools), (CALL_OPEN,))
