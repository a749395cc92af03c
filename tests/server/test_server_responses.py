"""OpenAI's Responses API (/v1/responses) with the official openai client: over a scripted model
(exact reasoning / message / function_call items, whole and streamed, stored conversations), and
through `vkrt serve` on a tiny random model, where only the grammars make its output a call or JSON."""

from __future__ import annotations

import dataclasses
import json
import time
import urllib.error
import urllib.request

import openai
import pytest

from grammar_schemas import check
from models import TINY
from vkrt.model.synthetic import write_model
from vkrt.server.responses_store import ResponseStore

from .scripted import ScriptedServer
from .serverproc import API_KEY, serving
from .test_server_messages import THINKING_QWEN3, WEATHER
from .test_server_tools import ANSWER, CALL, QWEN3

TOOLS = [{"type": "function", "name": "get_weather", "description": "The weather in a city", "parameters": WEATHER,
          "strict": None}]
ASK = "What is the weather in Paris?"
MINIMAL = {"effort": "minimal"}   # thinking off


def items(response) -> list[tuple]:
    """The output items without their ids (fresh each reply)."""
    out = []
    for item in response.output:
        if item.type == "reasoning":
            out.append(("reasoning", [c.text for c in item.content], item.summary))
        elif item.type == "message":
            out.append(("message", item.role, [(c.type, c.text) for c in item.content]))
        else:
            out.append(("function_call", item.name, json.loads(item.arguments)))
    return out


# -- a scripted model: the items exactly ---------------------------------------------------------
@pytest.fixture(scope="module")
def scripted():
    server = ScriptedServer(QWEN3, lambda prompt: ANSWER if "<tool_response>" in prompt else CALL)
    yield server
    server.close()


@pytest.fixture(scope="module")
def sclient(scripted):
    return openai.OpenAI(base_url=scripted.url + "/v1", api_key="none", max_retries=0, timeout=30)


def test_items_and_tool_round_trip(sclient, scripted):
    first = sclient.responses.create(model="m", input=ASK, tools=TOOLS, instructions="Be brief.")
    assert first.id.startswith("resp_") and first.object == "response" and first.status == "completed"
    assert items(first) == [("reasoning", ["I need the weather for Paris."], []),
                            ("message", "assistant", [("output_text", "Let me check.")]),
                            ("function_call", "get_weather", {"city": "Paris", "unit": "celsius"})]
    reasoning, message, call = first.output
    assert reasoning.id.startswith("rs_") and message.id.startswith("msg_") and message.status == "completed"
    assert call.id.startswith("fc_") and call.call_id.startswith("call_") and call.status == "completed"
    assert first.output_text == "Let me check." and first.instructions == "Be brief."
    prompt = scripted.scheduler.prompts[-1]
    assert "<|im_start|>system\nBe brief.<|im_end|>" in prompt and '"name": "get_weather"' in prompt
    u = first.usage
    assert u.input_tokens == len(prompt.encode()) and u.input_tokens_details.cached_tokens == 0
    assert u.total_tokens == u.input_tokens + u.output_tokens
    assert 0 < u.output_tokens_details.reasoning_tokens < u.output_tokens

    # the history sent back whole: the output items, then the call's output
    history = [{"role": "user", "content": ASK}, *[i.model_dump(exclude_none=True) for i in first.output],
               {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}]
    final = sclient.responses.create(model="m", input=history, tools=TOOLS, store=False)
    prompt = scripted.scheduler.prompts[-1]
    assert "<|im_start|>assistant\nLet me check.<tool_call>" in prompt
    assert '"arguments": {"city": "Paris", "unit": "celsius"}' in prompt   # as an object
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in prompt and "Be brief." not in prompt
    assert items(final) == [("reasoning", ["The tool said sunny."], []),
                            ("message", "assistant", [("output_text", "It is sunny in Paris, 21 °C.")])]

    # the same through previous_response_id: the stored turn stands for the history
    again = sclient.responses.create(model="m", previous_response_id=first.id, tools=TOOLS, input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}])
    assert scripted.scheduler.prompts[-1] == prompt and items(again) == items(final)
    assert again.previous_response_id == first.id


def test_stream_reassembles_to_the_whole(sclient):
    whole = sclient.responses.create(model="m", input=ASK, tools=TOOLS)
    with sclient.responses.stream(model="m", input=ASK, tools=TOOLS) as stream:
        for _ in stream:
            pass
        streamed = stream.get_final_response()
    assert items(streamed) == items(whole) and streamed.status == "completed"
    assert streamed.usage.model_dump() == whole.usage.model_dump()


