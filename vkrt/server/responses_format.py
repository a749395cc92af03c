"""OpenAI Responses API replies: the response object with its output items (reasoning, message,
function_call) and its SSE events (response.created ... response.completed; each with its
`event:` name and a `sequence_number`)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable

from .chat_output import OutputSpec, parse
from .jobs import Choice, Done
from .output_blocks import (CALL, DELTA, REASONING, START, STOP, TEXT, Block, BlockStream, arguments_object,
                            blocks)

ITEM_PREFIX = {REASONING: "rs_", TEXT: "msg_", CALL: "fc_"}
CONTENT_PART = {REASONING: "reasoning_text", TEXT: "output_text"}


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(24)


def part_json(block: Block, text: str) -> dict:
    if block.kind == TEXT:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"type": "reasoning_text", "text": text}


def assistant_message(items: list[dict]) -> dict:
    """The output items as the chat message a later turn's history holds."""
    msg = {"role": "assistant", "content": ""}
    calls = []
    for item in items:
        if item["type"] == "reasoning" and item["content"]:
            msg["reasoning_content"] = item["content"][0]["text"]
        elif item["type"] == "message":
            msg["content"] += item["content"][0]["text"]
        elif item["type"] == "function_call":
            calls.append({"id": item["call_id"], "type": "function",
                          "function": {"name": item["name"], "arguments": arguments_object(item["arguments"])}})
    if calls:
        msg["tool_calls"] = calls
    return msg


