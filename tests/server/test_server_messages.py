"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) with the official anthropic
client: over a scripted model (exact thinking / text / tool_use blocks, whole and streamed), and
through `vkrt serve` on a tiny random model, where only the tool grammar makes its output a call."""

from __future__ import annotations

import dataclasses
import json
import urllib.request

import anthropic
import pytest

from grammar_schemas import check
from models import TINY
from vkrt.model.synthetic import write_model

from .scripted import ScriptedServer
from .serverproc import API_KEY, serving
from .test_server_tools import ANSWER, CALL, QWEN3

# QWEN3 opening <think> in the generation prompt unless enable_thinking is false (Qwen3 thinking models)
THINKING_QWEN3 = QWEN3.replace("</think>\n\n{% endif %}{% endif %}", "</think>\n\n{% else %}<think>\n{% endif %}{% endif %}")
assert THINKING_QWEN3 != QWEN3
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"name": "get_weather", "description": "The weather in a city", "input_schema": WEATHER}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
OFF = {"type": "disabled"}
GREEDY = {"temperature": 0}   # this anthropic client takes no `temperature` argument


def blocks(message) -> list[tuple]:
    """The content blocks without the tool ids (fresh each reply)."""
    return [(b.type, getattr(b, "thinking", None), getattr(b, "text", None), getattr(b, "name", None),
             getattr(b, "input", None)) for b in message.content]


def post(url: str, path: str, body: dict, headers: dict | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(url + path, json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


# -- a scripted model: the blocks exactly ---------------------------------------------------------
@pytest.fixture(scope="module")
def scripted():
    server = ScriptedServer(QWEN3, lambda prompt: ANSWER if "<tool_response>" in prompt else CALL)
    yield server
    server.close()


@pytest.fixture(scope="module")
def sclient(scripted):
    return anthropic.Anthropic(base_url=scripted.url, api_key="none", max_retries=0, timeout=30)


def test_blocks_and_tool_round_trip(sclient, scripted):
    first = sclient.messages.create(model="m", max_tokens=200, messages=ASK, tools=TOOLS, system="Be brief.")
    assert first.id.startswith("msg_") and first.type == "message" and first.role == "assistant"
    assert first.model == "m" and first.stop_reason == "tool_use" and first.stop_sequence is None
    thinking, text, call = first.content
    assert (thinking.type, thinking.thinking, thinking.signature) == ("thinking", "I need the weather for Paris.", "")
    assert (text.type, text.text) == ("text", "Let me check.")
    assert call.type == "tool_use" and call.id.startswith("toolu_") and call.name == "get_weather"
    assert call.input == {"city": "Paris", "unit": "celsius"}
    prompt = scripted.scheduler.prompts[-1]
    assert prompt.startswith("<|im_start|>system\n# Tools") and '"name": "get_weather"' in prompt
    assert '"parameters": {"type": "object"' in prompt and "<|im_start|>system\nBe brief.<|im_end|>" in prompt
    usage = first.usage
    assert usage.input_tokens == len(prompt.encode()) and usage.cache_read_input_tokens == 0
    assert usage.cache_creation_input_tokens == 0 and usage.output_tokens > 0

    history = ASK + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                   "content": [{"type": "text", "text": "sunny, 21 C"}]}]}]
    final = sclient.messages.create(model="m", max_tokens=200, messages=history, tools=TOOLS)
    prompt = scripted.scheduler.prompts[-1]
    assert '"arguments": {"city": "Paris", "unit": "celsius"}' in prompt   # the tool_use input, as an object
    assert "<|im_start|>assistant\nLet me check.<tool_call>" in prompt
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in prompt
    assert final.stop_reason == "end_turn"
    assert blocks(final) == [("thinking", "The tool said sunny.", None, None, None),
                             ("text", None, "It is sunny in Paris, 21 °C.", None, None)]


def test_stream_reassembles_to_the_whole(sclient):
    whole = sclient.messages.create(model="m", max_tokens=200, messages=ASK, tools=TOOLS)
    with sclient.messages.stream(model="m", max_tokens=200, messages=ASK, tools=TOOLS) as stream:
        streamed = stream.get_final_message()
    assert blocks(streamed) == blocks(whole) and streamed.content[2].id.startswith("toolu_")
    assert (streamed.stop_reason, streamed.usage.input_tokens, streamed.usage.output_tokens) == (
        whole.stop_reason, whole.usage.input_tokens, whole.usage.output_tokens)


def test_stream_event_sequence(sclient):
    events = list(sclient.messages.create(model="m", max_tokens=200, messages=ASK, tools=TOOLS, stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    opened = [(e.index, e.content_block.type) for e in events if e.type == "content_block_start"]
    assert opened == [(0, "thinking"), (1, "text"), (2, "tool_use")]
    assert [e.index for e in events if e.type == "content_block_stop"] == [0, 1, 2]
    deltas = {e.delta.type for e in events if e.type == "content_block_delta"}
    assert deltas == {"thinking_delta", "text_delta", "input_json_delta"}
    args = "".join(e.delta.partial_json for e in events if e.type == "content_block_delta"
                   and e.delta.type == "input_json_delta")
    assert json.loads(args) == {"city": "Paris", "unit": "celsius"}
    assert events[-2].delta.stop_reason == "tool_use" and events[-2].usage.output_tokens > 0


def test_blocks_in_and_tool_error(sclient, scripted):
    messages = [{"role": "user", "content": [{"type": "text", "text": "Weather?"}, {"type": "text", "text": "Paris."}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "Call it.", "signature": "x"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
                                              "content": "timed out"}, {"type": "text", "text": "Try again?"}]}]
    out = sclient.messages.create(model="m", max_tokens=50, messages=messages, tools=TOOLS,
                                  system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}])
    prompt = scripted.scheduler.prompts[-1]
    assert "<|im_start|>system\nBe brief.\n\nBe kind.<|im_end|>" in prompt
    assert "<|im_start|>user\nWeather?\n\nParis.<|im_end|>" in prompt
    assert "<tool_response>\nError: timed out\n</tool_response><|im_end|>\n<|im_start|>user\nTry again?" in prompt
    assert "opaque" not in prompt and out.stop_reason == "end_turn"


def test_thinking_switches_the_template(sclient, scripted):
    sclient.messages.create(model="m", max_tokens=50, messages=ASK, thinking=OFF)
    assert scripted.scheduler.prompts[-1].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    sclient.messages.create(model="m", max_tokens=50, messages=ASK, thinking={"type": "enabled", "budget_tokens": 64})
    assert scripted.scheduler.prompts[-1].endswith("<|im_start|>assistant\n")


def test_count_tokens_is_the_prompt(sclient, scripted):
    kw = {"model": "m", "messages": ASK, "tools": TOOLS, "system": "Be brief."}
    n = sclient.messages.count_tokens(**kw).input_tokens
    out = sclient.messages.create(max_tokens=20, **kw)
    assert n == len(scripted.scheduler.prompts[-1].encode()) == out.usage.input_tokens
    assert sclient.messages.count_tokens(model="m", messages=ASK).input_tokens < n


@pytest.mark.parametrize("extra,param", [
    ({"max_tokens": None}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"mcp_servers": [{"type": "url", "url": "http://x"}]}, "mcp_servers"),
    ({"frequency_penalty": 1}, "frequency_penalty"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "messages[0].content[0].source.type"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}, "messages[0].content[0].type"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
    ({"messages": ASK + [{"role": "assistant", "content": "It is"}]}, "messages[1].role"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
    ({"tools": [{"name": "f"}]}, "tools[0].input_schema"),
    ({"tools": TOOLS, "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice.name"),
    ({"tool_choice": {"type": "any"}}, "tool_choice"),
    ({"thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "sometimes"}}, "thinking.type"),
    ({"stop_sequences": [1]}, "stop_sequences"),
    ({"temperature": -1}, "temperature"),
])
def test_bad_requests_in_anthropic_shape(scripted, extra, param):
    body = {"model": "m", "max_tokens": 10, "messages": ASK, **extra}
    status, out = post(scripted.url, "/v1/messages", {k: v for k, v in body.items() if v is not None})
    assert status == 400 and out["type"] == "error", out
    assert out["error"]["type"] == "invalid_request_error" and f"'{param}'" in out["error"]["message"], out


def test_sdk_sees_anthropic_errors(sclient, scripted):
    with pytest.raises(anthropic.BadRequestError) as err:
        sclient.messages.create(model="m", max_tokens=10, messages=ASK, extra_body={"container": "c"})
    assert err.value.body["error"]["type"] == "invalid_request_error" and "'container'" in str(err.value)
    status, out = post(scripted.url, "/v1/messages/nowhere", {})
    assert status == 404 and out["error"]["type"] == "not_found_error"
    status, out = post(scripted.url, "/v1/chat/completions", {"messages": "x"})   # other routes keep OpenAI's
    assert status == 400 and out["error"]["param"] == "messages" and "type" not in out


# -- vkrt serve on a tiny random model ------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("messages") / "tiny-qwen3-thinking.gguf")
    write_model(path, dataclasses.replace(TINY["tiny-qwen3"], chat_template=THINKING_QWEN3))
    yield from serving(path, "-c", "2048", "-np", "2", "-b", "512", "-ub", "512")


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key=API_KEY, max_retries=0, timeout=120)


def final(client, stream: bool, **kw):
    if not stream:
        return client.messages.create(**kw)
    with client.messages.stream(**kw) as s:
        return s.get_final_message()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_forced_tool_round_trip(client, stream):
    """Only the grammar makes the random model's text a call: its input must fit the schema (the
    grammar lets JSON have blanks, which this model likes: it takes some 300 tokens)."""
    kw = {"model": "tiny", "max_tokens": 600, "tools": TOOLS, "thinking": OFF, "extra_body": GREEDY}
    first = final(client, stream, messages=ASK, **kw, tool_choice={"type": "tool", "name": "get_weather",
                                                                   "disable_parallel_tool_use": True})
    assert first.stop_reason == "tool_use", first
    call = first.content[-1]
    assert call.type == "tool_use" and call.name == "get_weather" and call.id.startswith("toolu_")
    check(call.input, WEATHER)
    history = ASK + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                   "content": "sunny"}]}]
    answer = final(client, stream, messages=history, tool_choice={"type": "none"}, **{**kw, "max_tokens": 12})
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert [b.type for b in answer.content] == ["text"] and answer.content[0].text


def test_thinking_comes_as_a_thinking_block(client):
    """The template opens <think>: the random model's text is all thinking until the limit."""
    kw = {"model": "tiny", "max_tokens": 8, "messages": ASK, "extra_body": GREEDY,
          "thinking": {"type": "enabled", "budget_tokens": 1024}}
    whole = client.messages.create(**kw)
    assert whole.stop_reason == "max_tokens" and whole.usage.output_tokens == 8
    assert whole.content[0].type == "thinking" and whole.content[0].thinking.strip()
    assert all(b.type != "tool_use" for b in whole.content)
    streamed = final(client, True, **kw)
    assert blocks(streamed) == blocks(whole)
    # a budget of 4 tokens: the thinking is closed after them, and the answer follows
    capped = client.messages.create(**{**kw, "max_tokens": 24, "thinking": {"type": "enabled", "budget_tokens": 4}})
    assert [b.type for b in capped.content] == ["thinking", "text"] and capped.content[1].text
    assert capped.content[0].thinking in whole.content[0].thinking


