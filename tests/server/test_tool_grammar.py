"""The tool-call grammars (vkrt/server/tool_grammar.py) on their own, over the tiny model's
tokenizer and a random "model" (tokens drawn among those the mask allows): every format's reply
parses (chat_output.parse) into calls whose arguments fit the schemas, with thinking first where
the template allows it, markers as special tokens or as text; strict tools with tool_choice auto
leave text free until a call opens."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
from llguidance import LLMatcher

from grammar_schemas import check, random_schema
from models import tiny_model
from vkrt.engine.grammar import grammar_tokenizer
from vkrt.model.tokenizer import Tokenizer
from vkrt.server.chat_output import HARMONY, OutputSpec, TemplateSyntax, parse
from vkrt.server.tool_calls import HERMES, LLAMA3, QWEN_XML, schemas
from vkrt.server.tool_grammar import MAY_THINK, NO_THINKING, THINKING, tool_grammar
from vkrt.server.validation import BadRequest

TOOLS = [{"type": "function", "function": {"name": f"fn{i}", "parameters": random_schema(20 + i)}} for i in range(3)]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    reader = gguf.GGUFReader(tiny_model("tiny-qwen3", tmp_path_factory.mktemp("tool-grammar")))
    meta = {}
    for key, f in reader.fields.items():
        try:
            meta[key] = f.contents()
        except Exception:   # keys whose values gguf cannot render are not the tokenizer's
            pass
    return Tokenizer.from_metadata(meta)


def sample(tok, grammar: str, seed: int, prefix: str = "", n: int = 600) -> tuple[str, bool]:
    """(the text, whether the grammar let it end) of a random walk through the mask after `prefix`."""
    rng = np.random.default_rng(seed)
    m = LLMatcher(grammar_tokenizer(tok, len(tok.tokens)), grammar, log_level=0)
    assert not m.is_error(), m.get_error()
    assert m.consume_tokens(tok.encode(prefix, add_special=False)), m.get_error()
    out = []
    for _ in range(n):
        bits = np.unpackbits(np.frombuffer(m.compute_bitmask(), np.uint8), bitorder="little")[:len(tok.tokens)]
        allowed = np.flatnonzero(bits)
        assert allowed.size, m.get_error()
        t = int(rng.choice(allowed))
        if t in tok.eog_ids:
            return prefix + tok.decode(out), True
        assert m.consume_token(t), m.get_error()
        out.append(t)
    return prefix + tok.decode(out), False


def calls_of(fmt: str, text: str, thinking_open: bool = False):
    spec = OutputSpec(TemplateSyntax(fmt, fmt != LLAMA3), "auto", thinking_open=thinking_open, parse_tools=True,
                      tools=schemas(TOOLS))
    return parse(spec, text)


# prefixes that walk past free text (thinking) a random walk would take long to close
@pytest.mark.parametrize("fmt,thinking,prefix", [
    (HERMES, NO_THINKING, ""), (HERMES, MAY_THINK, ""), (HERMES, MAY_THINK, "<think>\nhmm\n</think>\n\n"),
    (HERMES, THINKING, "hmm</think>\n\n"), (QWEN_XML, NO_THINKING, ""), (QWEN_XML, THINKING, "ok\n</think>\n"),
    (LLAMA3, NO_THINKING, ""), (HARMONY, NO_THINKING, "<|channel|>analysis<|message|>Use fn1.<|end|>"),
])
@pytest.mark.parametrize("parallel", [False, True])
def test_forced_calls_parse_and_fit(tok, fmt, thinking, prefix, parallel):
    grammar = tool_grammar(fmt, TOOLS, choice="required", name=None, parallel=parallel, thinking=thinking, specials={})
    for seed in range(3):
        text, ended = sample(tok, grammar, seed, prefix)
        assert ended, text
        msg = calls_of(fmt, text, thinking_open=thinking == THINKING)
        assert msg.calls and not msg.content.strip(), text
        if not parallel:
            assert len(msg.calls) == 1, text
        if prefix and fmt != HARMONY:
            assert msg.reasoning == "hmm" or msg.reasoning == "ok", text
        for c in msg.calls:
            check(json.loads(c.arguments), schemas(TOOLS)[c.name])


def test_named_function_only(tok):
    grammar = tool_grammar(QWEN_XML, TOOLS, choice="required", name="fn2", parallel=True, thinking=NO_THINKING,
                           specials={})
    for seed in range(3):
        text, _ = sample(tok, grammar, seed)
        assert {c.name for c in calls_of(QWEN_XML, text).calls} == {"fn2"}, text


def test_markers_as_special_tokens(tok):
    """A vocabulary holding <tool_call> as a special token: the grammar asks for that token (here
    the tiny vocabulary's <|im_start|> stands in for it), not for its text."""
    opener = tok.tokens.index("<|im_start|>")
    grammar = tool_grammar(HERMES, TOOLS, choice="required", name="fn0", parallel=False, thinking=NO_THINKING,
                           specials={"<tool_call>": opener})
    m = LLMatcher(grammar_tokenizer(tok, len(tok.tokens)), grammar, log_level=0)
    assert m.consume_tokens(tok.encode("  ", add_special=False))
    assert not m.try_consume_tokens(tok.encode("<tool_call>", add_special=False))
    assert m.consume_token(opener), m.get_error()


@pytest.mark.parametrize("fmt,opening", [(HERMES, "Sure. <tool_call>"), (QWEN_XML, "Sure. <tool_call>\n<function="),
                                         (QWEN_XML, "Sure.\n<function=")])
def test_strict_auto_is_free_until_a_call_opens(tok, fmt, opening):
    tools = [{**t, "function": {**t["function"], "strict": True}} for t in TOOLS]
    grammar = tool_grammar(fmt, tools, choice="auto", name=None, parallel=True, thinking=NO_THINKING, specials={})
    free, ended = sample(tok, grammar, 0, "Any text { at all", n=40)
    assert free.startswith("Any text { at all") and "<tool_call>" not in free
    text, _ = sample(tok, grammar, 1, opening, n=400)
    msg = calls_of(fmt, text)
    assert msg.calls, text
    check(json.loads(msg.calls[0].arguments), schemas(TOOLS)[msg.calls[0].name])


def test_no_grammar_without_a_constraint():
    assert tool_grammar(HERMES, TOOLS, choice="auto", name=None, parallel=True, thinking=NO_THINKING,
                        specials={}) is None
    strict = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "strict": True}}]
    assert tool_grammar(HERMES, strict, choice="none", name=None, parallel=True, thinking=NO_THINKING,
                        specials={}) is None


