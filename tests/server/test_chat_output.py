"""Replies parsed into reasoning, content and tool calls, for each format our models write; streamed
in pieces cut at every character, the deltas add up to the whole parse."""

from __future__ import annotations

import json

import pytest

from vkrt.server.chat_output import HARMONY, MessageStream, OutputSpec, TemplateSyntax, parse
from vkrt.server.generic_tools import GENERIC
from vkrt.server.reasoning import AUTO, NONE, opens_thinking
from vkrt.server.tool_calls import HERMES, LLAMA3, QWEN_XML, json_end, schemas

WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                     "metric": {"type": "boolean"}, "hours": {"type": "array"}}}}}]


def spec(fmt, thinks=False, reasoning=AUTO, opened=False, tools=True, parallel=True):
    return OutputSpec(TemplateSyntax(fmt, thinks), reasoning, opened, tools, parallel, schemas(WEATHER))


def streamed(s: OutputSpec, pieces) -> dict:
    """The message the deltas of a stream add up to (as an OpenAI client reassembles it)."""
    stream = MessageStream(s)
    deltas = [d for p in pieces for d in stream.push(p)]
    last, msg = stream.finish()
    out = {"reasoning": "", "content": "", "calls": []}
    for d in deltas + last:
        out["reasoning"] += d.get("reasoning_content", "")
        out["content"] += d.get("content", "")
        for c in d.get("tool_calls", ()):
            if c["index"] == len(out["calls"]):
                assert c["id"].startswith("call_") and c["function"]["name"]
                out["calls"].append([c["function"]["name"], ""])
            out["calls"][c["index"]][1] += c["function"]["arguments"]
    return out, msg


def as_dict(msg) -> dict:
    return {"reasoning": msg.reasoning, "content": msg.content, "calls": [[c.name, c.arguments] for c in msg.calls]}


def check_splits(s: OutputSpec, text: str) -> dict:
    """Cut at every character (and into single characters): the same message as the whole parse."""
    whole = as_dict(parse(s, text))
    for cut in range(len(text) + 1):
        got, msg = streamed(s, [text[:cut], text[cut:]])
        assert got == whole == as_dict(msg), (cut, text[:cut])
    assert streamed(s, list(text))[0] == whole
    for _, args in whole["calls"]:
        json.loads(args)
    return whole


HERMES_TEXT = ('I will look that up.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
               '"days": 2}}\n</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n'
               '</tool_call>')


def test_hermes_calls_and_content_before_them():
    out = check_splits(spec(HERMES), HERMES_TEXT)
    assert out == {"reasoning": "", "content": "I will look that up.", "calls": [
        ["get_weather", '{"city": "Paris", "days": 2}'], ["get_weather", '{"city": "Lyon"}']]}


def test_qwen3_thinks_then_calls():
    text = ('<think>\nThe user wants the weather {"x"}.\n</think>\n\n<tool_call>\n{"name": "get_weather", '
            '"arguments": {"city": "Oslo"}}\n</tool_call>')
    out = check_splits(spec(HERMES, thinks=True), text)
    assert out == {"reasoning": 'The user wants the weather {"x"}.', "content": "",
                   "calls": [["get_weather", '{"city": "Oslo"}']]}


def test_no_raw_markup_reaches_content_while_streaming():
    stream = MessageStream(spec(HERMES))
    sent = "".join(d.get("content", "") for ch in HERMES_TEXT for d in stream.push(ch))
    assert "<" not in sent and sent == "I will look that up."


def test_parallel_tool_calls_false_keeps_the_first():
    out = check_splits(spec(HERMES, parallel=False), HERMES_TEXT)
    assert [c[0] for c in out["calls"]] == ["get_weather"] and "Paris" in out["calls"][0][1]


def test_tools_not_parsed_leave_the_text_as_content():
    assert parse(spec(HERMES, tools=False), HERMES_TEXT).content == HERMES_TEXT


def test_bad_call_json_stays_content():
    text = "Sure.\n<tool_call>\n{not json}\n</tool_call>"
    out = check_splits(spec(HERMES), text)
    assert out["calls"] == [] and "{not json}" in out["content"]