def test_stop_sequence_and_max_tokens(client):
    kw = {"model": "tiny", "messages": ASK, "extra_body": GREEDY, "thinking": OFF}
    free = client.messages.create(max_tokens=12, **kw)
    assert free.stop_reason == "max_tokens" and free.usage.output_tokens == 12, free
    text = free.content[0].text
    stop = next(text[i:i + 2] for i in range(1, len(text) - 1) if text[i:i + 2].strip() and text.index(text[i:i + 2]))
    cut = client.messages.create(max_tokens=12, stop_sequences=["\x00never", stop], **kw)
    assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", stop)
    assert [b.text for b in cut.content] == [text[:text.index(stop)]]


def test_count_tokens_equals_usage(client):
    kw = {"model": "tiny", "messages": ASK, "tools": TOOLS, "system": "Be brief.", "thinking": OFF}
    n = client.messages.count_tokens(**kw).input_tokens
    for _ in range(2):   # the second time much of the prompt comes from the cache
        usage = client.messages.create(max_tokens=2, extra_body=GREEDY, **kw).usage
        assert usage.input_tokens + usage.cache_read_input_tokens == n
    assert usage.cache_read_input_tokens > 0


def test_api_key_headers(server, client):
    assert client.messages.count_tokens(model="tiny", messages=ASK).input_tokens > 0   # x-api-key
    bearer = anthropic.Anthropic(base_url=server.url, auth_token=API_KEY, max_retries=0, timeout=60)
    assert bearer.messages.count_tokens(model="tiny", messages=ASK).input_tokens > 0
    wrong = anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0, timeout=60)
    with pytest.raises(anthropic.AuthenticationError) as err:
        wrong.messages.create(model="tiny", max_tokens=2, messages=ASK)
    assert err.value.body == {"type": "error", "error": {"type": "authentication_error", "message": (
        "Invalid API Key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'")}}
