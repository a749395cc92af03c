"""tool_choice "required" / a named function and `strict` tools through `vkrt serve` on a tiny random
model, with the official openai client: the grammar (vkrt/server/tool_grammar.py) is all that makes
the model's garbage a call, so every reply must parse into tool calls whose arguments fit the
schemas; without it (tool_choice auto) the same model writes no call at all."""

from __future__ import annotations

import dataclasses
import json

import openai
import pytest

from grammar_schemas import check, random_schema
from models import TINY
from vkrt.model.synthetic import write_model

from .serverproc import API_KEY, serving
from .test_server_tools import QWEN3, reassemble

# Qwen3.5 / Qwen3-Coder's XML function format, in short
QWEN_XML = """{%- if tools %}<|im_start|>system
<tools>{% for tool in tools %}{{ tool | tojson }}{% endfor %}</tools>
Reply with <tool_call>
<function=NAME>
<parameter=NAME>
VALUE
</parameter>
</function>
</tool_call><|im_end|>
{% endif %}
{%- for message in messages %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false %}<think>

</think>

{% endif %}{% endif %}"""

ASK = [{"role": "user", "content": "Call a tool."}]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


def tools_for(seed: int, n: int = 3) -> list[dict]:
    return [{"type": "function", "function": {"name": f"tool_{seed}_{i}", "description": f"Tool {i}",
                                              "parameters": random_schema(1000 * seed + i)}} for i in range(n)]


def check_calls(calls, tools: list[dict], names=None) -> None:
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    assert calls
    for c in calls:
        assert c.id.startswith("call_") and c.function.name in (names or by_name), c
        check(json.loads(c.function.arguments), by_name[c.function.name])


def serve_with(template: str, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tool-choice") / "tiny-qwen3-tools.gguf")
    write_model(path, dataclasses.replace(TINY["tiny-qwen3"], chat_template=template))
    yield from serving(path, "-c", "4096", "-np", "2", "-b", "512", "-ub", "512")   # the tools' text is long


@pytest.fixture(scope="module", params=["hermes", "qwen-xml"])
def client(request, tmp_path_factory):
    gen = serve_with(QWEN3 if request.param == "hermes" else QWEN_XML, tmp_path_factory)
    server = next(gen)
    yield openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)
    next(gen, None)


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
@pytest.mark.parametrize("seed", range(3))
def test_required_replies_are_calls_that_fit(client, seed, temperature):
    tools = tools_for(seed)
    out = client.chat.completions.create(model="m", messages=ASK, tools=tools, tool_choice="required",
                                         max_tokens=600, temperature=temperature, seed=seed, extra_body=NO_THINKING)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    assert not choice.message.content
    check_calls(choice.message.tool_calls, tools)


@pytest.mark.parametrize("parallel", [False, True])
def test_named_function_is_the_one_called(client, parallel):
    tools = tools_for(7)
    name = tools[1]["function"]["name"]
    out = client.chat.completions.create(model="m", messages=ASK, tools=tools, max_tokens=600, temperature=0.9,
                                         seed=4, parallel_tool_calls=parallel, extra_body=NO_THINKING,
                                         tool_choice={"type": "function", "function": {"name": name}})
    calls = out.choices[0].message.tool_calls
    check_calls(calls, tools, names=[name])
    if not parallel:
        assert len(calls) == 1


def test_streamed_calls_reassemble(client):
    tools = tools_for(3)
    got, finish = reassemble(client.chat.completions.create(
        model="m", messages=ASK, tools=tools, tool_choice="required", max_tokens=600, temperature=0.8, seed=1,
        stream=True, extra_body=NO_THINKING))
    assert finish == ["tool_calls"] and got["calls"] and not got["content"].strip()
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    for call in got["calls"].values():
        check(json.loads(call["arguments"]), by_name[call["name"]])


def test_strict_auto_allows_text_and_calls_fit(client):
    """A strict function with tool_choice auto: the reply is free (the tiny model seldom opens a
    call); whatever calls it holds fit."""
    tools = [{**t, "function": {**t["function"], "strict": True}} for t in tools_for(5)]
    for seed in range(2):
        out = client.chat.completions.create(model="m", messages=ASK, tools=tools, max_tokens=60, temperature=1.0,
                                             seed=seed, extra_body=NO_THINKING)
        for c in out.choices[0].message.tool_calls or ():
            check_calls([c], tools)


def test_without_the_grammar_the_model_writes_no_call(client):
    """The control: tool_choice auto, no strict tools, the same requests: the tiny model's text
    holds no call, so the tests above pass only through the grammar."""
    for seed in range(3):
        out = client.chat.completions.create(model="m", messages=ASK, tools=tools_for(seed), max_tokens=200,
                                             temperature=1.0, seed=seed, extra_body=NO_THINKING)
        assert not out.choices[0].message.tool_calls and out.choices[0].finish_reason != "tool_calls"


@pytest.mark.parametrize("choice,extra,param", [
    ({"type": "function", "function": {"name": "nope"}}, {}, "tool_choice.function.name"),
    ({"type": "function", "function": {}}, {}, "tool_choice.function.name"),
    ("required", {"response_format": {"type": "json_object"}}, "tool_choice"),
    ("sometimes", {}, "tool_choice"),
])
def test_bad_tool_choice_names_the_field(client, choice, extra, param):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="m", messages=ASK, tools=tools_for(0), tool_choice=choice,
                                       extra_body=extra)
    assert err.value.body["param"] == param, err.value.body


def test_required_without_tools_is_refused(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="m", messages=ASK, tool_choice="required")
    assert err.value.body["param"] == "tool_choice"