class ResponsesFormat:
    """/v1/responses: one reply as output items. `keep(response, assistant message)` is called
    with the finished response (to store it; None: not stored); `count(text)` gives the tokens
    of a text (the reasoning's, for usage)."""

    done_line = False
    named_events = True   # each SSE event has an `event:` line naming its type

    def __init__(self, model: str, spec: OutputSpec, echo: dict, keep: Callable | None, count: Callable[[str], int]):
        self.id, self.model, self.created = new_id("resp_"), model, int(time.time())
        self.spec, self.echo, self.keep, self.count = spec, echo, keep, count
        self.blocks = BlockStream(spec)
        self.item_ids: dict[int, str] = {}
        self.items: dict[int, dict] = {}   # the finished output items by output index
        self.seq = 0

    def _event(self, kind: str, **fields) -> dict:
        self.seq += 1
        return {"type": kind, "sequence_number": self.seq - 1, **fields}

    def _response(self, status: str, output: list, done: Done | None = None, reasoning: str = "") -> dict:
        out = {"id": self.id, "object": "response", "created_at": self.created, "status": status, "background": False,
               "error": None, "incomplete_details": None, "model": self.model, "output": output, "usage": None,
               **self.echo}
        if done is not None:
            out["completed_at"] = int(time.time())
            if status == "incomplete":
                out["incomplete_details"] = {"reason": "max_output_tokens"}
            out["usage"] = self._usage(done, reasoning)
        return out

    def _usage(self, done: Done, reasoning: str) -> dict:
        thought = min(self.count(reasoning), done.completion_tokens) if reasoning else 0
        return {"input_tokens": done.prompt_tokens, "input_tokens_details": {"cached_tokens": done.cached_tokens},
                "output_tokens": done.completion_tokens, "output_tokens_details": {"reasoning_tokens": thought},
                "total_tokens": done.prompt_tokens + done.completion_tokens}

    def _item(self, block: Block, status: str, whole: bool = True) -> dict:
        """The block's output item, whole or as output_item.added opens it."""
        item_id = self.item_ids.setdefault(block.index, new_id(ITEM_PREFIX[block.kind]))
        if block.kind == REASONING:
            return {"type": "reasoning", "id": item_id, "summary": [], "status": status,
                    "content": [part_json(block, block.text)] if whole else []}
        if block.kind == TEXT:
            return {"type": "message", "id": item_id, "status": status, "role": "assistant",
                    "content": [part_json(block, block.text)] if whole else []}
        return {"type": "function_call", "id": item_id, "call_id": block.id, "name": block.name,
                "arguments": block.text if whole else "", "status": status}

    def start(self, n: int = 1) -> list[dict]:
        response = self._response("in_progress", [])
        return [self._event("response.created", response=response),
                self._event("response.in_progress", response=response)]

    def _events(self, events: list[tuple], last_status: str = "completed") -> list[dict]:
        out = []
        for k, (what, block, piece) in enumerate(events):
            at = {"output_index": block.index}
            if what == START:
                out.append(self._event("response.output_item.added", **at, item=self._item(block, "in_progress",
                                                                                           whole=False)))
                if block.kind != CALL:
                    out.append(self._event("response.content_part.added", item_id=self.item_ids[block.index], **at,
                                           content_index=0, part=part_json(block, "")))
            elif what == DELTA:
                item = {"item_id": self.item_ids[block.index], **at}
                if block.kind == CALL:
                    out.append(self._event("response.function_call_arguments.delta", **item, delta=piece))
                elif block.kind == TEXT:
                    out.append(self._event("response.output_text.delta", **item, content_index=0, delta=piece,
                                           logprobs=[]))
                else:
                    out.append(self._event("response.reasoning_text.delta", **item, content_index=0, delta=piece))
            else:
                out.extend(self._stop(block, last_status if k == len(events) - 1 else "completed"))
        return out

    def _stop(self, block: Block, status: str) -> list[dict]:
        item_id = self.item_ids[block.index]
        at = {"item_id": item_id, "output_index": block.index}
        if block.kind == CALL:
            out = [self._event("response.function_call_arguments.done", **at, name=block.name, arguments=block.text)]
        else:
            done = "response.output_text.done" if block.kind == TEXT else "response.reasoning_text.done"
            extra = {"logprobs": []} if block.kind == TEXT else {}
            out = [self._event(done, **at, content_index=0, text=block.text, **extra),
                   self._event("response.content_part.done", **at, content_index=0,
                               part=part_json(block, block.text))]
        self.items[block.index] = item = self._item(block, status)
        out.append(self._event("response.output_item.done", output_index=block.index, item=item))
        return out

    def piece(self, text: str, tokens: list[int], probs=(), index: int = 0) -> list[dict]:
        return self._events(self.blocks.push(text))

    def end(self, done: Done, include_usage: bool, index: int = 0, dones=None) -> list[dict]:
        status = "incomplete" if done.finish_reason == "length" else "completed"
        events, msg = self.blocks.finish()
        if not self.blocks.blocks:   # an empty reply is an empty message, as the whole response has it
            empty = Block(TEXT, 0)
            events = [(START, empty, ""), (STOP, empty, "")]
        out = self._events(events, status)
        output = [self.items[i] for i in sorted(self.items)]
        response = self._finish(status, output, done, msg.reasoning)
        return out + [self._event(f"response.{status}", response=response)]

    def error(self, status: int, message: str, type: str) -> dict:
        response = self._response("failed", [self.items[i] for i in sorted(self.items)])
        response["error"] = {"code": "server_error" if status >= 500 else "invalid_prompt", "message": message}
        return self._event("response.failed", response=response)

    def result(self, choices: list[Choice]) -> dict:
        c, = choices
        msg = parse(self.spec, c.text)
        status = "incomplete" if c.done.finish_reason == "length" else "completed"
        parts = blocks(msg) or [Block(TEXT, 0)]
        output = [self._item(b, status if k == len(parts) - 1 else "completed") for k, b in enumerate(parts)]
        return self._finish(status, output, c.done, msg.reasoning)

    def _finish(self, status: str, output: list[dict], done: Done, reasoning: str) -> dict:
        response = self._response(status, output, done, reasoning)
        if self.keep is not None:
            self.keep(response, assistant_message(output))
        return response
