"""Constrained output through the server: OpenAI's response_format (json_schema, json_object)
with the official client, llama-server's json_schema and GBNF grammar; a slot without a
grammar generates the same tokens beside one with a grammar."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from grammar_schemas import check, random_schema

from .serverproc import API_KEY, wait_idle

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
@pytest.mark.parametrize("seed", range(3))
def test_response_format_json_schema_fits(client, seed, temperature):
    schema = random_schema(100 + seed)
    out = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Describe a pet as JSON."}], max_tokens=200,
        temperature=temperature, seed=seed, response_format={"type": "json_schema", "json_schema": {
            "name": "pet", "schema": schema, "strict": True}})
    choice = out.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    check(json.loads(choice.message.content), schema)


def test_streamed_json_schema_fits(client):
    schema = random_schema(7)
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "JSON please"}], max_tokens=200, temperature=0.8,
        top_p=0.9, stream=True, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    check(json.loads(text), schema)


def test_llama_server_json_schema_and_grammar(server):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    status, out = server.post("/completion", {"prompt": PROMPT, "n_predict": 64, "json_schema": schema})
    assert status == 200, out
    assert isinstance(json.loads(out["content"])["ok"], bool)
    for temperature in (0.0, 1.5):
        status, out = server.post("/completion", {"prompt": PROMPT, "n_predict": 16, "temperature": temperature,
                                                  "grammar": 'root ::= "yes" | "no"', "ignore_eos": True})
        assert status == 200, out
        assert out["content"] in ("yes", "no") and out["stop_type"] == "eos"
    status, out = server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 64, "temperature": 0,
                                                  "json_schema": {"enum": ["alpha", "beta"]}})
    assert status == 200 and json.loads(out["choices"][0]["text"]) in ("alpha", "beta"), out


def test_a_slot_without_grammar_is_unaffected(server):
    wait_idle(server)
    plain = {"prompt": PROMPT, "n_predict": 24, "temperature": 0, "return_tokens": True, "ignore_eos": True,
             "cache_prompt": False}
    alone = server.post("/completion", plain)[1]["tokens"]
    constrained = {"prompt": "Once upon a time", "n_predict": 60, "temperature": 0.7, "cache_prompt": False,
                   "json_schema": random_schema(3)}
    with ThreadPoolExecutor(4) as pool:
        jobs = [pool.submit(server.post, "/completion", constrained) for _ in range(2)] + \
               [pool.submit(server.post, "/completion", plain)]
        results = [j.result() for j in jobs]
    assert all(status == 200 for status, _ in results), results
    assert results[-1][1]["tokens"] == alone


def test_grammars_past_the_limits_are_refused_and_the_server_lives_on(server):
    """A 4,000-rule chain (44 KB) overflowed the grammar compiler's stack and killed the server;
    such grammars and schemas are a 400 naming the field, in a line."""
    chain = "start: r0\n" + "".join(f"r{i}: r{i + 1}\n" for i in range(4000)) + 'r4000: "x"\n'
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(1000)} | {"d1000": {"type": "integer"}}
    refs = {"$ref": "#/$defs/d0", "$defs": defs}
    cases = [
        ("/completion", {"prompt": PROMPT, "n_predict": 4, "grammar": chain}, "grammar", "4002 rules"),
        ("/completion", {"prompt": PROMPT, "n_predict": 4, "json_schema": refs}, "json_schema", "$refs followed"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": refs}}},
         "response_format.json_schema.schema", "$refs followed"),
        ("/completion", {"prompt": PROMPT, "n_predict": 4, "json_schema": {"$ref": "#"}}, "json_schema", "loop"),
        ("/completion", {"prompt": PROMPT, "n_predict": 4, "json_schema": {"type": "array", "minItems": 10 ** 12}},
         "json_schema", "minItems"),
    ]
    for path, body, field, words in cases:
        status, out = server.post(path, body)
        error = out["error"]
        assert status == 400 and error["param"] == field and words in error["message"], (status, out)
        assert "\n" not in error["message"] and len(error["message"]) < 300, error["message"]
    status, out = server.post("/completion", {"prompt": PROMPT, "n_predict": 4, "grammar": 'root ::= "yes" | "no"'})
    assert status == 200 and out["content"] in ("yes", "no"), out
