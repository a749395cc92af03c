"""Anthropic Messages API replies: the message object, its SSE events (message_start,
content_block_start / _delta / _stop, message_delta, message_stop; each with its `event:` name)
and the error shape {"type": "error", "error": {"type", "message"}}."""

from __future__ import annotations

import secrets
import string

from .chat_output import Message, OutputSpec, parse
from .jobs import Choice, Done
from .output_blocks import CALL, DELTA, REASONING, START, STOP, Block, BlockStream, arguments_object, blocks

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
               503: "overloaded_error", 529: "overloaded_error"}


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


def error_body(status: int, message: str) -> dict:
    """Anthropic's error object."""
    return {"type": "error", "error": {"type": error_type(status), "message": message}}


def new_id(prefix: str) -> str:
    return prefix + "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(24))


def stop_reason(done: Done, msg: Message) -> str:
    if msg.calls and done.finish_reason == "stop":
        return "tool_use"
    if done.finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if done.stop_type == "word" else "end_turn"


def usage(done: Done) -> dict:
    """Anthropic counts the prompt tokens read from the cache apart from input_tokens."""
    return {"input_tokens": done.prompt_tokens - done.cached_tokens, "output_tokens": done.completion_tokens,
            "cache_read_input_tokens": done.cached_tokens, "cache_creation_input_tokens": 0}


def block_json(block: Block, whole: bool = True) -> dict:
    """A content block, whole or as its content_block_start opens it (empty)."""
    if block.kind == REASONING:
        return {"type": "thinking", "thinking": block.text if whole else "", "signature": ""}
    if block.kind == CALL:
        return {"type": "tool_use", "id": "toolu_" + block.id.removeprefix("call_"), "name": block.name,
                "input": arguments_object(block.text) if whole else {}}
    return {"type": "text", "text": block.text if whole else ""}


def delta_json(block: Block, piece: str) -> dict:
    if block.kind == REASONING:
        return {"type": "thinking_delta", "thinking": piece}
    if block.kind == CALL:
        return {"type": "input_json_delta", "partial_json": piece}
    return {"type": "text_delta", "text": piece}


class MessagesFormat:
    """/v1/messages: one reply (Anthropic has no `n`) as content blocks."""

    done_line = False
    named_events = True   # each SSE event has an `event:` line naming its type

    def __init__(self, model: str, spec: OutputSpec, prompt_tokens: int):
        self.id, self.model, self.prompt_tokens = new_id("msg_"), model, prompt_tokens
        self.spec = spec
        self.blocks = BlockStream(spec)

    def _message(self, content: list, stop: str | None, stop_sequence: str | None, use: dict) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "content": content, "model": self.model,
                "stop_reason": stop, "stop_sequence": stop_sequence, "usage": use}

    def start(self, n: int = 1) -> list[dict]:
        use = {"input_tokens": self.prompt_tokens, "output_tokens": 0}
        return [{"type": "message_start", "message": self._message([], None, None, use)}]

    def _events(self, events: list[tuple]) -> list[dict]:
        out = []
        for what, block, piece in events:
            if what == START:
                out.append({"type": "content_block_start", "index": block.index,
                            "content_block": block_json(block, whole=False)})
            elif what == DELTA:
                out.append({"type": "content_block_delta", "index": block.index, "delta": delta_json(block, piece)})
            elif what == STOP:
                out.append({"type": "content_block_stop", "index": block.index})
        return out

    def piece(self, text: str, tokens: list[int], probs=(), index: int = 0) -> list[dict]:
        return self._events(self.blocks.push(text))

    def end(self, done: Done, include_usage: bool, index: int = 0, dones=None) -> list[dict]:
        events, msg = self.blocks.finish()
        reason = stop_reason(done, msg)
        return self._events(events) + [
            {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": _stop_sequence(reason, done)},
             "usage": usage(done)},
            {"type": "message_stop"}]

    def error(self, status: int, message: str, type: str) -> dict:
        return error_body(status, message)

    def result(self, choices: list[Choice]) -> dict:
        c, = choices
        msg = parse(self.spec, c.text)
        reason = stop_reason(c.done, msg)
        return self._message([block_json(b) for b in blocks(msg)], reason, _stop_sequence(reason, c.done),
                             usage(c.done))


def _stop_sequence(reason: str, done: Done) -> str | None:
    return done.stop_word if reason == "stop_sequence" else None
