"""Tool calls and reasoning through the HTTP API, with the official openai client, over a scripted
model (tests/server/scripted.py) behind a Qwen3-style chat template."""

from __future__ import annotations

import json

import openai
import pytest

from .scripted import ScriptedServer
from .test_harmony_template import HARMONY

# Qwen3's template in short: tools in <tools>, calls in <tool_call> JSON, tool results in
# <tool_response>, and <think> (an empty one when enable_thinking is false)
QWEN3 = """{%- if tools %}<|im_start|>system
# Tools
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
For each function call, return a json object within <tool_call></tool_call> XML tags.<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == "assistant" %}<|im_start|>assistant
{{ message.content or "" }}
{%- for tc in message.tool_calls or [] %}
<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == "tool" %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false %}<think>

</think>

{% endif %}{% endif %}"""

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CALL = ('<think>\nI need the weather for Paris.\n</think>\n\nLet me check.\n<tool_call>\n'
        '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>')
ANSWER = "<think>\nThe tool said sunny.\n</think>\n\nIt is sunny in Paris, 21 °C."
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def scripted_reply(prompt: str) -> str:
    return ANSWER if "<tool_response>" in prompt else CALL


@pytest.fixture(scope="module")
def srv():
    server = ScriptedServer(QWEN3, scripted_reply)
    yield server
    server.close()


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=30)


def reassemble(stream) -> tuple[dict, list]:
    """A streamed reply as the client sees it: reasoning, content, calls, finish reasons."""
    out = {"reasoning": "", "content": "", "calls": {}}
    finish = []
    for chunk in stream:
        for ch in chunk.choices:
            d = ch.delta
            out["reasoning"] += getattr(d, "reasoning_content", None) or ""
            out["content"] += d.content or ""
            for tc in d.tool_calls or ():
                call = out["calls"].setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                if tc.id:
                    assert call["id"] is None, "the id comes once, in the first delta"
                    call["id"], call["name"] = tc.id, tc.function.name
                    assert call["name"], "the name comes with the id"
                call["arguments"] += tc.function.arguments or ""
            if ch.finish_reason:
                finish.append(ch.finish_reason)
    return out, finish


def test_tool_round_trip(client, srv):
    first = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    msg = choice.message
    assert msg.content == "Let me check." and msg.reasoning_content == "I need the weather for Paris."
    call, = msg.tool_calls
    assert call.id.startswith("call_") and call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "celsius"}
    assert '"name": "get_weather"' in srv.scheduler.prompts[-1]   # the tools reached the template
    history = ASK + [msg.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "sunny", "celsius": 21}'}]
    final = client.chat.completions.create(model="m", messages=history, tools=TOOLS)
    prompt = srv.scheduler.prompts[-1]
    assert '"arguments": {"city": "Paris", "unit": "celsius"}' in prompt   # arguments as an object
    assert '<tool_response>\n{"sky": "sunny", "celsius": 21}\n</tool_response>' in prompt
    assert final.choices[0].finish_reason == "stop" and not final.choices[0].message.tool_calls
    assert final.choices[0].message.content == "It is sunny in Paris, 21 °C."
    assert final.choices[0].message.reasoning_content == "The tool said sunny."


def test_streamed_tool_call_equals_the_whole(client):
    whole = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS).choices[0].message
    got, finish = reassemble(client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, stream=True))
    assert finish == ["tool_calls"]
    assert got["content"] == whole.content and got["reasoning"] == whole.reasoning_content
    call, = got["calls"].values()
    assert call["name"] == "get_weather" and call["id"].startswith("call_")
    assert json.loads(call["arguments"]) == json.loads(whole.tool_calls[0].function.arguments)
    assert call["arguments"] == whole.tool_calls[0].function.arguments


def test_streamed_reasoning_split(client, srv):
    history = ASK + [{"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    got, finish = reassemble(client.chat.completions.create(model="m", messages=history, stream=True))
    assert finish == ["stop"] and not got["calls"]
    assert got["reasoning"] == "The tool said sunny." and got["content"] == "It is sunny in Paris, 21 °C."


def test_tool_choice_none_offers_no_tools_and_parses_nothing(client, srv):
    out = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="none")
    assert "<tools>" not in srv.scheduler.prompts[-1]
    msg = out.choices[0].message
    assert out.choices[0].finish_reason == "stop" and not msg.tool_calls and "<tool_call>" in msg.content


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_tool_choice_is_taken(client, srv, choice):
    """The scripted reply is a call, as the grammar would make it (the scripted model ignores grammars)."""
    out = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice=choice)
    assert out.choices[0].finish_reason == "tool_calls" and '"name": "get_weather"' in srv.scheduler.prompts[-1]