@pytest.mark.parametrize("fmt,plain,opening", [
    (LLAMA3, "The weather is fine.", "<|python_tag|>"), (LLAMA3, "The weather is fine.", " {"),
    (HARMONY, "<|channel|>final<|message|>Fine { to", "<|channel|>commentary to=functions."),
    (HARMONY, "<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>final<|message|>Fine.",
     "<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant to=functions."),
])
def test_strict_auto_without_an_opening_tag(tok, fmt, plain, opening):
    """Llama 3.x (a reply opening with `{` or holding <|python_tag|> is calls) and harmony (a
    message to=functions.NAME is a call): plain replies are free, calls fit."""
    tools = [{**t, "function": {**t["function"], "strict": True}} for t in TOOLS]
    grammar = tool_grammar(fmt, tools, choice="auto", name=None, parallel=True, thinking=NO_THINKING, specials={})
    text, _ = sample(tok, grammar, 0, plain, n=30)
    assert text.startswith(plain) and not calls_of(fmt, text).calls, text
    for seed in range(3):
        text, ended = sample(tok, grammar, seed, opening)
        msg = calls_of(fmt, text)
        assert ended and msg.calls, text
        for c in msg.calls:
            check(json.loads(c.arguments), schemas(TOOLS)[c.name])


@pytest.mark.parametrize("pattern,ok,bad,extra", [("[A-Z]{3}", "xABCy", "xAby", {"format": "email"}),
                                                  ("^\\d+$", "123", "12a", {})])
