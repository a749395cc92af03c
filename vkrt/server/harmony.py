"""gpt-oss's harmony output: messages of channels after the generation prompt `<|start|>assistant`:

    <|channel|>analysis<|message|>REASONING<|end|>
    <|start|>assistant<|channel|>final<|message|>ANSWER            (then <|return|>, end of generation)
    <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{ARGS}
                                                                    (then <|call|>, end of generation)

The recipient may also stand in the role part (`<|start|>assistant to=functions.NAME<|channel|>…`).
parse(text, partial) -> (reasoning, content, calls); partial holds back a tail that may be a tag."""

from __future__ import annotations

import re

from .tool_calls import ToolCall, held_prefix

START, CHANNEL, MESSAGE, END = "<|start|>", "<|channel|>", "<|message|>", "<|end|>"
ENDS = (END, "<|call|>", "<|return|>", START)
MARKERS = ("<|channel|>", "<|constrain|>", "<|message|>", "<|start|>", "<|end|>")   # kept in the text

_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")
_RECIPIENT = re.compile(r"to=functions\.([^\s<]+)")


def parse(text: str, partial: bool, raw_reasoning: bool = False) -> tuple[str, str, list[ToolCall]]:
    """raw_reasoning (--reasoning-format none): analysis stays in the content, tags and all."""
    reasoning, content, calls = [], [], []
    pos = 0
    if not text.lstrip().startswith((START, CHANNEL)) and not (partial and CHANNEL.startswith(text.lstrip())):
        return "", text, []   # no header: plain text
    while pos < len(text):
        if text.startswith(START, pos):
            pos += len(START)
        seg = pos + len("assistant") if text.startswith("assistant<", pos) else pos   # raw analysis from here
        head_end = text.find(MESSAGE, pos)
        if head_end < 0:
            if not partial and text[pos:].strip():
                content.append(text[pos:])
            break
        head = text[pos:head_end]
        body_start = head_end + len(MESSAGE)
        ends = [(k, e) for e in ENDS if (k := text.find(e, body_start)) >= 0]
        k, end = min(ends) if ends else (len(text), "")
        body = text[body_start:k]
        if not ends and partial:
            body = body[:len(body) - held_prefix(body, ENDS)]
        channel = _CHANNEL.search(head)
        recipient = _RECIPIENT.search(head)
        if recipient:
            calls.append(ToolCall(recipient.group(1), body.strip()))
        elif channel and channel.group(1) == "analysis":
            if raw_reasoning:
                content.append(text[seg:k] + (END if end == END else ""))
            else:
                reasoning.append(body)
        else:
            content.append(body)
        pos = k + (len(end) if end != START else 0)
    return "".join(reasoning).strip(), "".join(content), calls
