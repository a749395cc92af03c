"""A chat reply's text -> its message: reasoning, content and tool calls, parsed in the format the
chat template teaches (detected from the template's source as llama-server's common/chat.cpp
does), whole or as a stream of OpenAI deltas."""

from __future__ import annotations

import secrets
import string
from dataclasses import dataclass, field

from . import generic_tools, glm_tools, harmony, tool_calls
from .generic_tools import GENERIC
from .glm_tools import GLM45
from .reasoning import NONE, THINK_CLOSE, THINK_OPEN, split_think
from .tool_calls import HERMES, LLAMA3, QWEN_XML, JsonScanner, ToolCall

HARMONY = "harmony"
PARSERS = {**tool_calls.PARSERS, GENERIC: generic_tools.parse, GLM45: glm_tools.parse}
MARKERS = {**tool_calls.MARKERS, GLM45: glm_tools.MARKERS}   # special tokens the text must keep


@dataclass(frozen=True)
class TemplateSyntax:
    """What a chat template's model writes: its tool-call format (GENERIC where the template
    teaches none we know) and whether it thinks in <think> tags."""

    tools: str
    thinks: bool

    @classmethod
    def detect(cls, source: str) -> "TemplateSyntax":
        if "<|channel|>" in source:
            return cls(HARMONY, False)
        thinks = THINK_OPEN in source
        if glm_tools.detect(source):
            return cls(GLM45, thinks)
        if "<tool_call>" in source and "<function=" in source and "<parameter=" in source:
            return cls(QWEN_XML, thinks)
        if "<tool_call>" in source:
            return cls(HERMES, thinks)
        if "<|start_header_id|>ipython<|end_header_id|>" in source:
            return cls(LLAMA3, thinks)
        return cls(GENERIC, thinks)

    def kept_tokens(self) -> tuple[str, ...]:
        """Special tokens the reply's text must keep for the parser (llama-server's preserved tokens)."""
        if self.tools == HARMONY:
            return harmony.MARKERS
        return MARKERS.get(self.tools, ()) + ((THINK_OPEN, THINK_CLOSE) if self.thinks else ())


@dataclass(frozen=True)
class OutputSpec:
    """How one request's reply is read."""

    syntax: TemplateSyntax
    reasoning_format: str = NONE
    thinking_open: bool = False        # the prompt ends inside <think>
    parse_tools: bool = False          # tools offered and tool_choice not "none"
    parallel_tool_calls: bool = True
    tools: dict = field(default_factory=dict)   # function name -> parameters schema


@dataclass
class Message:
    reasoning: str = ""
    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)


def parse(spec: OutputSpec, text: str, partial: bool = False, scan: JsonScanner | None = None) -> Message:
    syntax = spec.syntax
    if syntax.tools == HARMONY:
        reasoning, content, calls = harmony.parse(text, partial, raw_reasoning=spec.reasoning_format == NONE)
        if not spec.parse_tools:
            calls = []
    else:
        reasoning, content = "", text
        if syntax.thinks and spec.reasoning_format != NONE:
            reasoning, content = split_think(text, spec.thinking_open, partial)
        calls = []
        if spec.parse_tools:
            content, calls = PARSERS[syntax.tools](content, partial, spec.tools, scan or JsonScanner())
    if not spec.parallel_tool_calls:
        calls = calls[:1]
    if partial or calls:   # blanks at the end are held back until more text follows (or dropped)
        content = content.rstrip()
    return Message(reasoning, content, calls)


def call_id() -> str:
    return "call_" + "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(24))


def message_json(msg: Message, ids: list[str]) -> dict:
    out = {"role": "assistant", "content": msg.content if msg.content or not msg.calls else None}
    if msg.reasoning:
        out["reasoning_content"] = msg.reasoning
    if msg.calls:
        out["tool_calls"] = [{"id": i, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                             for i, c in zip(ids, msg.calls)]
    return out


class MessageStream:
    """A choice's text as it grows -> the deltas not sent yet: reasoning_content and content
    pieces, and tool calls (index, id and name first, then `arguments` in pieces)."""

    def __init__(self, spec: OutputSpec):
        self.spec = spec
        self.text = ""
        self.sent = Message()
        self.ids: list[str] = []
        self.scan = JsonScanner()

    def push(self, piece: str) -> list[dict]:
        self.text += piece
        return self._deltas(parse(self.spec, self.text, partial=True, scan=self.scan))

    def finish(self) -> tuple[list[dict], Message]:
        """The last deltas, and the whole message."""
        msg = parse(self.spec, self.text, scan=self.scan)
        return self._deltas(msg), msg

    def _deltas(self, msg: Message) -> list[dict]:
        out = []
        for key, name in (("reasoning", "reasoning_content"), ("content", "content")):
            new, old = getattr(msg, key), getattr(self.sent, key)
            if len(new) > len(old) and new.startswith(old):
                out.append({name: new[len(old):]})
                setattr(self.sent, key, new)
        for i, call in enumerate(msg.calls):
            if i == len(self.sent.calls):
                self.ids.append(call_id())
                self.sent.calls.append(ToolCall(call.name, call.arguments))
                out.append({"tool_calls": [{"index": i, "id": self.ids[i], "type": "function",
                                            "function": {"name": call.name, "arguments": call.arguments}}]})
                continue
            old = self.sent.calls[i].arguments
            if len(call.arguments) > len(old) and call.arguments.startswith(old):
                out.append({"tool_calls": [{"index": i, "function": {"arguments": call.arguments[len(old):]}}]})
                self.sent.calls[i].arguments = call.arguments
        return out