@pytest.mark.parametrize("extra,param", [
    ({"tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "tool_choice.function.name"),
    ({"tool_choice": "required", "tools": None}, "tool_choice"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"tools": [{**TOOLS[0], "function": {**TOOLS[0]["function"], "strict": "yes"}}]}, "tools[0].function.strict"),
    ({"tools": [{**TOOLS[0], "function": {**TOOLS[0]["function"], "strict": True}}], "json_schema": {}},
     "tools[0].function.strict"),
    ({"tool_choice": "required", "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "strin"}}}}}]},
     "tools[0].function.parameters"),
])
def test_forced_or_strict_tools_refused_name_the_field(client, extra, param):
    body = {"tools": TOOLS, **extra}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="m", messages=ASK, extra_body=body)
    assert err.value.body["param"] == param, err.value.body


@pytest.mark.parametrize("extra,param", [
    ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
    ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools[0].function.name"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"reasoning_format": "verbose"}, "reasoning_format"),
    ({"chat_template_kwargs": "enable_thinking"}, "chat_template_kwargs"),
    ({"messages": ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]},
     "messages[1].tool_calls[0].function.arguments"),
])
def test_bad_tool_fields_name_the_field(client, extra, param):
    body = {"messages": ASK, **extra}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="m", messages=body.pop("messages"), extra_body=body)
    assert err.value.body["param"] == param


def test_template_kwargs_reach_the_template(client, srv):
    client.chat.completions.create(model="m", messages=ASK)
    assert not srv.scheduler.prompts[-1].endswith("</think>\n\n")
    client.chat.completions.create(model="m", messages=ASK, extra_body={"chat_template_kwargs": {
        "enable_thinking": False}})
    assert srv.scheduler.prompts[-1].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_reasoning_format_none_leaves_the_thinking_in_content(client):
    out = client.chat.completions.create(model="m", messages=ASK, extra_body={"reasoning_format": "none"})
    msg = out.choices[0].message
    assert getattr(msg, "reasoning_content", None) is None and msg.content.startswith("<think>\nI need")


def test_reasoning_budget_zero_turns_thinking_off():
    server = ScriptedServer(QWEN3, lambda prompt: "Hi.", reasoning_budget=0, reasoning_format="none")
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=30)
        client.chat.completions.create(model="m", messages=ASK)
        assert server.scheduler.prompts[-1].endswith("<think>\n\n</think>\n\n")
        client.chat.completions.create(model="m", messages=ASK, extra_body={"chat_template_kwargs": {
            "enable_thinking": True}})
        assert server.scheduler.prompts[-1].endswith("<|im_start|>assistant\n")
    finally:
        server.close()


def test_gpt_oss_harmony_call_and_reasoning():
    reply = ("<|channel|>analysis<|message|>Use the tool.<|end|><|start|>assistant<|channel|>commentary "
             'to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo"}')
    server = ScriptedServer(HARMONY, lambda prompt: reply)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=30)
        whole = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS).choices[0]
        assert whole.finish_reason == "tool_calls" and whole.message.reasoning_content == "Use the tool."
        assert whole.message.content is None and whole.message.tool_calls[0].function.arguments == '{"city": "Oslo"}'
        got, finish = reassemble(client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, stream=True))
        assert finish == ["tool_calls"] and got["reasoning"] == "Use the tool." and got["content"] == ""
        assert [(c["name"], c["arguments"]) for c in got["calls"].values()] == [("get_weather", '{"city": "Oslo"}')]
        history = ASK + [whole.message.model_dump(exclude_none=True),
                         {"role": "tool", "tool_call_id": whole.message.tool_calls[0].id, "content": "sunny"}]
        client.chat.completions.create(model="m", messages=history, tools=TOOLS)
        assert ('to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Oslo"}<|call|>'
                in server.scheduler.prompts[-1])
    finally:
        server.close()
