"""Tools on a template of no known call format: llama-server's generic format
(vkrt/server/generic_tools.py). The prompt asks for JSON (and shows the tools where the template
does not); the reply, held to the JSON by a grammar, is read back as calls or content, whole and
streamed. A scripted model checks prompts and parsing; a tiny model behind a plain template checks
that the grammar makes every reply the JSON, of calls that fit their schemas."""

from __future__ import annotations

import dataclasses
import json

import openai
import pytest

from grammar_schemas import check
from models import TINY
from vkrt.model.synthetic import write_model
from vkrt.server.chat_output import OutputSpec, TemplateSyntax
from vkrt.server.generic_tools import GENERIC, RESPOND, TOOLS_INTRO, prompt_messages
from vkrt.server.reasoning import AUTO
from vkrt.server.tool_calls import schemas

from .scripted import ScriptedServer
from .serverproc import API_KEY, serving
from .test_chat_output import check_splits
from .test_server_tool_choice import check_calls, tools_for
from .test_server_tools import ASK, TOOLS, reassemble

# no tool format and no tools in the template; a system role it knows
PLAIN = ("{% for m in messages %}{% if m.role == 'system' %}[SYS] {% endif %}<|{{ m.role }}|>{{ m.content }}\n"
         "{% endfor %}<|assistant|>")
CALLS = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}, "id": "abcd"}]}'
ANSWER = '{"response": "It is \\"sunny\\" \\u2600 in Paris,\\n21 \\u00b0C."}'


def spec(parallel: bool = True) -> OutputSpec:
    return OutputSpec(TemplateSyntax(GENERIC, False), AUTO, parse_tools=True, parallel_tool_calls=parallel,
                      tools=schemas(TOOLS))


def test_replies_parse_whole_and_streamed():
    assert check_splits(spec(), CALLS)["calls"] == [["get_weather", '{"city": "Paris", "days": 2}']]
    one = '{\n  "tool_call": {"name": "get_weather", "arguments": {}}\n}'
    assert check_splits(spec(False), one) == {"reasoning": "", "content": "", "calls": [["get_weather", "{}"]]}
    # the response's string decoded as it comes (escapes, surrogate pairs), never its JSON
    text = '{"response": "a\\"b\\\\ \\ud83d\\ude00 \\u00e9\\n"}'
    assert check_splits(spec(), text)["content"] == 'a"b\\ \U0001F600 é\n'
    assert check_splits(spec(), '{"response": {"x": [1, 2]}}')["content"] == '{"x": [1, 2]}'
    assert check_splits(spec(), "plain text, no JSON")["content"] == "plain text, no JSON"


def test_prompt_messages_as_llama_server_writes_them():
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "ok"}]
    out = prompt_messages(msgs, TOOLS, PLAIN, parallel=True)
    assert out[0]["content"].startswith("Be brief.\n\n" + RESPOND + "\n\n" + TOOLS_INTRO)
    assert '"tool_calls": [' in out[0]["content"]   # the example's shape
    assert json.loads(out[2]["content"]) == {"tool_calls": [{"name": "f", "arguments": {"a": 1}, "id": "call_1"}]}
    assert out[3]["role"] == "user" and json.loads(out[3]["content"]) == {
        "tool_response": {"content": "ok", "tool_call_id": "call_1"}}
    native = "{{ tools }}{{ tool_calls }}{% if m.role == 'tool' %}{% endif %}system"   # shows them itself
    kept = prompt_messages(msgs, TOOLS, native, parallel=False)
    assert kept[0]["content"] == "Be brief.\n\n" + RESPOND and kept[2:] == msgs[2:]
    no_system = prompt_messages(msgs[1:2], TOOLS, "{{ messages }}", parallel=False)
    assert len(no_system) == 1 and no_system[0]["content"].startswith(RESPOND) and '"tool_call": {' in \
        no_system[0]["content"] and no_system[0]["content"].endswith("\nHi")


@pytest.fixture(scope="module")
def srv():
    server = ScriptedServer(PLAIN, lambda prompt: ANSWER if "tool_response" in prompt else CALLS)
    yield server
    server.close()


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=30)


