"""A corpus of bad requests: each gets a 4xx with a JSON error naming what is wrong (never a
500 or a traceback), and the server keeps answering."""

from __future__ import annotations

import json

import pytest

from .serverproc import metric, serving

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
LLAMA = "/completion"
MSG = [{"role": "user", "content": "Hello"}]


def body(**kw) -> bytes:
    return json.dumps(kw).encode()


# (path, raw body, status, words the message must contain, the field named in `param`)
CORPUS = [
    (COMP, b'{"prompt": "x",', 400, "not valid JSON", None),
    (COMP, b"", 400, "not valid JSON", None),
    (COMP, b"[1, 2]", 400, "JSON object", None),
    (COMP, b'{"prompt": "x", "temperature": NaN}', 400, "NaN", None),
    (COMP, b"\xff\xfe{}", 400, "UTF-8", None),
    (COMP, body(max_tokens=4), 400, "'prompt' is required", "prompt"),
    (CHAT, body(max_tokens=4), 400, "'messages' is required", "messages"),
    (CHAT, body(messages="Hello"), 400, "array of message objects", "messages"),
    (CHAT, body(messages=[]), 400, "non-empty", "messages"),
    (CHAT, body(messages=[{"content": "x"}]), 400, "role", "messages[0].role"),
    (CHAT, body(messages=[{"role": "user", "content": 5}]), 400, "string", "messages[0].content"),
    (CHAT, body(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]), 400,
     "must be a base64 data URL", "messages[0].content[0].image_url.url"),
    (CHAT, body(messages=MSG, max_tokens="10"), 400, "integer", "max_tokens"),
    (CHAT, body(messages=MSG, max_tokens=True), 400, "integer", "max_tokens"),
    (CHAT, body(messages=MSG, max_tokens=-5), 400, "in [0, 256], got -5", "max_tokens"),
    (CHAT, body(messages=MSG, max_tokens=10 ** 12), 400, "a slot holds 256 tokens", "max_tokens"),
    (CHAT, body(messages=MSG, max_tokens=300), 400, "-c over --parallel", "max_tokens"),
    (CHAT, body(messages=MSG, max_completion_tokens=5000), 400, "raise -c", "max_completion_tokens"),
    (CHAT, body(messages=MSG, temperature="hot"), 400, "number", "temperature"),
    (CHAT, body(messages=MSG, top_p=2), 400, "[0.0, 1.0]", "top_p"),
    (CHAT, body(messages=MSG, top_k=1.5), 400, "integer", "top_k"),
    (CHAT, body(messages=MSG, seed="x"), 400, "integer", "seed"),
    (CHAT, body(messages=MSG, stream="yes"), 400, "true or false", "stream"),
    (CHAT, body(messages=MSG, stop=5), 400, "array of strings", "stop"),
    (CHAT, body(messages=MSG, stop=["x" * 600]), 400, "at most 512 characters", "stop"),
    (COMP, body(prompt=[1, "a"]), 400, "token ids", "prompt"),
    (CHAT, body(messages=MSG, stream=True, stream_options=[]), 400, "object", "stream_options"),
    (CHAT, body(messages=MSG, n=0), 400, "in [1, 16]", "n"),
    (LLAMA, body(prompt="x", n=2), 400, "one choice", "n"),
    (CHAT, body(messages=MSG, top_logprobs=3), 400, "needs 'logprobs': true", "top_logprobs"),
    (CHAT, body(messages=MSG, logprobs=True, top_logprobs=50), 400, "in [0, 20]", "top_logprobs"),
    (CHAT, body(messages=MSG, logprobs="yes"), 400, "true or false", "logprobs"),
    (COMP, body(prompt="x", logprobs=50), 400, "in [0, 20]", "logprobs"),
    (CHAT, body(messages=MSG, response_format={"type": "xml"}), 400, "'json_schema'", "response_format.type"),
    (CHAT, body(messages=MSG, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "objectx"}}}), 400, "objectx", "response_format.json_schema.schema"),
    (CHAT, body(messages=MSG, response_format={"type": "json_schema", "json_schema": 3}), 400, "'name'",
     "response_format.json_schema"),
    (COMP, body(prompt="x", json_schema={"type": "integer", "minimum": "a"}), 400, "refused", "json_schema"),
    (COMP, body(prompt="x", json_schema="{}"), 400, "schema object", "json_schema"),
    (LLAMA, body(prompt="x", grammar='root ::= "a" | nope'), 400, "nope", "grammar"),
    (LLAMA, body(prompt="x", grammar=["root"]), 400, "GBNF", "grammar"),
    (LLAMA, body(prompt="x", grammar='root ::= "a"', json_schema={}), 400, "not json_schema and grammar", "grammar"),
    (CHAT, body(messages=MSG, model=7), 400, "string", "model"),
    (CHAT, body(messages=MSG, mirostat=3), 400, "in [0, 2]", "mirostat"),
    (CHAT, body(messages=MSG, mirostat=2, mirostat_tau=-1), 400, ">= 0.0", "mirostat_tau"),
    (CHAT, body(messages=MSG, dry_multiplier=-0.8), 400, ">= 0.0", "dry_multiplier"),
    (CHAT, body(messages=MSG, dry_sequence_breakers=[1]), 400, "array of strings", "dry_sequence_breakers"),
    (CHAT, body(messages=MSG, dynatemp_range=-1), 400, ">= 0.0", "dynatemp_range"),
    (CHAT, body(messages=MSG, min_keep=-2), 400, ">= 0", "min_keep"),
    (CHAT, body(messages=MSG, xtc_probability=1.5), 400, "[0.0, 1.0]", "xtc_probability"),
    (CHAT, body(messages=MSG, top_n_sigma="wide"), 400, "number", "top_n_sigma"),
    (LLAMA, body(prompt="x", samplers=["infill"]), 400, "not supported", "samplers"),
    (LLAMA, body(prompt="x", samplers=["top_k", "dry"]), 400, "must come before", "samplers"),
    (CHAT, body(messages=MSG, samplers="kq"), 400, "unknown sampler letter", "samplers"),
    (LLAMA, body(prompt="x", n_probs=-1), 400, "in [0, 20]", "n_probs"),
    (CHAT, body(messages=MSG, presence_penalty=3), 400, "[-2.0, 2.0]", "presence_penalty"),
    (CHAT, body(messages=MSG, typical_p=1.5), 400, "[0.0, 1.0]", "typical_p"),
    (CHAT, body(messages=MSG, logit_bias={"abc": 1}), 400, "token ids", "logit_bias"),
    (CHAT, body(messages=MSG, logit_bias={"999999": -100}), 400, "outside the vocabulary", "logit_bias"),
    (CHAT, body(messages=MSG, logit_bias={"1": "x"}), 400, "[-100, 100]", "logit_bias"),
    (LLAMA, body(prompt="x", logit_bias=[[1, True]]), 400, "[-100, 100]", "logit_bias"),
    (CHAT, body(messages=MSG, logit_bias=[1, 2]), 400, "[token id, bias] pairs", "logit_bias"),
    (CHAT, body(messages=MSG + [{"role": "assistant", "content": "", "tool_calls": [{"id": "a", "type": "function",
                "function": {"name": "f", "arguments": "[" * 20000 + "]" * 20000}}]}, {"role": "user", "content": "x"}]),
     400, "nested too deeply", "messages[1].tool_calls[0].function.arguments"),   # json.loads' recursion
    (CHAT, body(messages=MSG, logit_bias={"²": 1}), 400, "token ids", "logit_bias"),        # a digit int() refuses
    (CHAT, body(messages=MSG, logit_bias={"9" * 5000: 1}), 400, "token ids", "logit_bias"),  # past int()'s digits
    (LLAMA, body(prompt="x", logit_bias=[[1, 10 ** 400]]), 400, "[-100, 100]", "logit_bias"),  # no float of it
    (CHAT, body(messages=MSG, chat_template_kwargs=[1]), 400, "object", "chat_template_kwargs"),
    (CHAT, body(messages=MSG, tools={"name": "f"}), 400, "array", "tools"),
    (COMP, body(prompt=[999999]), 400, "outside the vocabulary", "prompt"),
    (COMP, body(prompt=["a", "b"]), 400, "one prompt", "prompt"),
    (COMP, body(prompt={"text": "x"}), 400, "string or an array", "prompt"),
    (COMP, body(prompt=""), 400, "empty", "prompt"),
    (COMP, body(prompt="word " * 400), 400, "a slot holds 256 tokens", "prompt"),
    (CHAT, body(messages=[{"role": "user", "content": "word " * 400}]), 400, "shorten the prompt", "messages"),
    (LLAMA, body(prompt="x", n_predict=10 ** 9), 400, "a slot holds 256 tokens", "n_predict"),
    (LLAMA, body(prompt="x", n_predict=-2), 400, "[-1, 256]", "n_predict"),
    (LLAMA, body(prompt="x", cache_prompt="no"), 400, "true or false", "cache_prompt"),
    ("/tokenize", body(text="x"), 400, "'content' is required", "content"),
    ("/detokenize", body(tokens="abc"), 400, "array of token ids", "tokens"),
    ("/detokenize", body(tokens=[-1]), 400, "outside the vocabulary", "tokens"),
    (COMP, body(prompt="x" * 70_000), 413, "--body-limit", None),
    (CHAT, b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}', 400, "lone UTF-16 surrogate", "messages"),
    (COMP, b'{"prompt": "\\udfff"}', 400, "surrogate", "prompt"),
    ("/tokenize", b'{"content": "\\ud800"}', 400, "surrogate", "content"),
    (COMP, b'{"prompt": "x", "extra": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, "nested too deeply", None),
    ("/v1/nothing", body(prompt="x"), 404, "no endpoint", None),
    (COMP, body(prompt="x" * 60_000), 400, "bytes a token", "prompt"),
    (CHAT, body(messages=[{"role": "user", "content": "y" * 60_000}]), 400, "bytes a token", "messages"),
    # every field is honoured, taken at a value that asks for nothing more, or refused by name
    (CHAT, body(messages=MSG, junk="x"), 400, "'junk' is not a field of /v1/chat/completions", "junk"),
    (CHAT, body(messages=MSG, max_token=2), 400, "did you mean 'max_tokens'?", "max_token"),
    (CHAT, body(messages=MSG, **{"j" * 100: 1}), 400, "'" + "j" * 64 + "...' is not a field", "j" * 64 + "..."),
    (COMP, body(prompt="x", messages=MSG), 400, "'messages' is not a field of /v1/completions", "messages"),
    (LLAMA, body(prompt="x", tools=[]), 400, "'tools' is not a field of /completion", "tools"),
    ("/infill", body(input_prefix="a", input_suffix="b", junk=1), 400, "'junk' is not a field of /infill", "junk"),
    ("/apply-template", body(messages=MSG, junk=1), 400, "not a field", "junk"),
    (LLAMA, body(prompt="x", id_slot=4), 400, "'id_slot' must be in [-1, 3], got 4", "id_slot"),
    (LLAMA, body(prompt="x", t_max_predict_ms=100), 400, "no time limit", "t_max_predict_ms"),
    (CHAT, body(messages=MSG, store=True), 400, "keeps no chat completions", "store"),
    (CHAT, body(messages=MSG, post_sampling_probs=1), 400, "(it takes false)", "post_sampling_probs"),
    (CHAT, body(messages=MSG, timings_per_token=1), 400, "true or false", "timings_per_token"),
    (CHAT, body(messages=MSG, functions=[{"name": "f"}]), 400, "give 'tools'", "functions"),
    (CHAT, body(messages=MSG, user=5), 400, "'user' must be a string", "user"),
    (CHAT, body(messages=MSG, reasoning_effort="max"), 400, "'reasoning_effort' must be one of", "reasoning_effort"),
    (CHAT, body(messages=MSG, reasoning_effort=[]), 400, "'reasoning_effort' must be one of", "reasoning_effort"),
    # token ids past a slot are refused by their count, before they are read
    (LLAMA, body(prompt=[1] * 300), 400, "'prompt' holds 300 token ids; at most 255 fit a slot of 256", "prompt"),
    (COMP, body(prompt=[1] * 300 + ["x"]), 400, "holds 301 token ids", "prompt"),
]


