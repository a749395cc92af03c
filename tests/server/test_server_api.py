"""The endpoints as clients see them: the official openai client, llama-server's /completion,
greedy output equal to `vkrt run`, tokenize/detokenize, models, metrics, prefix reuse."""

from __future__ import annotations

import json

import openai
import pytest
from click.testing import CliRunner

from vkrt.cli.main import cli

from .serverproc import API_KEY, metric, wait_idle

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)


def vkrt_run(model: str, prompt: str, n: int) -> dict:
    result = CliRunner().invoke(cli, ["run", "-m", model, "-p", prompt, "-n", str(n), "--temp", "0", "--json",
                                      "-c", "1024", "-b", "256", "-ub", "256"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output.strip().splitlines()[-1])


def test_openai_completion(client, server):
    out = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, temperature=0)
    assert out.object == "text_completion" and out.model == "tiny"
    choice = out.choices[0]
    assert choice.finish_reason in ("length", "stop") and isinstance(choice.text, str)
    assert out.usage.completion_tokens <= 8
    assert out.usage.prompt_tokens == len(server.post("/tokenize", {"content": PROMPT})[1]["tokens"])


def test_openai_streamed_chat(client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello, world!"}]
    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish in (["length"], ["stop"])
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and 1 <= usage.completion_tokens <= 12
    assert all(c.usage is None for c in chunks[:-1])
    whole = client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0)
    assert whole.choices[0].message.content == text
    assert whole.usage.completion_tokens == usage.completion_tokens
    assert whole.usage.prompt_tokens == usage.prompt_tokens


def test_timings_per_token(client):
    """llama-server's timings_per_token: every streamed token's chunk carries the timings so far."""
    stream = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=6,
                                            temperature=0, stream=True, extra_body={"timings_per_token": True,
                                                                                    "ignore_eos": True})
    chunks = [c for c in stream if c.choices]
    counts = [c.model_extra["timings"]["predicted_n"] for c in chunks if c.choices[0].delta.content]
    assert counts == sorted(counts) and counts[-1] == 6 and len(counts) >= 2, counts
    assert all(c.model_extra["timings"]["prompt_n"] > 0 for c in chunks if c.choices[0].delta.content)
    plain = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                                           stream=True)
    assert [c for c in plain if c.choices and c.choices[0].delta.content and "timings" in c.model_extra] == []


def test_greedy_equals_vkrt_run(server, tiny_gguf):
    ref = vkrt_run(tiny_gguf, PROMPT, 24)
    status, out = server.post("/completion", {"prompt": PROMPT, "n_predict": 24, "temperature": 0,
                                              "return_tokens": True, "cache_prompt": False})
    assert status == 200, out
    assert out["tokens"] == ref["tokens"] and out["content"] == ref["text"]
    assert out["stop_type"] == ("eos" if ref["stop_reason"] == "eos" else "limit")
    t = out["timings"]
    assert t["prompt_n"] == len(ref["prompt_tokens"]) and t["predicted_n"] == len(ref["tokens"])
    # streamed, the pieces add up to the same text
    status, raw = server.request("POST", "/completion", json.dumps(
        {"prompt": PROMPT, "n_predict": 24, "temperature": 0, "stream": True}).encode())
    events = [json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: ")]
    assert status == 200 and events[-1]["stop"] is True and "timings" in events[-1]
    assert "".join(e["content"] for e in events) == ref["text"]


def test_prefix_reuse(server):
    body = {"prompt": PROMPT + " jumps over the lazy dog", "n_predict": 4, "temperature": 0}
    wait_idle(server)
    first = server.post("/completion", body)[1]
    again = server.post("/completion", body)[1]
    assert again["content"] == first["content"]
    n_prompt = first["tokens_evaluated"]
    assert again["timings"]["cache_n"] == n_prompt - 1 and again["timings"]["prompt_n"] == 1
    fresh = server.post("/completion", {**body, "cache_prompt": False})[1]
    assert fresh["timings"]["cache_n"] == 0 and fresh["content"] == first["content"]


def test_stop_strings(server):
    base = server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 16, "temperature": 0})[1]
    text = base["choices"][0]["text"]
    assert len(text) >= 4, text
    stop = text[2:4]
    cut = server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 16, "temperature": 0, "stop": [stop]})[1]
    assert cut["choices"][0]["text"] == text[:text.index(stop)]
    assert cut["choices"][0]["finish_reason"] == "stop"


