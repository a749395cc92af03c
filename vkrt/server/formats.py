"""Response bodies and stream chunks in the shapes OpenAI and llama-server clients expect:
chat.completion(.chunk), text_completion, and llama-server's /completion with `timings`.
A request's choices (OpenAI's `n`) are told apart by `index`; `result` takes the finished Choices."""

from __future__ import annotations

import time

from .chat_output import Message, MessageStream, OutputSpec, call_id, message_json, parse
from .jobs import Choice, Done


def usage(dones: list[Done]) -> dict:
    """One prompt, the choices' completions summed."""
    first, completion = dones[0], sum(d.completion_tokens for d in dones)
    return {"prompt_tokens": first.prompt_tokens, "completion_tokens": completion,
            "total_tokens": first.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": first.cached_tokens}}


def timings(done: Done) -> dict:
    """llama-server's `timings` object."""
    return timings_of(done.timings, done.cached_tokens)


def timings_of(t, cached: int) -> dict:
    """llama-server's `timings` object of a Timings and the prompt tokens found cached."""
    return {"cache_n": cached,
            "prompt_n": t.prompt_n, "prompt_ms": t.prompt_ms,
            "prompt_per_token_ms": t.prompt_ms / t.prompt_n if t.prompt_n else 0.0,
            "prompt_per_second": t.prompt_per_second,
            "predicted_n": t.predicted_n, "predicted_ms": t.predicted_ms,
            "predicted_per_token_ms": t.predicted_ms / t.predicted_n if t.predicted_n else 0.0,
            "predicted_per_second": t.predicted_per_second,
            **({"draft_n": t.draft_n, "draft_n_accepted": t.draft_n_accepted} if t.draft_n else {})}


def chat_logprobs(probs: list) -> dict | None:
    """OpenAI chat `logprobs`: {"content": [{token, logprob, bytes, top_logprobs}]}."""
    if not probs:
        return None
    entry = lambda t, text, raw, lp: {"token": text, "logprob": lp, "bytes": list(raw)}   # noqa: E731
    return {"content": [{**entry(p.id, p.text, p.bytes, p.logprob), "top_logprobs": [entry(*t) for t in p.top]}
                        for p in probs]}


def completion_logprobs(probs: list, offset: int = 0) -> dict | None:
    """OpenAI legacy completions `logprobs`: parallel lists, text offsets from `offset`."""
    if not probs:
        return None
    offsets = []
    for p in probs:
        offsets.append(offset)
        offset += len(p.text)
    return {"tokens": [p.text for p in probs], "token_logprobs": [p.logprob for p in probs],
            "top_logprobs": [{text: lp for _, text, _, lp in p.top} for p in probs], "text_offset": offsets}


def llama_probs(probs: list) -> list:
    """llama-server's `completion_probabilities`."""
    entry = lambda t, text, raw, lp: {"id": t, "token": text, "bytes": list(raw), "logprob": lp}   # noqa: E731
    return [{**entry(p.id, p.text, p.bytes, p.logprob), "top_logprobs": [entry(*t) for t in p.top]} for p in probs]


def chat_finish(done: Done, msg: Message) -> str:
    """llama-server's: a reply that ends with tool calls finishes with "tool_calls"."""
    return "tool_calls" if msg.calls and done.finish_reason == "stop" else done.finish_reason


class ChatFormat:
    """/v1/chat/completions: each choice's text read as `spec` says (reasoning, content, tool calls)."""

    done_line = True

    def __init__(self, job_id: int, model: str, spec: OutputSpec):
        self.id, self.model, self.created = f"chatcmpl-{job_id}", model, int(time.time())
        self.spec = spec
        self.streams: dict[int, MessageStream] = {}

    def _chunk(self, choices: list, **extra) -> dict:
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "system_fingerprint": "vkrt", "choices": choices, **extra}

    def _stream(self, index: int) -> MessageStream:
        return self.streams.setdefault(index, MessageStream(self.spec))

    def start(self, n: int = 1) -> list[dict]:
        return [self._chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None} for i in range(n)])]

    def piece(self, text: str, tokens: list[int], probs=(), index: int = 0) -> list[dict]:
        deltas = self._stream(index).push(text) if text else []
        if not deltas and probs:
            deltas = [{"content": ""}]
        return [self._chunk([{"index": index, "delta": d, "logprobs": chat_logprobs(probs) if k == 0 else None,
                              "finish_reason": None}]) for k, d in enumerate(deltas)]

    def end(self, done: Done, include_usage: bool, index: int = 0, dones=None) -> list[dict]:
        """The choice's last deltas and chunk; with include_usage (after the last choice) the usage of `dones`."""
        deltas, msg = self._stream(index).finish()
        out = [self._chunk([{"index": index, "delta": d, "logprobs": None, "finish_reason": None}]) for d in deltas]
        out.append(self._chunk([{"index": index, "delta": {}, "logprobs": None,
                                 "finish_reason": chat_finish(done, msg)}], timings=timings(done)))
        if include_usage:
            out.append(self._chunk([], usage=usage(dones or [done])))
        return out

    def result(self, choices: list[Choice]) -> dict:
        msgs = [parse(self.spec, c.text) for c in choices]
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "system_fingerprint": "vkrt",
                "choices": [{"index": i, "message": message_json(m, [call_id() for _ in m.calls]),
                             "logprobs": chat_logprobs(c.probs), "finish_reason": chat_finish(c.done, m)}
                            for i, (c, m) in enumerate(zip(choices, msgs))],
                "usage": usage([c.done for c in choices]), "timings": timings(choices[0].done)}