def test_qwen_xml_typed_by_schema():
    text = ("Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
            "<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n<parameter=hours>\n"
            "[1, 2]\n</parameter>\n</function>\n</tool_call>")
    out = check_splits(spec(QWEN_XML, thinks=True, opened=True), "Plan: call it.\n</think>\n\n" + text)
    assert out["reasoning"] == "Plan: call it." and out["content"] == "Checking."
    name, args = out["calls"][0]
    assert name == "get_weather" and json.loads(args) == {"city": "New York", "days": 3, "metric": True,
                                                           "hours": [1, 2]}


def test_qwen_xml_string_parameter_that_looks_like_json_stays_text():
    text = "<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n</function>\n</tool_call>"
    assert json.loads(check_splits(spec(QWEN_XML), text)["calls"][0][1]) == {"city": "42"}


@pytest.mark.parametrize("text,content", [
    ('{"name": "get_weather", "parameters": {"city": "Rome"}}', ""),
    ('<|python_tag|>{"type": "function", "name": "get_weather", "parameters": {"city": "Rome"}}', ""),
    ('Let me see. <|python_tag|>{"name": "get_weather", "parameters": {"city": "Rome"}}', "Let me see."),
])
def test_llama3_json_calls(text, content):
    out = check_splits(spec(LLAMA3), text)
    assert out == {"reasoning": "", "content": content, "calls": [["get_weather", '{"city": "Rome"}']]}


def test_llama3_plain_json_answer_is_content():
    text = '{"answer": 42}'
    assert check_splits(spec(LLAMA3), text) == {"reasoning": "", "content": text, "calls": []}


def test_think_split_and_format_none():
    """A generic-format template's reply that is not its JSON (no tools, or no grammar) is content."""
    text = "<think>\nhmm, 2+2\n</think>\n\nIt is 4."
    assert check_splits(spec(GENERIC, thinks=True), text) == {"reasoning": "hmm, 2+2", "content": "It is 4.",
                                                              "calls": []}
    assert check_splits(spec(GENERIC, thinks=True, reasoning=NONE), text)["content"] == text
    opened = check_splits(spec(GENERIC, thinks=True, opened=True), "hmm\n</think>\n\nIt is 4.")
    assert opened == {"reasoning": "hmm", "content": "It is 4.", "calls": []}
    assert parse(spec(GENERIC, thinks=True, opened=True), "still thinking").reasoning == "still thinking"


def test_opens_thinking():
    assert opens_thinking("<|im_start|>assistant\n<think>\n")
    assert not opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n")


HARMONY_TEXT = ("<|channel|>analysis<|message|>Need the weather tool.<|end|><|start|>assistant<|channel|>commentary "
                "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Tokyo\"}")


def test_harmony_reasoning_and_call():
    out = check_splits(spec(HARMONY), HARMONY_TEXT)
    assert out == {"reasoning": "Need the weather tool.", "content": "",
                   "calls": [["get_weather", '{"city": "Tokyo"}']]}
    recipient_first = ("<|channel|>analysis<|message|>x<|end|><|start|>assistant to=functions.get_weather"
                       "<|channel|>commentary json<|message|>{}")
    assert check_splits(spec(HARMONY), recipient_first)["calls"] == [["get_weather", "{}"]]


def test_harmony_final_answer():
    text = ("<|channel|>analysis<|message|>Simple.<|end|><|start|>assistant<|channel|>analysis<|message|>Yes."
            "<|end|><|start|>assistant<|channel|>final<|message|>Hello there!")
    assert check_splits(spec(HARMONY), text) == {"reasoning": "Simple.Yes.", "content": "Hello there!", "calls": []}
    raw = parse(spec(HARMONY, reasoning=NONE), text)
    assert raw.reasoning == "" and raw.content == ("<|channel|>analysis<|message|>Simple.<|end|><|channel|>analysis"
                                                   "<|message|>Yes.<|end|>Hello there!")


@pytest.mark.parametrize("source,fmt,thinks", [
    ("{{ '<|channel|>' }}", HARMONY, False),
    ("<tool_call><function=x><parameter=y> <think>", QWEN_XML, True),
    ("<tool_call>{{ tools }}<think>", HERMES, True),
    ("<|start_header_id|>ipython<|end_header_id|>", LLAMA3, False),
    ("{{ messages }}", GENERIC, False),
])
def test_format_from_template(source, fmt, thinks):
    assert TemplateSyntax.detect(source) == TemplateSyntax(fmt, thinks)


def test_json_end():
    assert json_end('{"a": "}"} x', 0) == 10 and json_end('{"a": [1', 0) is None and json_end(" 12 ", 0) == 3