def test_stream_event_sequence(sclient):
    events = list(sclient.responses.create(model="m", input=ASK, tools=TOOLS, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    added = [(e.output_index, e.item.type) for e in events if e.type == "response.output_item.added"]
    assert added == [(0, "reasoning"), (1, "message"), (2, "function_call")]
    done = [(e.output_index, e.item.status) for e in events if e.type == "response.output_item.done"]
    assert done == [(0, "completed"), (1, "completed"), (2, "completed")]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert (text, thought) == ("Let me check.", "I need the weather for Paris.")
    assert json.loads(args) == {"city": "Paris", "unit": "celsius"}
    for kind, value in (("response.output_text.done", text), ("response.reasoning_text.done", thought)):
        assert [e.text for e in events if e.type == kind] == [value]
    assert [e.arguments for e in events if e.type == "response.function_call_arguments.done"] == [args]
    assert [e.part.type for e in events if e.type == "response.content_part.added"] == ["reasoning_text",
                                                                                         "output_text"]


def test_stored_responses(sclient, scripted):
    first = sclient.responses.create(model="m", input=[{"role": "developer", "content": "Rules."},
                                                       {"role": "user", "content": [{"type": "input_text",
                                                                                     "text": "Hello"}]}])
    assert "<|im_start|>system\nRules.<|im_end|>\n<|im_start|>user\nHello<|im_end|>" in scripted.scheduler.prompts[-1]
    got = sclient.responses.retrieve(first.id)
    assert got.id == first.id and items(got) == items(first)
    second = sclient.responses.create(model="m", input="And then?", previous_response_id=first.id)
    prompt = scripted.scheduler.prompts[-1]
    assert "user\nHello<|im_end|>\n<|im_start|>assistant\nLet me check." in prompt
    assert prompt.endswith("<|im_start|>user\nAnd then?<|im_end|>\n<|im_start|>assistant\n")
    assert sclient.responses.retrieve(second.id).previous_response_id == first.id
    sclient.responses.delete(first.id)
    for call in (lambda: sclient.responses.retrieve(first.id), lambda: sclient.responses.delete(first.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    with pytest.raises(openai.BadRequestError) as err:
        sclient.responses.create(model="m", input="Hi", previous_response_id=first.id)
    assert err.value.body["param"] == "previous_response_id" and first.id in err.value.body["message"]
    unkept = sclient.responses.create(model="m", input="Hi", store=False)
    with pytest.raises(openai.NotFoundError):
        sclient.responses.retrieve(unkept.id)


def test_store_is_bounded():
    now = [0.0]
    store = ResponseStore(max_count=2, max_age=10.0, clock=lambda: now[0])
    for i in range(3):
        store.put({"id": f"r{i}"}, [])
    assert store.get("r0") is None and store.get("r1") and store.get("r2")
    now[0] = 10.5
    store.put({"id": "r3"}, [])
    assert store.get("r1") is None and store.get("r2") is None and store.get("r3")


def test_effort_switches_the_template(sclient, scripted):
    sclient.responses.create(model="m", input=ASK, reasoning=MINIMAL)
    assert scripted.scheduler.prompts[-1].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    out = sclient.responses.create(model="m", input=ASK, reasoning={"effort": "high", "summary": "auto"})
    assert scripted.scheduler.prompts[-1].endswith("<|im_start|>assistant\n")
    assert out.reasoning.effort == "high" and out.output[0].type == "reasoning" and out.output[0].summary == []


@pytest.mark.parametrize("extra,param", [
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
    ({"tool_choice": {"type": "file_search"}}, "tool_choice"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
     "input[0].content[0].image_url"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input[0].content[0].type"),
    ({"input": [{"type": "web_search_call", "id": "w"}]}, "input[0].type"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{oops"}]}, "input[0].arguments"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    ({"input": []}, "input"),
    ({"background": True}, "background"),
    ({"truncation": "auto"}, "truncation"),
    ({"include": ["reasoning.encrypted_content"]}, "include"),
    ({"seed": 3}, "seed"),
    ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({"text": {"format": {"type": "json_object"}}, "tools": TOOLS, "tool_choice": "required"}, "text.format"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"previous_response_id": "resp_nope"}, "previous_response_id"),
])
def test_bad_requests_name_the_field(sclient, extra, param):
    body = {"input": ASK, **extra}
    with pytest.raises(openai.BadRequestError) as err:
        sclient.responses.create(model="m", input=body.pop("input"), extra_body=body)
    assert err.value.body["param"] == param, err.value.body
    assert f"'{param}'" in err.value.body["message"]


# -- vkrt serve on a tiny random model ------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("responses") / "tiny-qwen3-thinking.gguf")
    write_model(path, dataclasses.replace(TINY["tiny-qwen3"], chat_template=THINKING_QWEN3))
    yield from serving(path, "-c", "2048", "-np", "2", "-b", "512", "-ub", "512")


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


def final(client, stream: bool, **kw):
    if not stream:
        return client.responses.create(**kw)
    with client.responses.stream(**kw) as s:
        events = list(s)
        if events[-1].type == "response.incomplete":   # the helper's final response is a completed one
            return events[-1].response
        return s.get_final_response()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_forced_function_call_round_trip(client, stream):
    """Only the grammar makes the random model's text a call: its arguments must fit the schema
    (the grammar lets JSON have blanks, which this model likes: it takes some 300 tokens)."""
    kw = {"model": "tiny", "tools": TOOLS, "reasoning": MINIMAL, "temperature": 0}
    first = final(client, stream, input=ASK, max_output_tokens=600, parallel_tool_calls=False,
                  tool_choice={"type": "function", "name": "get_weather"}, **kw)
    assert first.status == "completed", first
    call, = first.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    check(json.loads(call.arguments), WEATHER)
    answer = final(client, stream, previous_response_id=first.id, max_output_tokens=12, tool_choice="none", input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}], **kw)
    assert answer.status in ("completed", "incomplete") and [i.type for i in answer.output] == ["message"]
    assert answer.output_text and answer.output[0].content[0].type == "output_text"


def test_json_schema_text_format(client):
    fmt = {"format": {"type": "json_schema", "name": "weather", "schema": WEATHER, "strict": True}}
    out = client.responses.create(model="tiny", input=ASK, text=fmt, reasoning=MINIMAL, temperature=0,
                                  max_output_tokens=600)
    assert out.status == "completed", out
    check(json.loads(out.output_text), WEATHER)
    assert out.text.format.type == "json_schema"


def test_max_output_tokens_is_incomplete(client):
    kw = {"model": "tiny", "input": ASK, "reasoning": MINIMAL, "temperature": 0, "max_output_tokens": 5}
    whole = client.responses.create(**kw)
    assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"
    assert whole.usage.output_tokens == 5 and whole.output[0].status == "incomplete" and whole.output_text
    events = list(client.responses.create(stream=True, **kw))
    assert events[-1].type == "response.incomplete" and events[-1].response.status == "incomplete"
    assert events[-1].response.output[0].content[0].text == whole.output_text


def test_reasoning_comes_as_a_reasoning_item(client):
    """The template opens <think>: the random model's text is all reasoning until the limit."""
    kw = {"model": "tiny", "input": ASK, "reasoning": {"effort": "high"}, "temperature": 0, "max_output_tokens": 8}
    whole = client.responses.create(**kw)
    assert whole.status == "incomplete" and whole.output[0].type == "reasoning"
    assert [i.type for i in whole.output] == ["reasoning"] and whole.output[0].content[0].text.strip()
    assert 0 < whole.usage.output_tokens_details.reasoning_tokens <= 8
    streamed = client.responses.create(stream=True, **kw)
    last = list(streamed)[-1].response
    assert [i.type for i in last.output] == [i.type for i in whole.output]
    assert last.output[0].content[0].text == whole.output[0].content[0].text


# -- GET /v1/responses/{id}/input_items --------------------------------------------------------------
FIVE = [{"role": "developer", "content": "Rules."},
        {"role": "user", "content": [{"type": "input_text", "text": "Hello"}]},
        {"type": "function_call", "id": "fc_given", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"role": "user", "content": "And then?"}]


def raw_items(scripted, response_id: str, query: str = "") -> tuple[int, dict]:
    """GET input_items over plain HTTP: the status and the JSON body, exactly."""
    try:
        with urllib.request.urlopen(f"{scripted.url}/v1/responses/{response_id}/input_items{query}", timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_input_items_list_and_shape(sclient, scripted):
    first = sclient.responses.create(model="m", input=FIVE, tools=TOOLS)
    page = sclient.responses.input_items.list(first.id)   # desc by default
    kinds = [(i.type, getattr(i, "role", None)) for i in page.data]
    assert kinds == [("message", "user"), ("function_call_output", None), ("function_call", None),
                     ("message", "user"), ("message", "developer")], kinds
    last, output, call, _hello, rules = page.data
    assert call.id == "fc_given" and call.call_id == "c1" and call.name == "get_weather" and call.status == "completed"
    assert output.output == "sunny" and output.id.startswith("fco_") and output.call_id == "c1"
    assert [(c.type, c.text) for c in rules.content] == [("input_text", "Rules.")] and rules.id.startswith("msg_")
    assert [(c.type, c.text) for c in last.content] == [("input_text", "And then?")] and last.status == "completed"
    assert len({i.id for i in page.data}) == 5 and page.has_more is False
    status, body = raw_items(scripted, first.id)
    assert status == 200 and body["object"] == "list" and body["has_more"] is False
    assert (body["first_id"], body["last_id"]) == (last.id, rules.id)
    assert [i["id"] for i in body["data"]] == [i.id for i in page.data]
    # a string input is one user message; the ids are stable across reads
    second = sclient.responses.create(model="m", input="Hi", previous_response_id=first.id)
    status, body = raw_items(scripted, second.id)   # only its own input, not the previous response's
    assert status == 200 and [(i["type"], i["role"], i["content"]) for i in body["data"]] == [
        ("message", "user", [{"type": "input_text", "text": "Hi"}])]
    assert raw_items(scripted, second.id)[1]["data"][0]["id"] == body["data"][0]["id"]


def test_input_items_paging_and_order(sclient, scripted):
    first = sclient.responses.create(model="m", input=FIVE, tools=TOOLS)
    ids = [i.id for i in sclient.responses.input_items.list(first.id, order="asc").data]
    status, body = raw_items(scripted, first.id, "?limit=2&order=asc")
    assert status == 200 and [i["id"] for i in body["data"]] == ids[:2] and body["has_more"] is True
    assert (body["first_id"], body["last_id"]) == (ids[0], ids[1])
    status, body = raw_items(scripted, first.id, f"?limit=2&order=asc&after={ids[1]}")
    assert [i["id"] for i in body["data"]] == ids[2:4] and body["has_more"] is True
    status, body = raw_items(scripted, first.id, f"?limit=2&order=asc&after={ids[3]}")
    assert [i["id"] for i in body["data"]] == ids[4:] and body["has_more"] is False
    status, body = raw_items(scripted, first.id, f"?order=desc&after={ids[3]}&limit=100")
    assert [i["id"] for i in body["data"]] == ids[2::-1] and body["has_more"] is False
    status, body = raw_items(scripted, first.id, f"?order=asc&before={ids[3]}&limit=2")
    assert [i["id"] for i in body["data"]] == ids[:2] and body["has_more"] is True
    # the SDK's auto-pagination follows `after` through every page
    assert [i.id for i in sclient.responses.input_items.list(first.id, limit=2, order="asc")] == ids
    assert [i.id for i in sclient.responses.input_items.list(first.id, limit=1)] == ids[::-1]


def test_input_items_refusals(sclient, scripted):
    first = sclient.responses.create(model="m", input="Hi")
    with pytest.raises(openai.NotFoundError) as err:
        sclient.responses.input_items.list("resp_nope")
    assert err.value.body["type"] == "not_found_error" and "resp_nope" in err.value.body["message"]
    with pytest.raises(openai.BadRequestError) as err:
        sclient.responses.input_items.list(first.id, include=["message.input_image.image_url"])
    assert err.value.body["param"] == "include" and "message.input_image.image_url" in err.value.body["message"]
    for query, param in [("?limit=0", "limit"), ("?limit=101", "limit"), ("?limit=x", "limit"),
                         ("?order=up", "order"), ("?after=msg_nope", "after"), ("?before=msg_nope", "before"),
                         ("?foo=1", "foo"), ("?limit=2&limit=3", "limit")]:
        status, body = raw_items(scripted, first.id, query)
        assert status == 400 and body["error"]["param"] == param and f"'{param}'" in body["error"]["message"], query
    sclient.responses.delete(first.id)
    assert raw_items(scripted, first.id)[0] == 404


def test_store_limits_from_the_config():
    server = ScriptedServer(QWEN3, lambda prompt: ANSWER, responses_store_max=2, responses_store_ttl=1.0)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=30)
        ids = [client.responses.create(model="m", input=f"Hi {i}").id for i in range(3)]
        with pytest.raises(openai.NotFoundError) as err:   # the oldest, past 2
            client.responses.retrieve(ids[0])
        assert "the last 2" in err.value.body["message"]
        assert [client.responses.retrieve(i).id for i in ids[1:]] == ids[1:]
        time.sleep(1.2)   # past the 1 s TTL
        for i in ids[1:]:
            with pytest.raises(openai.NotFoundError):
                client.responses.input_items.list(i)
    finally:
        server.close()
