"""Tool calls in a model's text, in the formats the chat templates teach (chosen from the template
as llama-server's common/chat.cpp does):

- HERMES (Hermes 2 Pro, Qwen2.5, Qwen3): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
- QWEN_XML (Qwen3-Coder, Qwen3.5): `<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n
  </function>\\n</tool_call>`, values typed by the tool's JSON schema
- LLAMA3 (Llama 3.x): `{"name": ..., "parameters": {...}}` opening the message, or after `<|python_tag|>`

parse(text, partial) -> (content, calls). With partial (a stream's text so far) a call's name is
given once whole and its arguments as a prefix of what they will be, and text that may still
become a call is held back, so what is sent never has to be taken back."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

HERMES, QWEN_XML, LLAMA3 = "hermes", "qwen-xml", "llama3"

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
FUNCTION_OPEN, PYTHON_TAG = "<function=", "<|python_tag|>"


@dataclass
class ToolCall:
    name: str
    arguments: str   # JSON text (a prefix of it while the call is still being written)


def held_prefix(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a marker."""
    best = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:k]):
                best = k
                break
    return best


_SCALAR = re.compile(r"-?\d+(\.\d+)?([eE][-+]?\d+)?|true|false|null")
_STRUCTURE = re.compile(r'["{}\[\]]')
_IN_STRING = re.compile(r'["\\]')


class JsonScanner:
    """Finds where JSON values end in a text that only grows (a stream's), resuming each value's
    scan where the last call left it, so a long value costs O(its length) over the whole stream."""

    def __init__(self):
        self._saved: dict[int, tuple[str, tuple]] = {}   # start -> (text scanned, (pos, depth, in_str, esc))

    def end(self, s: str, i: int) -> int | None:
        """Where the JSON value starting at s[i] (after blanks) ends, or None if s ends first."""
        n = len(s)
        while i < n and s[i] in " \t\r\n":
            i += 1
        if i == n:
            return None
        if s[i] not in "{[\"":
            m = _SCALAR.match(s, i)
            return m.end() if m and m.end() < n else None   # a number may go on
        seen, state = self._saved.get(i, ("", (i, 0, False, False)))
        pos, depth, in_str, esc = state if s.startswith(seen) else (i, 0, False, False)
        while pos < n:
            if in_str:
                if esc:
                    pos, esc = pos + 1, False
                    continue
                m = _IN_STRING.search(s, pos)
                if m is None:
                    pos = n
                elif m.group() == "\\":
                    pos, esc = m.end(), True
                else:
                    pos, in_str = m.end(), False
                    if depth == 0:
                        return pos
            else:
                m = _STRUCTURE.search(s, pos)
                if m is None:
                    pos = n
                    break
                c, pos = m.group(), m.end()
                if c == '"':
                    in_str = True
                else:
                    depth += 1 if c in "{[" else -1
                    if depth == 0:
                        return pos
        self._saved[i] = (s, (min(pos, n), depth, in_str, esc))
        return None


def json_end(s: str, i: int) -> int | None:
    """Where the JSON value starting at s[i] (after blanks) ends, or None if s ends first."""
    return JsonScanner().end(s, i)


_STR = r'"([^"\\]*(?:\\.[^"\\]*)*)"'
HERMES_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*' + _STR + r'\s*,\s*"(?:arguments|parameters)"\s*:\s*')
_LLAMA_HEAD = re.compile(r'\s*\{\s*(?:"type"\s*:\s*"function"\s*,\s*)?"name"\s*:\s*' + _STR +
                         r'\s*,\s*"(?:parameters|arguments)"\s*:\s*')
_NAME_ONLY = re.compile(r'\s*\{\s*(?:"type"\s*:\s*"function"\s*,\s*)?"name"\s*:\s*' + _STR)


def json_call(text: str, i: int, head: re.Pattern, scan: JsonScanner) -> tuple[ToolCall | None, int, bool]:
    """The JSON object call at text[i:]: (call, end, ok). ok False: not a call (the text is content).
    An unfinished object gives the call as far as it is written (call None: no name yet)."""
    end = scan.end(text, i)
    m = head.match(text, i)
    if end is not None:
        try:
            obj = json.loads(text[i:end])
        except ValueError:
            return None, end, False
        args = obj.get("arguments", obj.get("parameters")) if isinstance(obj, dict) else None
        if not isinstance(obj.get("name") if isinstance(obj, dict) else None, str) or args is None:
            return None, end, False
        if m and m.end() <= end:
            raw = text[m.end():scan.end(text, m.end())]   # the arguments as the model wrote them
        else:
            raw = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        return ToolCall(obj["name"], raw), end, True
    if m:
        args_end = scan.end(text, m.end())
        return ToolCall(_unquote(m.group(1)), text[m.end():args_end]), len(text), True
    named = _NAME_ONLY.match(text, i)
    call = ToolCall(_unquote(named.group(1)), "") if named else None
    return call, len(text), True


def _unquote(s: str) -> str:
    try:
        return json.loads(f'"{s}"')
    except ValueError:
        return s


def _skip(text: str, i: int, literal: str) -> int:
    """i past blanks and `literal` if it comes next (or the text ends inside it)."""
    j = len(text) - len(text[i:].lstrip())
    if text.startswith(literal, j) or literal.startswith(text[j:]):
        return min(j + len(literal), len(text))
    return i