def test_seeded_sampling_repeats(server):
    body = {"prompt": PROMPT, "n_predict": 12, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
            "seed": 1234}
    a, b = server.post("/completion", body)[1], server.post("/completion", body)[1]
    assert a["content"] == b["content"]



def test_logit_bias_and_penalties_are_honoured(server):
    """A banned token (bias false, OpenAI's {"id": -100} alike) never comes; a frequency penalty
    changes a greedy answer that repeats tokens (the tiny model does)."""
    body = {"prompt": PROMPT, "n_predict": 16, "temperature": 0, "return_tokens": True, "cache_prompt": False}
    base = server.post("/completion", body)[1]["tokens"]
    banned = base[0]
    for bias in ([[banned, False]], {str(banned): -100}):
        status, out = server.post("/completion", {**body, "logit_bias": bias})
        assert status == 200, out
        assert banned not in out["tokens"] and out["tokens"] != base
    assert len(set(base)) < len(base), "the reference answer should repeat a token for this test"
    status, out = server.post("/completion", {**body, "frequency_penalty": 2.0, "repeat_last_n": 64})
    assert status == 200 and out["tokens"] != base
    status, out = server.post("/completion", {**body, "presence_penalty": 2.0})
    assert status == 200 and out["tokens"] != base


def test_logprobs_are_the_models(server, tiny_gguf, device):
    """n_probs / logprobs: the first token's log-probabilities are log_softmax of the logits vkrt's
    engine gives for the prompt; greedy picks the first of the top list; every API shape."""
    import numpy as np

    from vkrt.engine.engine import Engine
    from vkrt.model.loader import Model

    status, out = server.post("/completion", {"prompt": PROMPT, "n_predict": 3, "temperature": 0, "n_probs": 5,
                                              "cache_prompt": False, "return_tokens": True})
    assert status == 200, out
    probs = out["completion_probabilities"]
    assert [p["id"] for p in probs] == out["tokens"]
    ids = server.post("/tokenize", {"content": PROMPT, "add_special": True})[1]["tokens"]
    with Model(device, tiny_gguf, progress=False) as m, Engine(m, n_ctx=256, n_batch=256, n_ubatch=256) as e:
        row = e.eval(ids).astype(np.float64)
    ref = row - (row.max() + np.log(np.exp(row - row.max()).sum()))
    first = probs[0]
    best = np.argsort(-ref, kind="stable")[:5]
    assert [t["id"] for t in first["top_logprobs"]] == best.tolist()
    np.testing.assert_allclose([t["logprob"] for t in first["top_logprobs"]], ref[best], atol=1e-3)
    assert first["id"] == best[0] and abs(first["logprob"] - ref[best[0]]) < 1e-3
    for p in probs:
        assert p["top_logprobs"][0]["id"] == p["id"] and p["logprob"] <= 0


def test_openai_logprobs_shapes(client):
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                          temperature=0, logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert content and all(len(c.top_logprobs) == 2 and c.logprob <= 0 for c in content)
    assert "".join(c.token for c in content) == chat.choices[0].message.content
    streamed = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}],
                                              max_tokens=4, temperature=0, logprobs=True, top_logprobs=2, stream=True)
    tokens = [c.token for ch in streamed if ch.choices and ch.choices[0].logprobs
              for c in ch.choices[0].logprobs.content]
    assert tokens == [c.token for c in content]
    comp = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, temperature=0, logprobs=3)
    lp = comp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert "".join(lp.tokens) == comp.choices[0].text and lp.text_offset[0] == 0
    assert all(len(t) <= 3 for t in lp.top_logprobs)


@pytest.mark.parametrize("extra", [{"mirostat": 2, "mirostat_tau": 3.0}, {"mirostat": 1},
                                   {"xtc_probability": 1.0, "xtc_threshold": 0.05}, {"top_n_sigma": 1.0},
                                   {"dry_multiplier": 0.8, "dry_sequence_breakers": ["\n", "fox"]},
                                   {"samplers": ["top_k", "temperature"], "top_k": 3},
                                   {"samplers": "ktp", "top_p": 0.5}])
