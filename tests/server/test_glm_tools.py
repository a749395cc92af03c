"""GLM-4.5 / 4.6 tool calls (vkrt/server/glm_tools.py): the format detected from the template, the
parser (whole and cut at every character), the grammars of tool_choice required / named and of
strict tools, and a tiny model behind a GLM-style template answering tool_choice required."""

from __future__ import annotations

import dataclasses
import json

import openai
import pytest

from grammar_schemas import check
from models import TINY
from vkrt.model.synthetic import write_model
from vkrt.server.chat_output import OutputSpec, TemplateSyntax, parse
from vkrt.server.glm_tools import GLM45
from vkrt.server.reasoning import AUTO
from vkrt.server.tool_calls import schemas
from vkrt.server.tool_grammar import MAY_THINK, NO_THINKING, tool_grammar

from .serverproc import API_KEY, serving
from .test_chat_output import check_splits
from .test_server_tools import reassemble
from .test_tool_grammar import sample, tok  # noqa: F401 (tok: the tiny tokenizer fixture)

# GLM-4.5's template in short: [gMASK]<sop>, tools in <tools>, calls as <tool_call>NAME and
# <arg_key>/<arg_value> pairs, <think> (an empty one when enable_thinking is false)
GLM = """[gMASK]<sop>
{%- if tools %}<|system|>
# Tools
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
Call a tool as <tool_call>{function-name}
<arg_key>{arg-key-1}</arg_key>
<arg_value>{arg-value-1}</arg_value>
</tool_call>{%- endif %}
{%- for m in messages %}<|{{ m.role }}|>
{{ m.content }}{% endfor %}
{%- if add_generation_prompt %}<|assistant|>{% if enable_thinking is defined and not enable_thinking %}
<think></think>{% endif %}{% endif %}"""

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                            "units": {"enum": ["c", "f"]}, "hours": {"type": "array"}},
           "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"zone": {"type": "string", "maxLength": 8}}, "required": ["zone"]}}}]


def spec(thinks: bool = True, parallel: bool = True) -> OutputSpec:
    return OutputSpec(TemplateSyntax(GLM45, thinks), AUTO, parse_tools=True, parallel_tool_calls=parallel,
                      tools=schemas(TOOLS))


def test_detected_from_the_template():
    assert TemplateSyntax.detect(GLM) == TemplateSyntax(GLM45, True)
    assert "<arg_key>" in TemplateSyntax.detect(GLM).kept_tokens()
    assert TemplateSyntax.detect(GLM.replace("[gMASK]<sop>", "")).tools != GLM45


def test_calls_typed_by_schema_whole_and_streamed():
    text = ("\n<think>Weather first.</think>\nChecking.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
            "<arg_value>123</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>hours"
            "</arg_key>\n<arg_value>[1, 2]</arg_value>\n<arg_key>note</arg_key>\n<arg_value>true</arg_value>\n"
            "</tool_call>\n<tool_call>get_time\n<arg_key>zone</arg_key>\n<arg_value>{\"a\": 1}</arg_value>\n"
            "</tool_call>")
    out = check_splits(spec(), text)
    assert out["reasoning"] == "Weather first." and out["content"] == "Checking."
    (n1, a1), (n2, a2) = out["calls"]
    # a string-typed value stays text even where it parses as JSON; others are JSON; unknown keys too
    assert n1 == "get_weather" and json.loads(a1) == {"city": "123", "days": 3, "hours": [1, 2], "note": True}
    assert n2 == "get_time" and json.loads(a2) == {"zone": '{"a": 1}'}


def test_a_call_without_arguments_and_one_cut_short():
    assert check_splits(spec(), "<tool_call>get_time\n</tool_call>")["calls"] == [["get_time", "{}"]]
    cut = parse(spec(), "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Par")
    assert [(c.name, c.arguments) for c in cut.calls] == [("get_weather", "{}")]
    assert parse(spec(parallel=False), "<tool_call>get_time\n</tool_call><tool_call>get_time\n</tool_call>"
                 ).calls == [parse(spec(), "<tool_call>get_time\n</tool_call>").calls[0]]