@pytest.mark.parametrize("path,raw,status,words,param", CORPUS, ids=[f"{i}" for i in range(len(CORPUS))])
def test_bad_request(server, path, raw, status, words, param):
    got, out = server.request("POST", path, raw)
    assert got == status, out
    err = json.loads(out)["error"]
    assert words in err["message"] and err["code"] == status
    assert err.get("param") == param
    assert b"Traceback" not in out
    assert server.get("/health")[0] == 200


# bodies past body_parse.WORKER_BYTES are parsed in a sandbox worker: the same answers
LARGE = [
    (COMP, body(prompt=[1] * 200_000), 400, "'prompt' holds 200000 token ids; at most 255 fit", "prompt"),
    ("/detokenize", body(tokens=[1] * ((1 << 20) + 1)), 400, "/detokenize takes at most 1048576", "tokens"),
    (COMP, b'{"prompt": "' + b"x" * 300_000, 400, "not valid JSON", None),
    (CHAT, body(messages=[{"role": "user", "content": "x"}] * 70_000), 400, "more than 131072 JSON values", None),
    (LLAMA, body(prompt="x" * 400_000, n_predict=1), 400, "bytes a token", "prompt"),
]


@pytest.fixture(scope="module")
def roomy_server(tiny_gguf):
    """The session's server with bodies up to 8 MiB."""
    from .conftest import SERVER_ARGS
    yield from serving(tiny_gguf, *SERVER_ARGS[:-1], str(8 << 20))