def test_more_samplers_generate(server, extra):
    """The samplers taken from llama-server's list run through the server (seeded: repeatable)."""
    body = {"prompt": PROMPT, "n_predict": 6, "temperature": 0.9, "seed": 5, "cache_prompt": False, **extra}
    a, b = server.post("/completion", body), server.post("/completion", body)
    assert a[0] == 200 and a[1]["tokens_predicted"] >= 1 and a[1]["content"] == b[1]["content"]


def test_samplers_run_only_the_named_ones(server):
    """`samplers` without top_k: top_k 1 no longer forces the best token, so seeded draws at a
    high temperature differ from greedy somewhere; with top_k in the chain they are greedy's."""
    greedy = server.post("/completion", {"prompt": PROMPT, "n_predict": 8, "temperature": 0, "cache_prompt": False})
    outs = {}
    for name, chain in (("with", ["top_k", "temperature"]), ("without", ["temperature"])):
        texts = []
        for seed in range(4):
            st, out = server.post("/completion", {"prompt": PROMPT, "n_predict": 8, "temperature": 5.0, "top_k": 1,
                                                  "seed": seed, "samplers": chain, "cache_prompt": False})
            assert st == 200, out
            texts.append(out["content"])
        outs[name] = texts
    assert set(outs["with"]) == {greedy[1]["content"]}
    assert any(t != greedy[1]["content"] for t in outs["without"])


def test_n_choices(client):
    """OpenAI's n: that many choices, indexed; a seeded request gives the same choices streamed
    or not; usage counts the prompt once and every choice's tokens."""
    kw = dict(model="tiny", max_tokens=5, temperature=1.0, seed=11, n=3)
    chat = client.chat.completions.create(messages=[{"role": "user", "content": "Hi"}], **kw)
    assert [c.index for c in chat.choices] == [0, 1, 2]
    texts = [c.message.content for c in chat.choices]
    streamed = {}
    for ch in client.chat.completions.create(messages=[{"role": "user", "content": "Hi"}], stream=True,
                                             stream_options={"include_usage": True}, **kw):
        for c in ch.choices:
            streamed[c.index] = streamed.get(c.index, "") + (c.delta.content or "")
        usage = ch.usage or None
    assert [streamed[i] for i in range(3)] == texts
    assert usage.prompt_tokens == chat.usage.prompt_tokens and usage.completion_tokens == chat.usage.completion_tokens
    comp = client.completions.create(prompt=PROMPT, **kw)
    assert [c.index for c in comp.choices] == [0, 1, 2]
    assert comp.usage.completion_tokens <= 15 and comp.usage.prompt_tokens < comp.usage.total_tokens

def test_tokenize_roundtrip(server):
    status, out = server.post("/tokenize", {"content": "Hello, world!", "with_pieces": True})
    assert status == 200
    ids = [t["id"] for t in out["tokens"]]
    assert "".join(t["piece"] for t in out["tokens"]) == "Hello, world!"
    assert server.post("/detokenize", {"tokens": ids})[1]["content"] == "Hello, world!"


def test_models_props_and_metrics(server, tiny_gguf):
    status, raw = server.get("/v1/models")
    data = json.loads(raw)["data"]
    assert status == 200 and data[0]["id"] == "tiny-qwen3.gguf" and data[0]["meta"]["n_vocab"] > 256
    props = json.loads(server.get("/props")[1])
    assert props["total_slots"] == 4 and props["default_generation_settings"]["n_ctx"] == 256
    assert "<|im_start|>" in props["chat_template"]
    before = metric(server, "vkrt_tokens_predicted_total")
    server.post("/completion", {"prompt": "Hello", "n_predict": 5, "temperature": 0, "ignore_eos": True})
    assert metric(server, "vkrt_tokens_predicted_total") == before + 5
    status, raw = server.get("/metrics")
    assert b"# TYPE vkrt_requests_processing gauge" in raw and b"vkrt_prompt_seconds_total" in raw
