"""Chat templates (the GGUF's `tokenizer.chat_template`) rendered with Jinja2 in its sandbox,
with the helpers Hugging Face and llama.cpp templates call: raise_exception, strftime_now,
tojson with indent/separators, loop controls; trim_blocks and lstrip_blocks as transformers sets."""

from __future__ import annotations

import json
import logging
from datetime import datetime

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .validation import BadRequest

log = logging.getLogger("vkrt.server")

# used when the GGUF has no template (llama-server falls back to ChatML too)
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


class TemplateError(BadRequest):
    """The template raised (raise_exception) or failed on these messages."""


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


def _tojson(value, indent=None, separators=None, sort_keys=False, ensure_ascii=False):
    return json.dumps(value, indent=indent, separators=separators, sort_keys=sort_keys, ensure_ascii=ensure_ascii)


MAX_TEMPLATE_VALUE = 1 << 20   # items (characters, list entries) one `*` may make; digits of a `**` result


class _LimitedSandbox(ImmutableSandboxedEnvironment):
    """The sandbox, with `*` and `**` bounded: a model's template cannot make a gigabyte string
    or a number with a billion digits (the sandbox already bounds range())."""

    intercepted_binops = frozenset(["*", "**"])

    def call_binop(self, context, operator, left, right):
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_TEMPLATE_VALUE:
                    raise jinja2.exceptions.SecurityError(
                        f"the template repeats a value of {len(seq)} items {n} times (more than {MAX_TEMPLATE_VALUE})")
        elif isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0 and \
                right * max(abs(left).bit_length(), 1) > 4 * MAX_TEMPLATE_VALUE:
            raise jinja2.exceptions.SecurityError(f"the template raises {left} to the power {right}")
        return super().call_binop(context, operator, left, right)


class ChatTemplate:
    """render(messages, ...) -> the prompt text."""

    def __init__(self, source: str | None, bos_token: str = "", eos_token: str = ""):
        self.source = source or CHATML
        self.bos_token, self.eos_token = bos_token, eos_token
        env = _LimitedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        self.template = env.from_string(self.source)

    @classmethod
    def from_tokenizer(cls, metadata: dict, tokenizer) -> "ChatTemplate":
        def text(token_id):
            return tokenizer.tokens[token_id] if token_id is not None else ""

        source = metadata.get("tokenizer.chat_template")
        try:
            return cls(source, text(tokenizer.bos_id), text(tokenizer.eos_id))
        except jinja2.exceptions.TemplateSyntaxError as exc:
            log.warning("the model's chat template does not parse (%s, line %s); using ChatML", exc.message, exc.lineno)
            return cls(None, text(tokenizer.bos_id), text(tokenizer.eos_id))

    def render(self, messages: list[dict], *, add_generation_prompt: bool = True, tools: list | None = None,
               extra: dict | None = None, max_bytes: int | None = None, too_long: str = "") -> str:
        """`extra`: more template variables (a request's chat_template_kwargs, e.g. enable_thinking);
        output past `max_bytes` (UTF-8) stops the render with a TemplateError of `too_long`."""
        ctx = {"bos_token": self.bos_token, "eos_token": self.eos_token, "date_string": _strftime_now("%d %b %Y"),
               **(extra or {}), "messages": messages, "add_generation_prompt": add_generation_prompt}
        if tools is not None:
            ctx["tools"] = tools
        try:
            if max_bytes is None:
                return self.template.render(**ctx)
            pieces, size = [], 0
            for piece in self.template.generate(**ctx):
                size += len(piece.encode("utf-8", "surrogatepass"))
                if size > max_bytes:
                    raise TemplateError(too_long or f"the chat template's output passed {max_bytes} bytes", "messages")
                pieces.append(piece)
            return "".join(pieces)
        except TemplateError:
            raise
        except jinja2.exceptions.TemplateError as exc:
            raise TemplateError(f"the chat template rejected the messages: {exc}", "messages") from None
        except RecursionError:
            raise TemplateError("the chat template recursed too deeply on the messages", "messages") from None
        except MemoryError:
            raise TemplateError("the chat template ran out of memory on the messages", "messages") from None
        except Exception as exc:   # the model's template is code we do not control: any failure is its own
            raise TemplateError(f"the chat template failed on the messages: {type(exc).__name__}: {exc}",
                                "messages") from None


def encode_chat(tokenizer, text: str) -> list[int]:
    """The tokens of a rendered chat prompt: BOS added where the vocabulary asks for it, once even
    when the template wrote it itself."""
    ids = tokenizer.encode(text, add_special=True)
    if len(ids) >= 2 and ids[0] == ids[1] == tokenizer.bos_id and tokenizer.add_bos:
        ids = ids[1:]
    return ids