@pytest.mark.parametrize("path,raw,status,words,param", LARGE, ids=[f"{i}" for i in range(len(LARGE))])
def test_large_bad_request(roomy_server, path, raw, status, words, param):
    test_bad_request(roomy_server, path, raw, status, words, param)


def test_large_bodies_are_served(roomy_server):
    ids = roomy_server.post("/tokenize", {"content": "hello world " * 30_000})[1]["tokens"]
    status, out = roomy_server.post("/detokenize", {"tokens": ids})
    assert status == 200 and out["content"] == "hello world " * 30_000
    assert roomy_server.post("/detokenize", {"tokens": ids[:3]})[1]["content"] == "hello world"


def test_wrong_method(server):
    status, out = server.get(COMP)
    assert status == 405 and "not allowed" in json.loads(out)["error"]["message"]


@pytest.mark.parametrize("key", ["wrong-key", ""])
def test_api_key(server, key):
    headers = {"Authorization": f"Bearer {key}"} if key else {"Authorization": ""}
    status, out = server.request("POST", COMP, body(prompt="x", max_tokens=1), headers=headers)
    assert status == 401 and json.loads(out)["error"]["type"] == "authentication_error"
    assert server.request("GET", "/v1/models", headers=headers)[0] == 401
    assert server.request("GET", "/metrics", headers=headers)[0] == 401
    assert server.request("GET", "/health", headers=headers)[0] == 200


