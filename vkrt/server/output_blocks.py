"""A chat reply as a sequence of blocks (reasoning, text, one per tool call), the shape of
Anthropic's content blocks and OpenAI Responses' output items: whole from a parsed Message, or
streamed as block starts, deltas and stops from chat_output.MessageStream's deltas."""

from __future__ import annotations

import json
from dataclasses import dataclass

from .chat_output import Message, MessageStream, OutputSpec, call_id

REASONING, TEXT, CALL = "reasoning", "text", "call"
START, DELTA, STOP = "start", "delta", "stop"


@dataclass
class Block:
    kind: str            # REASONING | TEXT | CALL
    index: int           # its place among the reply's blocks
    text: str = ""       # the reasoning or text so far, or the call's arguments (JSON text)
    name: str = ""       # a call's function
    id: str = ""         # a call's id (call_...)


def blocks(msg: Message) -> list[Block]:
    """A whole reply's blocks: its reasoning, its text, then its calls (each only if there)."""
    out = [Block(REASONING, 0, msg.reasoning)] if msg.reasoning else []
    if msg.content:
        out.append(Block(TEXT, len(out), msg.content))
    for c in msg.calls:
        out.append(Block(CALL, len(out), c.arguments, c.name, call_id()))
    return out


def arguments_object(arguments: str) -> dict:
    """A call's JSON arguments as an object ({} for none); text that is no JSON object is kept
    under "arguments" (a call cut short by the token limit)."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"arguments": value}


class BlockStream:
    """A reply's text as it grows -> (START | DELTA | STOP, Block, delta text) events: one block
    open at a time, closed when the next kind of output starts or the reply ends."""

    def __init__(self, spec: OutputSpec):
        self.stream = MessageStream(spec)
        self.blocks: list[Block] = []
        self.calls: list[Block] = []   # by the calls' index
        self.open: Block | None = None

    def push(self, text: str) -> list[tuple]:
        return self._events(self.stream.push(text)) if text else []

    def finish(self) -> tuple[list[tuple], Message]:
        """The last events (the open block closed), and the whole message."""
        deltas, msg = self.stream.finish()
        events = self._events(deltas)
        if self.open is not None:
            events.append((STOP, self.open, ""))
            self.open = None
        return events, msg

    def _start(self, block: Block, out: list) -> None:
        if self.open is not None:
            out.append((STOP, self.open, ""))
        self.blocks.append(block)
        self.open = block
        out.append((START, block, ""))

    def _grow(self, block: Block, piece: str, out: list) -> None:
        if piece:
            block.text += piece
            out.append((DELTA, block, piece))

    def _events(self, deltas: list[dict]) -> list[tuple]:
        out: list[tuple] = []
        for d in deltas:
            if "tool_calls" in d:
                tc = d["tool_calls"][0]
                if "id" in tc:
                    self.calls.append(Block(CALL, len(self.blocks), "", tc["function"]["name"], tc["id"]))
                    self._start(self.calls[-1], out)
                self._grow(self.calls[tc["index"]], tc["function"].get("arguments") or "", out)
                continue
            kind, piece = (REASONING, d["reasoning_content"]) if "reasoning_content" in d else (TEXT, d["content"])
            if self.open is None or self.open.kind != kind:
                self._start(Block(kind, len(self.blocks)), out)
            self._grow(self.open, piece, out)
        return out