@pytest.mark.parametrize("name,parallel,thinking,prefix", [
    (None, True, NO_THINKING, ""), ("get_time", False, NO_THINKING, ""),
    (None, True, MAY_THINK, "<think>hmm</think>\n")])
def test_forced_grammar_makes_calls_that_fit(tok, name, parallel, thinking, prefix):  # noqa: F811
    grammar = tool_grammar(GLM45, TOOLS, choice="required", name=name, parallel=parallel, thinking=thinking,
                           specials={})
    for seed in range(4):
        text, ended = sample(tok, grammar, seed, prefix)
        if not ended:
            continue
        msg = parse(spec(thinks=thinking != NO_THINKING, parallel=parallel), text)
        assert msg.calls and not msg.content, text
        by_name = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
        for c in msg.calls:
            assert c.name == (name or c.name) and c.name in by_name
            check(json.loads(c.arguments), by_name[c.name])


def test_strict_tools_lazy_grammar_leaves_text_free_until_a_call(tok):  # noqa: F811
    strict = [{**t, "function": {**t["function"], "strict": True}} for t in TOOLS]
    grammar = tool_grammar(GLM45, strict, choice="auto", name=None, parallel=True, thinking=NO_THINKING, specials={})
    text, _ = sample(tok, grammar, 0, "Any { text.\n<tool_call>get_time\n<arg_key>zone</arg_key>\n<arg_value>")
    msg = parse(spec(thinks=False), text)
    assert msg.content.startswith("Any { text.") and msg.calls[0].name == "get_time", text
    assert len(json.loads(msg.calls[0].arguments)["zone"]) <= 8   # the strict schema's maxLength


def test_special_markers_are_asked_for_as_tokens():
    specials = {"<tool_call>": 900, "</tool_call>": 901, "<arg_key>": 902, "</arg_key>": 903, "<arg_value>": 904,
                "</arg_value>": 905}
    grammar = tool_grammar(GLM45, TOOLS, choice="required", name="get_time", parallel=False, thinking=NO_THINKING,
                           specials=specials)
    assert all(f"<[{i}]>" in grammar for i in specials.values()) and '"<arg_key>"' not in grammar


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("glm") / "tiny-glm-template.gguf")
    write_model(path, dataclasses.replace(TINY["tiny-qwen3"], chat_template=GLM))
    gen = serving(path, "-c", "2048", "-np", "1", "-b", "512", "-ub", "512")
    server = next(gen)
    yield openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)
    next(gen, None)


# bounded arguments: the tiny model's calls end within max_tokens
BOUNDED = [TOOLS[1], {"type": "function", "function": {"name": "forecast", "parameters": {
    "type": "object", "properties": {"days": {"type": "integer", "minimum": 0, "maximum": 9},
                                     "units": {"enum": ["c", "f"]}}, "required": ["days", "units"]}}}]


def test_tiny_model_required_calls_parse(client):
    """Without the grammar the tiny model writes no call; with it, one that fits, whole and streamed."""
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    body = dict(model="m", messages=ask, tools=BOUNDED, tool_choice="required", parallel_tool_calls=False, seed=3,
                temperature=0.8, max_tokens=200, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    choice = client.chat.completions.create(**body).choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content, choice.message
    call, = choice.message.tool_calls
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in BOUNDED}
    assert call.id.startswith("call_")
    check(json.loads(call.function.arguments), by_name[call.function.name])
    got, finish = reassemble(client.chat.completions.create(**body, stream=True))
    assert finish == ["tool_calls"]
    assert [(c["name"], c["arguments"]) for c in got["calls"].values()] == [
        (call.function.name, call.function.arguments)]
    free = client.chat.completions.create(**{**body, "tool_choice": "auto", "max_tokens": 60}).choices[0]
    assert not free.message.tool_calls and free.finish_reason != "tool_calls"