class CompletionFormat:
    """/v1/completions."""

    done_line = True

    def __init__(self, job_id: int, model: str):
        self.id, self.model, self.created = f"cmpl-{job_id}", model, int(time.time())
        self.offsets: dict[int, int] = {}   # a choice's text offset of its next streamed token

    def _obj(self, choices: list, **extra) -> dict:
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "system_fingerprint": "vkrt", "choices": choices, **extra}

    @staticmethod
    def _choice(index: int, text: str, finish_reason, logprobs=None) -> dict:
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}

    def start(self, n: int = 1) -> list[dict]:
        return []

    def piece(self, text: str, tokens: list[int], probs=(), index: int = 0) -> list[dict]:
        if not text and not probs:
            return []
        offset = self.offsets.get(index, 0)
        self.offsets[index] = offset + sum(len(p.text) for p in probs)
        return [self._obj([self._choice(index, text, None, completion_logprobs(probs, offset))])]

    def end(self, done: Done, include_usage: bool, index: int = 0, dones=None) -> list[dict]:
        out = [self._obj([self._choice(index, "", done.finish_reason)], timings=timings(done))]
        if include_usage:
            out.append(self._obj([], usage=usage(dones or [done]), timings=timings(done)))
        return out

    def result(self, choices: list[Choice]) -> dict:
        return self._obj([self._choice(i, c.text, c.done.finish_reason, completion_logprobs(c.probs))
                          for i, c in enumerate(choices)],
                         usage=usage([c.done for c in choices]), timings=timings(choices[0].done))


class LlamaFormat:
    """llama-server's /completion (`content`, `stop`, `timings`; no [DONE] line when streaming)."""

    done_line = False

    def __init__(self, job_id: int, model: str, prompt: str | list[int], settings: dict, return_tokens: bool):
        self.id, self.model, self.prompt, self.settings = job_id, model, prompt, settings
        self.return_tokens = return_tokens

    def start(self, n: int = 1) -> list[dict]:
        return []

    def piece(self, text: str, tokens: list[int], probs=(), index: int = 0) -> list[dict]:
        out = {"index": index, "content": text, "stop": False, "id_slot": -1}
        if self.return_tokens:
            out["tokens"] = tokens
        if probs:
            out["completion_probabilities"] = llama_probs(probs)
        return [out]

    def _final(self, text: str, tokens: list[int], done: Done, probs=()) -> dict:
        extra = {"completion_probabilities": llama_probs(probs)} if probs else {}
        return {**extra, "index": 0, "content": text, "tokens": tokens if self.return_tokens else [], "id_slot": done.slot,
                "stop": True, "model": self.model, "tokens_predicted": done.completion_tokens,
                "tokens_evaluated": done.prompt_tokens, "generation_settings": self.settings,
                "prompt": self.prompt, "has_new_line": "\n" in text, "truncated": done.truncated,
                "stop_type": done.stop_type, "stopping_word": done.stop_word, "tokens_cached": done.prompt_tokens
                + done.completion_tokens, "timings": timings(done)}

    def end(self, done: Done, include_usage: bool, index: int = 0, dones=None) -> list[dict]:
        return [self._final("", [], done)]

    def result(self, choices: list[Choice]) -> dict:
        c, = choices   # /completion has one choice
        return self._final(c.text, c.tokens, c.done, c.probs)
