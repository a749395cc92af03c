"""The bounds a schema or grammar must keep before the grammar compiler sees it
(vkrt/engine/grammar_limits.py): past them, each is a short GrammarLimitError (a 400 naming
the field in the server), where the compiler overflowed its stack and killed the process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from vkrt.engine.grammar_compile import GrammarError, brief, gbnf_grammar, json_schema_grammar, lark_grammar
from vkrt.engine.grammar_limits import MAX_GRAMMAR_BYTES, MAX_SCHEMA_DEPTH, GrammarLimitError
from vkrt.server.tool_calls import HERMES
from vkrt.server.tool_grammar import NO_THINKING, tool_grammar
from vkrt.server.validation import BadRequest


def ref_chain(n: int) -> dict:
    """A schema whose $ref leads through n definitions, each only a $ref to the next."""
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
    defs[f"d{n}"] = {"type": "integer"}
    return {"$ref": "#/$defs/d0", "$defs": defs}


def nested(levels: int) -> dict:
    schema = {"type": "integer"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def rule_chain(n: int, lark: bool) -> str:
    if lark:
        return "start: r0\n" + "".join(f"r{i}: r{i + 1}\n" for i in range(n)) + f'r{n}: "x"\n'
    return "root ::= r0\n" + "".join(f"r{i} ::= r{i + 1}\n" for i in range(n)) + f'r{n} ::= "x"\n'


def tool_schema() -> dict:
    """A realistic tool's parameters: 15 levels of objects, arrays, anyOf and $defs (a recursive one)."""
    leaf = {"anyOf": [{"type": "string", "maxLength": 200}, {"type": "null"}]}
    for i in range(6):
        leaf = {"type": "object", "properties": {f"level{i}": {"type": "array", "items": leaf, "maxItems": 10},
                                                 "note": {"$ref": "#/$defs/note"}}, "required": [f"level{i}"]}
    return {"type": "object", "properties": {"query": leaf, "tree": {"$ref": "#/$defs/node"}},
            "required": ["query"], "$defs": {
                "note": {"type": "string", "enum": ["a", "b"]},
                "node": {"type": "object", "properties": {
                    "name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}}}


@pytest.mark.parametrize("schema,words", [
    (ref_chain(2500), "with its $refs followed"),   # the compiler died here on an 8 MiB stack
    (ref_chain(MAX_SCHEMA_DEPTH), "with its $refs followed"),
    (ref_chain(12_000), "more than 20000 JSON values"),
    (nested(60), "nests 121 levels deep"),
    ({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}, "loop"),
    ({"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}, "$defs": {"a": {"$ref": "#/$defs/a"}}}, "loop"),
    ({"$ref": "#"}, "loop"),
    ({"anyOf": [{"$ref": "#"}, {"type": "null"}]}, "loop"),
    ({"type": "array", "minItems": 10 ** 12}, "minItems 1000000000000 at '/minItems'"),
    ({"type": "object", "properties": {"s": {"type": "string", "maxLength": 10 ** 7}}}, "at '/properties/s/maxLength'"),
    ({"const": 10 ** 30}, "beyond 64 bits"),
    ({"type": "number", "maximum": float("inf")}, "too large for a double"),
])
def test_schema_past_a_limit_is_refused_in_brief(schema, words):
    with pytest.raises(GrammarLimitError) as exc:
        json_schema_grammar(schema)
    assert words in str(exc.value) and len(str(exc.value)) < 200


def test_schemas_within_the_limits_compile():
    json_schema_grammar(ref_chain(MAX_SCHEMA_DEPTH // 2 - 2))
    json_schema_grammar(nested(40))
    json_schema_grammar(tool_schema())
    json_schema_grammar({"const": {"maxLength": 10 ** 9}, "default": [10 ** 9]})   # data, not bounds
    json_schema_grammar(True)
    with pytest.raises(GrammarError, match="matches no JSON value"):
        json_schema_grammar(False)


@pytest.mark.parametrize("text,words", [
    (rule_chain(1000, lark=False), "chains 1002 rules"),
    (rule_chain(1000, lark=True), "chains 1002 rules"),
    (rule_chain(4000, lark=True), "has 4002 rules"),   # the compiler died at 3,000 chained Lark rules
    ('root ::= "' + "x" * MAX_GRAMMAR_BYTES + '"\n', "bytes long"),
    ("start: %json " + str(nested(60)).replace("'", '"') + "\n", "has a %json schema that nests 121 levels"),
])
def test_grammar_past_a_limit_is_refused(text, words):
    with pytest.raises(GrammarLimitError, match=words):
        gbnf_grammar(text)


def test_grammars_within_the_limits_compile():
    gbnf_grammar(rule_chain(200, lark=False))
    gbnf_grammar(rule_chain(200, lark=True))
    # recursion, comments, strings and classes holding rule-like text
    gbnf_grammar('root ::= item ("," item)* # root ::= x\nitem ::= "[" root "]" | [a-z]+ | "r0 ::= r1"\n')


def test_the_compilers_refusal_is_brief():
    with pytest.raises(GrammarError) as exc:
        json_schema_grammar({"type": "string", "pattern": "(" * 300})
    assert "\n" not in str(exc.value) and len(str(exc.value)) <= 200, str(exc.value)
    assert brief("NoExtensionBias\n<state>\nTokens: []\nParser: {\"rows\": 1}") == "NoExtensionBias"
    assert brief("regex parse error:\n    (?s:.{0,4294967296})\n     ^^^^\nerror: decimal literal invalid") == \
        "regex parse error: decimal literal invalid"


def test_a_tools_parameters_past_a_limit_name_the_function():
    tools = [{"type": "function", "function": {"name": f, "parameters": p}}
             for f, p in (("ok", tool_schema()), ("deep", ref_chain(1000)))]
    assert tool_grammar(HERMES, tools[:1], choice="required", name=None, parallel=False, thinking=NO_THINKING,
                        specials={})
    with pytest.raises(BadRequest) as exc:
        tool_grammar(HERMES, tools, choice="required", name=None, parallel=False, thinking=NO_THINKING, specials={})
    assert exc.value.param == "tools[1].function.parameters" and "$refs followed" in exc.value.message


def test_the_compiler_runs_on_a_deep_stack():
    """A 5,000-rule chain, which the compiler cannot take on the main thread's 8 MiB stack, compiles
    (past the limits: compiled here with lark_grammar, which vkrt keeps for its own grammars)."""
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
            "from test_grammar_limits import rule_chain; from vkrt.engine.grammar_compile import lark_grammar; "
            "lark_grammar(rule_chain(5000, lark=True)); print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", (out.returncode, out.stderr[-500:])
    assert lark_grammar(rule_chain(10, lark=True))
