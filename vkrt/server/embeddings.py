"""/v1/embeddings (OpenAI) and /embedding (llama-server): requests parsed and tokenized, run as
an EmbeddingJob on the scheduler, answered in either shape. As llama-server: without
--embeddings both answer 501; /v1/embeddings refuses pooling none; pooled vectors are normalised
(embd_normalize, default 2: euclidean), unpooled rows (pooling none, /embedding) are not."""

from __future__ import annotations

import base64

import numpy as np

from ..engine.pooling import normalize
from .jobs import EmbeddingJob, Failed
from .request_work import in_thread
from .scheduler import SchedulerClosed
from .validation import ApiError, BadRequest, get_int, get_str, get_token_ids

MAX_INPUTS = 2048   # OpenAI's limit on inputs a request


def check_enabled(state, oai: bool) -> None:
    """llama-server's refusals before the body is read: not started with --embeddings (501),
    pooling none on the OpenAI endpoint (400); rank pooling (a reranker's head) vkrt lacks."""
    if not state.config.embeddings:
        raise ApiError("This server does not support embeddings. Start it with `--embeddings`", status=501,
                       type="not_supported_error")
    if state.pooling == "rank":
        raise ApiError("pooling 'rank' needs a reranker's classification head, which vkrt does not run: "
                       "start it with --pooling mean, cls or last", status=501, type="not_supported_error")
    if oai and state.pooling == "none":
        raise BadRequest("Pooling type 'none' is not OAI compatible. Please use a different pooling type "
                         "(--pooling mean, cls or last)")


async def embed(state, body: dict, oai: bool):
    """The response body for a request body on /v1/embeddings (oai) or /embedding."""
    if "input" in body:
        field = "input"
    elif "content" in body:   # llama-server's field: the answer takes /embedding's shape
        field, oai = "content", False
    else:
        raise BadRequest("'input' or 'content' must be provided", "input")
    fmt = get_str(body, "encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise BadRequest(f"'encoding_format' must be 'float' or 'base64', got {fmt!r}", "encoding_format")
    n_embd = state.model.cfg.n_embd
    dims = get_int(body, "dimensions", None, lo=1)
    if dims is not None and dims != n_embd:
        raise BadRequest(f"'dimensions' must be the model's embedding size {n_embd} (vkrt does not shorten "
                         f"embeddings), got {dims}", "dimensions")
    norm = get_int(body, "embd_normalize", 2, lo=-1)
    model = get_str(body, "model", None) or state.model_name
    prompts = await in_thread(_prompts, body[field], field, state.limits.vocab)
    inputs = await in_thread(lambda: [_tokens(state, p, f"{field}[{i}]" if len(prompts) > 1 else field)
                                              for i, p in enumerate(prompts)])
    vectors = await _run(state, EmbeddingJob(inputs, state.pooling))
    return await in_thread(_response, state, vectors, inputs, norm, oai, model, fmt)


def _response(state, vectors: list, inputs: list, norm: int, oai: bool, model: str, fmt: str):
    """The answer's body (megabytes for many inputs: built in a thread)."""
    if state.pooling != "none":
        vectors = [normalize(v[0], norm)[None] for v in vectors]
    if not oai:
        return [{"index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)]
    n = sum(len(t) for t in inputs)
    return {"object": "list", "model": model, "usage": {"prompt_tokens": n, "total_tokens": n},
            "data": [{"object": "embedding", "index": i, "embedding": _encode(v[0], fmt)}
                     for i, v in enumerate(vectors)]}


def _prompts(value, field: str, vocab: int) -> list:
    """A string, token ids, or an array of strings and token-id arrays -> a list of prompts (each
    a string or a list of token ids)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return [get_token_ids(value, field, vocab)]
    if not isinstance(value, list) or not value:
        raise BadRequest(f"'{field}' must be a string, an array of token ids, or a non-empty array of strings "
                         f"and token-id arrays", field)
    if len(value) > MAX_INPUTS:
        raise BadRequest(f"'{field}' holds {len(value)} inputs; at most {MAX_INPUTS} a request", field)
    out = []
    for i, v in enumerate(value):
        if isinstance(v, list):
            out.append(get_token_ids(v, f"{field}[{i}]", vocab))
        elif isinstance(v, str):
            out.append(v)
        else:
            raise BadRequest(f"'{field}[{i}]' must be a string or an array of token ids", f"{field}[{i}]")
    return out


def _tokens(state, prompt, where: str) -> list[int]:
    """A prompt's tokens (text with the model's BOS, as llama-server), checked against a slot."""
    limit = state.n_ctx_slot
    if isinstance(prompt, str):
        n_bytes = len(prompt.encode("utf-8"))
        if n_bytes > state.max_token_bytes * limit:
            raise BadRequest(f"'{where}' is {n_bytes} bytes; it cannot fit a slot of {limit} tokens: shorten it "
                             f"or raise -c", where)
        prompt = state.request_tokenizer.encode(prompt, add_special=True)
    if not prompt:
        raise BadRequest(f"'{where}' is empty: no tokens to embed", where)
    if len(prompt) > limit:
        raise BadRequest(f"'{where}' is {len(prompt)} tokens long; a slot holds {limit} tokens (-c over "
                         f"--parallel): shorten it or raise -c", where)
    return prompt


async def _run(state, job: EmbeddingJob) -> list[np.ndarray]:
    try:
        state.scheduler.submit(job)
    except SchedulerClosed as exc:
        raise ApiError(str(exc), status=503, type="unavailable_error") from None
    finished = False
    try:
        ev = await job.next_event()
        finished = True
    finally:
        if not finished:
            state.scheduler.cancel(job)
    if isinstance(ev, Failed):
        raise ApiError(ev.message, status=ev.status, type="server_error" if ev.status == 500 else "unavailable_error")
    return ev.vectors


def _encode(v: np.ndarray, fmt: str):
    if fmt == "base64":   # little-endian float32, as OpenAI and llama-server send it
        return base64.b64encode(np.asarray(v, "<f4").tobytes()).decode("ascii")
    return v.tolist()