def test_xml_string_pattern(tok, pattern, ok, bad, extra):
    """A raw string holds a match of `pattern` anywhere unless ^/$ anchor it, as JSON Schema reads
    it; `format` only annotates it."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"code": {"type": "string", "pattern": pattern, **extra}},
        "required": ["code"]}}}]
    grammar = tool_grammar(QWEN_XML, tools, choice="required", name=None, parallel=False, thinking=NO_THINKING,
                           specials={})
    head = "<tool_call>\n<function=f>\n<parameter=code>\n"
    for value, fits in ((ok, True), (bad, False)):
        m = LLMatcher(grammar_tokenizer(tok, len(tok.tokens)), grammar, log_level=0)
        text = head + value + "\n</parameter>\n</function>\n</tool_call>"
        assert (m.consume_tokens(tok.encode(text, add_special=False)) and m.is_accepting()) == fits, value


def test_xml_string_keywords_it_cannot_hold_are_refused():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"code": {"type": "string", "anyOf": [{"maxLength": 3}]}}}}}]
    with pytest.raises(BadRequest) as err:
        tool_grammar(QWEN_XML, tools, choice="required", name=None, parallel=True, thinking=NO_THINKING, specials={})
    assert err.value.param == "tools[0].function.parameters.properties.code" and "anyOf" in err.value.message


def test_xml_unbounded_string_ends_at_its_close(tok):
    """A raw string value of any length ends at the first </parameter> (text that merely looks
    like its start stays in the value)."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "code": {"type": "string"}, "n": {"type": "integer"}}, "required": ["code", "n"]}}}]
    grammar = tool_grammar(QWEN_XML, tools, choice="required", name=None, parallel=False, thinking=NO_THINKING,
                           specials={})
    text, ended = sample(tok, grammar, 0, "<tool_call>\n<function=f>\n<parameter=code>\nx = '</para'\n</parameter>\n")
    call, = calls_of(QWEN_XML, text).calls
    args = json.loads(call.arguments)
    assert ended and args["code"] == "x = '</para'" and isinstance(args["n"], int), text


REF_TOOLS = [{"type": "function", "function": {"name": "pick", "parameters": {
    "type": "object", "required": ["a", "b"], "additionalProperties": False,
    "properties": {"a": {"type": "integer", "minimum": 3, "maximum": 5}, "b": {"$ref": "#/properties/a"},
                   "c": {"$ref": "#/$defs/flag"}},
    "$defs": {"flag": {"type": "boolean"}}}}}]


@pytest.mark.parametrize("fmt", [HERMES, QWEN_XML, LLAMA3, HARMONY])
def test_references_to_the_parameters_root(tok, fmt):
    """A tool's parameters naming their own root ("#/properties/a") and $defs: the references
    still resolve once the parameters sit inside the call (or, for the XML format, each value's
    schema stands alone)."""
    prefix = "<|channel|>analysis<|message|>ok<|end|>" if fmt == HARMONY else ""
    grammar = tool_grammar(fmt, REF_TOOLS, choice="required", name=None, parallel=False, thinking=NO_THINKING,
                           specials={})
    spec = OutputSpec(TemplateSyntax(fmt, fmt != LLAMA3), "auto", parse_tools=True, tools=schemas(REF_TOOLS))
    for seed in range(4):
        text, ended = sample(tok, grammar, seed, prefix)
        assert ended, text
        (call,) = parse(spec, text).calls
        args = json.loads(call.arguments)
        assert 3 <= args["a"] <= 5 and 3 <= args["b"] <= 5 and isinstance(args["b"], int), text
        assert "c" not in args or isinstance(args["c"], bool), text