def _hermes(text: str, partial: bool, tools: dict, scan: JsonScanner) -> tuple[str, list[ToolCall]]:
    return tagged(text, partial, lambda i: json_call(text, i, HERMES_HEAD, scan), (CALL_OPEN,))


def tagged(text: str, partial: bool, body, markers: tuple[str, ...]) -> tuple[str, list[ToolCall]]:
    """Calls each opened by one of `markers` (the first is skipped; others begin the body) and
    closed by </tool_call>; body(i) -> (call, end, ok) reads one from i."""
    content, calls, pos = [], [], 0
    while True:
        found = [(k, m) for m in markers if (k := text.find(m, pos)) >= 0]
        if not found:
            rest = text[pos:]
            if partial:
                rest = rest[:len(rest) - held_prefix(rest, markers)]
            if not calls or rest.strip():
                content.append(rest)
            return "".join(content), calls
        k, marker = min(found)
        if not calls or text[pos:k].strip():
            content.append(text[pos:k])
        start = k + len(marker) if marker == markers[0] else k
        call, end, ok = body(start)
        if not ok:
            content.append(text[k:end])
            pos = end
            continue
        if call is not None:
            calls.append(call)
        if end >= len(text):
            return "".join(content), calls
        pos = _skip(text, end, CALL_CLOSE)


_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>")
_PARAM = re.compile(r"\s*<parameter=([^>\n]+)>")


def typed_value(value: str, schema) -> object:
    """A parameter's text as its schema's type says (text if it does not parse as that)."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind == "string" or (isinstance(kind, list) and "string" in kind and len(kind) == 1):
        return value
    try:
        out = json.loads(value)
    except ValueError:
        return value
    if kind in ("integer", "number") and (isinstance(out, bool) or not isinstance(out, (int, float))):
        return value
    return out


def args_prefix(args: dict, whole: bool) -> str:
    text = json.dumps(args, ensure_ascii=False)
    return text if whole else text[:-1]


def _xml_call(text: str, i: int, partial: bool, tools: dict) -> tuple[ToolCall | None, int, bool]:
    f = _FUNCTION.match(text, i)
    if f is None:
        rest = text[i:].lstrip()
        may = partial and (rest == "" or "<function=".startswith(rest) or rest.startswith("<function="))
        return None, len(text), may or not rest
    name = f.group(1).strip()
    props = (tools.get(name) or {}).get("properties") or {}
    args: dict = {}
    pos = f.end()
    while True:
        p = _PARAM.match(text, pos)
        if p is None:
            break
        close = text.find("</parameter>", p.end())
        if close < 0:
            return ToolCall(name, args_prefix(args, not partial)), len(text), True
        value = text[p.end():close]
        value = value[1:] if value.startswith("\n") else value
        value = value[:-1] if value.endswith("\n") else value
        key = p.group(1).strip()
        args[key] = typed_value(value, props.get(key))
        pos = close + len("</parameter>")
    tail = text[pos:].lstrip()
    if tail.startswith("</function>"):
        return ToolCall(name, args_prefix(args, True)), len(text) - len(tail) + len("</function>"), True
    return ToolCall(name, args_prefix(args, not partial)), len(text), True


def _qwen_xml(text: str, partial: bool, tools: dict, scan: JsonScanner) -> tuple[str, list[ToolCall]]:
    return tagged(text, partial, lambda i: _xml_call(text, i, partial, tools), (CALL_OPEN, FUNCTION_OPEN))


def _llama3(text: str, partial: bool, tools: dict, scan: JsonScanner) -> tuple[str, list[ToolCall]]:
    tag = text.find(PYTHON_TAG)
    start = tag + len(PYTHON_TAG) if tag >= 0 else len(text) - len(text.lstrip())
    if tag < 0 and not text.startswith("{", start):
        if partial:
            return text[:len(text) - held_prefix(text, (PYTHON_TAG,))], []
        return text, []
    content = text[:tag] if tag >= 0 else ""
    calls, pos = [], start
    while True:
        call, end, ok = json_call(text, pos, _LLAMA_HEAD, scan)
        if not ok:
            return text if not calls else content + text[pos:], calls
        if call is None:   # not yet known whether this object is a call
            return content if partial else content + text[pos:] if calls else text, calls
        calls.append(call)
        rest = text[end:].lstrip().lstrip(";").lstrip()
        if not rest.startswith("{"):
            return content + (rest if not partial or rest.strip() else ""), calls
        pos = len(text) - len(rest)


PARSERS = {HERMES: _hermes, QWEN_XML: _qwen_xml, LLAMA3: _llama3}
MARKERS = {HERMES: ("<tool_call>", "</tool_call>"), QWEN_XML: ("<tool_call>", "</tool_call>"),
           LLAMA3: ("<|python_tag|>",)}   # special tokens the text must keep (llama-server's preserved tokens)


def schemas(tools: list | None) -> dict:
    """Each offered function's parameter schema, by name."""
    out = {}
    for t in tools or ():
        f = t.get("function") if isinstance(t, dict) else None
        if isinstance(f, dict) and isinstance(f.get("name"), str):
            out[f["name"]] = f.get("parameters") if isinstance(f.get("parameters"), dict) else {}
    return out


def parse(fmt: str, text: str, partial: bool, tools: dict,
          scan: JsonScanner | None = None) -> tuple[str, list[ToolCall]]:
    """scan: a stream's scanner (its text only grows), to resume JSON scans where they stopped."""
    return PARSERS[fmt](text, partial, tools, scan or JsonScanner())
