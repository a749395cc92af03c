"""Reasoning in `<think>…</think>` (Qwen3, Qwen3.5, DeepSeek-R1 style) split from the answer.

llama-server's --reasoning-format: `none` leaves the text as it is; `deepseek` puts the thinking
in `reasoning_content`; `auto` (its default) does as deepseek for these models. A template may
open `<think>` in the generation prompt itself (Qwen3.5, Qwen3 thinking models): the output then
starts inside the reasoning."""

from __future__ import annotations

from .tool_calls import held_prefix

NONE, DEEPSEEK, AUTO = "none", "deepseek", "auto"
REASONING_FORMATS = (NONE, DEEPSEEK, AUTO)

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def opens_thinking(prompt: str) -> bool:
    """Whether the rendered prompt leaves the model inside `<think>`."""
    return prompt.rstrip().endswith(THINK_OPEN)


def split_think(text: str, forced_open: bool, partial: bool) -> tuple[str, str]:
    """(reasoning, the rest). Blanks around the reasoning and before the rest are dropped; while
    partial, a tail that may be (the start of) a tag, or blanks, is held back."""
    body = text.lstrip()
    if not forced_open:
        if not body.startswith(THINK_OPEN):
            if partial and body and THINK_OPEN.startswith(body):
                return "", ""
            return "", text
        body = body[len(THINK_OPEN):]
    end = body.find(THINK_CLOSE)
    if end < 0:
        if partial:
            body = body[:len(body) - held_prefix(body, (THINK_CLOSE,))]
        return body.strip(), ""
    return body[:end].strip(), body[end + len(THINK_CLOSE):].lstrip()