def test_still_serving_after_the_corpus(server):
    bad = metric(server, "vkrt_bad_requests_total")
    assert bad >= len(CORPUS)
    status, out = server.post(COMP, {"prompt": "Hello", "max_tokens": 2})
    assert status == 200 and out["usage"]["completion_tokens"] <= 2
    assert metric(server, "vkrt_requests_failed_total") == 0


def test_odd_but_valid_fields_are_served(server):
    status, out = server.post(CHAT, {"messages": MSG, "max_tokens": 2, "top_k": -1, "seed": -1,
                                     "chat_template_kwargs": {"add_generation_prompt": False, "messages": 1},
                                     "stream_options": None, "unknown_field": None})
    assert status == 200, out
    assert out["usage"]["prompt_tokens"] == server.post(CHAT, {"messages": MSG, "max_tokens": 1})[1]["usage"][
        "prompt_tokens"]


def test_bookkeeping_and_no_op_fields_are_taken(server):
    """OpenAI's bookkeeping fields and llama-server's at the values that ask for nothing more."""
    taken = {"user": "u", "metadata": {"a": "b"}, "store": False, "service_tier": "auto", "safety_identifier": "s",
             "prompt_cache_key": "k", "id_slot": -1, "n_keep": 0, "n_discard": 0, "t_max_predict_ms": 0,
             "timings_per_token": False, "post_sampling_probs": False, "lora": [], "parse_tool_calls": True,
             "add_generation_prompt": True, "modalities": ["text"]}
    status, out = server.post(CHAT, {"messages": MSG, "max_tokens": 1, **taken})
    assert status == 200, out
    llama = {k: taken[k] for k in ("id_slot", "n_keep", "t_max_predict_ms", "timings_per_token", "lora")}
    status, out = server.post(LLAMA, {"prompt": "Hello", "n_predict": 1, **llama})
    assert status == 200, out


