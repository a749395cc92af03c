"""Tool calls for templates of no known call format: llama-server's "generic" format
(common/chat.cpp). A system message asks for a JSON reply, and the reply is held to one by a
grammar (tool_grammar.py), always:

    {"tool_call": {"name": ..., "arguments": {...}}}                     one call
    {"tool_calls": [{"name": ..., "arguments": {...}, "id": ...}, ...]}  parallel_tool_calls
    {"response": "..."}                                                   an answer (not with tool_choice required)

Where the template does not show tools, earlier calls or tool results, the messages carry them
as minja's polyfills do: the tools and an example call in the system message, calls and results
as JSON text. parse() reads the reply back: calls (ids are the server's, not the model's), and
the response's text as content, streamed as the string's decoded characters as they come."""

from __future__ import annotations

import json
import re

from .tool_calls import HERMES_HEAD, JsonScanner, ToolCall, json_call

GENERIC = "generic"

RESPOND = ("Respond in JSON format, either with `tool_call` (a request to call tools) or with `response` reply to "
           "the user's request")
TOOLS_INTRO = "You can call any of the following tools to satisfy the user's requests: "
_EXAMPLE_CALL = {"name": "tool_name", "arguments": {"arg1": "some_value"}}


def _example(parallel: bool) -> str:
    shape = {"tool_calls": [{**_EXAMPLE_CALL, "id": "call_1___"}]} if parallel else {"tool_call": _EXAMPLE_CALL}
    return json.dumps(shape, indent=2)


def prompt_messages(messages: list[dict], tools: list, source: str, parallel: bool) -> list[dict]:
    """The messages the template renders for a generic-format reply."""
    note = RESPOND
    if "tools" not in source:   # the template does not show the tools: the system message does
        note += (f"\n\n{TOOLS_INTRO}{json.dumps(tools, indent=2, ensure_ascii=False)}\n\nExample tool call "
                 f"syntax:\n\n{_example(parallel)}\n\n")
    out = [_polyfilled(m, source) for m in messages]
    if out and out[0].get("role") == "system":
        out[0] = {**out[0], "content": f"{out[0].get('content') or ''}\n\n{note}"}
    elif "system" in source:
        out.insert(0, {"role": "system", "content": note})
    else:   # no system role: the note opens the first user message
        k = next((i for i, m in enumerate(out) if m.get("role") == "user"), None)
        if k is None:
            out.insert(0, {"role": "user", "content": note})
        else:
            out[k] = {**out[k], "content": f"{note}\n{out[k].get('content') or ''}"}
    return out


def _polyfilled(m: dict, source: str) -> dict:
    """An earlier call or a tool result as JSON text, where the template has no place for it."""
    if m.get("tool_calls") and "tool_calls" not in source:
        calls = [{"name": c["function"]["name"], "arguments": c["function"].get("arguments", {}),
                  **({"id": c["id"]} if isinstance(c.get("id"), str) else {})} for c in m["tool_calls"]]
        shape = {"tool_calls": calls, **({"content": m["content"]} if m.get("content") else {})}
        rest = {k: v for k, v in m.items() if k != "tool_calls"}
        return {**rest, "content": json.dumps(shape, indent=2, ensure_ascii=False)}
    if m.get("role") == "tool" and "'tool'" not in source and '"tool"' not in source:
        result = {**({"tool": m["name"]} if m.get("name") else {}), "content": m.get("content"),
                  **({"tool_call_id": m["tool_call_id"]} if m.get("tool_call_id") else {})}
        rest = {k: v for k, v in m.items() if k not in ("name", "tool_call_id")}
        return {**rest, "role": "user", "content": json.dumps({"tool_response": result}, indent=2, ensure_ascii=False)}
    return m


_KEY = re.compile(r'\s*\{\s*"(tool_calls|tool_call|response)"\s*:\s*')
_SHAPES = ('{"tool_calls":', '{"tool_call":', '{"response":')
_STRING_BODY = re.compile(r'(?:[^"\\]|\\.)*', re.S)
_ESCAPE_TAIL = re.compile(r'(\\+)(u[0-9a-fA-F]{0,4})?$')
_DECODER = json.JSONDecoder(strict=False)


def parse(text: str, partial: bool, tools: dict, scan: JsonScanner | None = None) -> tuple[str, list[ToolCall]]:
    """(content, calls) of a generic-format reply; a reply of another shape is content as it is."""
    scan = scan or JsonScanner()
    m = _KEY.match(text)
    if m is None:   # a reply cut short before its key says nothing yet
        compact = re.sub(r"\s+", "", text)
        return ("", []) if compact and any(s.startswith(compact) for s in _SHAPES) else (text, [])
    key, i = m.group(1), m.end()
    if key == "response":
        return _response(text, i, partial, scan), []
    if key == "tool_call":
        call, _, ok = json_call(text, i, HERMES_HEAD, scan)
        if not ok:
            return text, []
        return "", [call] if call is not None else []
    return "", _calls(text, i, scan)


def _calls(text: str, i: int, scan: JsonScanner) -> list[ToolCall]:
    """The calls of `"tool_calls": [...]` from text[i:] (the last as far as it is written)."""
    i = _blank(text, i)
    if not text.startswith("[", i):
        return []
    calls, i = [], i + 1
    while True:
        i = _blank(text, i)
        if i >= len(text) or text[i] == "]":
            return calls
        call, end, ok = json_call(text, i, HERMES_HEAD, scan)
        if ok and call is not None:
            calls.append(call)
        i = _blank(text, end)
        if not text.startswith(",", i):
            return calls
        i += 1


def _response(text: str, i: int, partial: bool, scan: JsonScanner) -> str:
    """The response's text: a string decoded (while partial, up to its last whole character), any
    other value as its JSON text."""
    if i >= len(text):
        return ""
    if text[i] != '"':
        end = scan.end(text, i)
        return text[i:end] if end is not None else text[i:].rstrip()
    body = _STRING_BODY.match(text, i + 1)
    closed = body.end() < len(text) and text[body.end()] == '"'
    raw = body.group()
    while not closed:   # hold back an escape cut short, or a high surrogate awaiting its pair
        tail = _ESCAPE_TAIL.search(raw)
        u = tail.group(2) or "" if tail and len(tail.group(1)) % 2 == 1 else None
        if u is None or len(u) == 5 and not (u[1] in "dD" and u[2] in "89abAB"):
            break
        raw = raw[:tail.end(1) - 1]
    try:
        return _DECODER.decode(f'"{raw}"')
    except ValueError:
        return raw


def _blank(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i