def test_scripted_round_trip(client, srv):
    first = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS)
    prompt = srv.scheduler.prompts[-1]
    assert prompt.startswith("[SYS] <|system|>" + RESPOND) and '"name": "get_weather"' in prompt
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call, = choice.message.tool_calls
    assert call.id.startswith("call_") and json.loads(call.function.arguments) == {"city": "Paris", "days": 2}
    got, finish = reassemble(client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, stream=True))
    assert finish == ["tool_calls"] and [(c["name"], c["arguments"]) for c in got["calls"].values()] == [
        ("get_weather", call.function.arguments)]
    history = ASK + [choice.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
    final = client.chat.completions.create(model="m", messages=history, tools=TOOLS)
    assert f'"id": "{call.id}"' in srv.scheduler.prompts[-1] and '"tool_response"' in srv.scheduler.prompts[-1]
    assert final.choices[0].finish_reason == "stop" and not final.choices[0].message.tool_calls
    assert final.choices[0].message.content == 'It is "sunny" \u2600 in Paris,\n21 \u00b0C.'
    got, finish = reassemble(client.chat.completions.create(model="m", messages=history, tools=TOOLS, stream=True))
    assert finish == ["stop"] and got["content"] == final.choices[0].message.content


def test_tool_choice_none_is_plain_chat(client, srv):
    out = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="none")
    assert RESPOND not in srv.scheduler.prompts[-1] and out.choices[0].message.content == CALLS


@pytest.mark.parametrize("extra,param", [
    ({"grammar": "root ::= \"x\""}, "grammar"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "strin"}}}},
     "response_format.json_schema.schema"),
])
def test_grammars_beside_tools_refused_name_the_field(client, extra, param):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, extra_body=extra)
    assert err.value.body["param"] == param, err.value.body


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("generic") / "tiny-plain-template.gguf")
    write_model(path, dataclasses.replace(TINY["tiny-qwen3"], chat_template=PLAIN))
    gen = serving(path, "-c", "4096", "-np", "2", "-b", "512", "-ub", "512")
    server = next(gen)
    yield openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)
    next(gen, None)


DIGIT = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["n"]}


@pytest.mark.parametrize("choice,parallel", [("required", True), ("required", False), ("named", False)])
def test_tiny_model_calls_fit(tiny, choice, parallel):
    # parallel: small calls, so that the tiny model's list ends within max_tokens
    tools = tools_for(4) if not parallel else [
        {"type": "function", "function": {"name": f"digit_{i}", "parameters": DIGIT}} for i in range(3)]
    name = tools[2]["function"]["name"]
    tool_choice = {"type": "function", "function": {"name": name}} if choice == "named" else choice
    out = tiny.chat.completions.create(model="m", messages=ASK, tools=tools, tool_choice=tool_choice, seed=2,
                                       parallel_tool_calls=parallel, temperature=0.9, max_tokens=600)
    c = out.choices[0]
    assert c.finish_reason == "tool_calls" and not c.message.content, c
    check_calls(c.message.tool_calls, tools, names=[name] if choice == "named" else None)
    assert parallel or len(c.message.tool_calls) == 1


def test_tiny_model_auto_is_the_json_of_a_call_or_an_answer(tiny):
    """tool_choice auto: the reply is a call or a response (its text as content), the stream the same."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
    for seed in range(4):
        body = dict(model="m", messages=ASK, tools=tools, seed=seed, temperature=1.0, max_tokens=40)
        whole = tiny.chat.completions.create(**body).choices[0]
        got, finish = reassemble(tiny.chat.completions.create(**body, stream=True))
        if whole.message.tool_calls:
            check(json.loads(whole.message.tool_calls[0].function.arguments), schema)
        else:
            assert "response" not in (whole.message.content or ""), whole.message   # the string, not its JSON
        assert got["content"] == (whole.message.content or "") and finish == [whole.finish_reason]
        assert [c["arguments"] for c in got["calls"].values()] == [
            c.function.arguments for c in whole.message.tool_calls or ()]