def test_llama_server_aliases_are_honoured(server):
    """n_predict on chat, n_probs on chat, logprobs on /completion, n_cmpl: as llama-server reads them."""
    status, out = server.post(CHAT, {"messages": MSG, "n_predict": 1, "ignore_eos": True, "n_probs": 2})
    assert status == 200 and out["usage"]["completion_tokens"] == 1, out
    assert len(out["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 2
    status, out = server.post(LLAMA, {"prompt": "Hello", "n_predict": 1, "logprobs": 3})
    assert status == 200 and len(out["completion_probabilities"][0]["top_logprobs"]) == 3, out
    status, out = server.post(COMP, {"prompt": "Hello", "max_completion_tokens": 1, "ignore_eos": True, "n_cmpl": 2})
    assert status == 200 and len(out["choices"]) == 2 and out["usage"]["completion_tokens"] == 2, out
    status, out = server.post(CHAT, {"messages": MSG, "max_tokens": 1, "reasoning_effort": "low"})
    assert status == 200, out


def test_id_slot_runs_the_request_on_that_slot(server):
    for slot in (3, 1, 3):
        status, out = server.post(LLAMA, {"prompt": "Hello there", "n_predict": 1, "id_slot": slot})
        assert status == 200 and out["id_slot"] == slot, out


def test_max_tokens_capped_by_the_slot(server):
    """max_tokens up to a slot's 256 cells is taken; where prompt + max_tokens pass the slot,
    generation stops when it is full and /completion says truncated."""
    status, out = server.post(LLAMA, {"prompt": "Hello", "n_predict": 256, "ignore_eos": True, "temperature": 0})
    assert status == 200
    n_prompt = out["tokens_evaluated"]
    assert out["tokens_predicted"] == 256 - n_prompt and out["stop_type"] == "limit" and out["truncated"] is True
    status, out = server.post(LLAMA, {"prompt": "Hello", "n_predict": 3, "ignore_eos": True, "temperature": 0})
    assert status == 200 and out["tokens_predicted"] == 3 and out["truncated"] is False


def test_tiny_temperature_samples(server):
    """A temperature of 1e-308 divides logits to infinities: still one token a step, no NaN."""
    status, out = server.post(COMP, {"prompt": "Hello", "max_tokens": 3, "temperature": 1e-308, "top_k": 0})
    assert status == 200 and out["usage"]["completion_tokens"] >= 1


def test_undecodable_api_key_header_is_401(server):
    status, out = server.request("POST", COMP, body(prompt="x", max_tokens=1),
                                 headers={"Authorization": "Bearer \xe9\xff-not-utf8"})
    assert status == 401


@pytest.mark.parametrize("host, status", [("evil.example", 403), ("evil.example:80", 403), ("localhost", 200),
                                          ("127.0.0.1:1", 200), ("[::1]:8080", 200)])
def test_host_allow_list_on_loopback(server, host, status):
    """Bound to 127.0.0.1, the server answers only to loopback Host names: a page on another
    name that DNS-rebinds to 127.0.0.1 gets a 403, not the model's answers."""
    got, out = server.request("POST", COMP, body(prompt="x", max_tokens=1), headers={"Host": host})
    assert got == status, out
    if status == 403:
        assert "--allowed-hosts" in json.loads(out)["error"]["message"]


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; b=x"])
def test_json_content_type_required(server, ctype):
    """A browser's simple cross-origin POST (no preflight) cannot drive the server."""
    got, out = server.request("POST", COMP, body(prompt="x", max_tokens=1), headers={"Content-Type": ctype})
    assert got == 415 and "application/json" in json.loads(out)["error"]["message"]
    got, _ = server.request("POST", COMP, body(prompt="x", max_tokens=1),
                            headers={"Content-Type": "application/json; charset=utf-8"})
    assert got == 200


@pytest.mark.parametrize("ctype", [None, ""])
def test_json_content_type_missing(server, ctype):
    """No Content-Type (urllib always adds one, so a raw request) is refused like a wrong one."""
    raw = body(prompt="x", max_tokens=1)
    head = f"POST {COMP} HTTP/1.1\r\nContent-Length: {len(raw)}" + ("" if ctype is None else f"\r\nContent-Type: {ctype}")
    status, out, _ = server.raw(head, raw)
    err = json.loads(out)["error"]
    assert status == 415 and err["code"] == 415 and "got no Content-Type header" in err["message"], out
    status, out, _ = server.raw(f"POST {COMP} HTTP/1.1\r\nContent-Length: {len(raw)}\r\n"
                                f"Content-Type: Application/JSON; charset=UTF-8", raw)
    assert status == 200, out


def test_huge_content_length_is_413_at_once(server):
    """A Content-Length past --body-limit is answered from the header, not after waiting for the body."""
    status, out, seconds = server.raw(f"POST {COMP} HTTP/1.1\r\nContent-Type: application/json\r\n"
                                      f"Content-Length: {10 ** 10}", b'{"prompt": "')
    err = json.loads(out)["error"]
    assert status == 413 and "--body-limit" in err["message"] and str(10 ** 10) in err["message"], out
    assert seconds < 1.0
    assert server.get("/health")[0] == 200


def test_chunked_body_past_the_limit_is_413_at_once(server):
    """A chunked body is refused once it passes --body-limit (64 KiB here), its end never sent."""
    chunk = b"x" * 70_000
    status, out, seconds = server.raw(f"POST {COMP} HTTP/1.1\r\nContent-Type: application/json\r\n"
                                      f"Transfer-Encoding: chunked", b"%x\r\n" % len(chunk) + chunk + b"\r\n")
    assert status == 413 and "--body-limit" in json.loads(out)["error"]["message"], out
    assert seconds < 1.0
