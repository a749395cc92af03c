"""Hypothesis fuzzing of the running server: request bodies shaped like each endpoint's schema,
with values of wrong types, boundary numbers, odd text (NUL, lone surrogates, control and template
markers), nested junk, JSON schemas and grammars; raw bodies too (truncated, deeply nested, not
UTF-8). No input may get a 5xx, a 4xx is an OpenAI-style error object with a short message free
of tracebacks and grammar-engine state, and the server keeps running with a clean log.
Derandomized: the same examples on every run. Generation stays cheap: the token limits a body
gives are cut to a few tokens before it is sent."""

from __future__ import annotations

import json

import gguf
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from models import TINY

from vkrt.model.synthetic import write_model

from .conftest import SERVER_ARGS
from .serverproc import serving
from .test_server_tools import QWEN3

pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")   # large reprs of examples

CHAT, COMP, LLAMA = "/v1/chat/completions", "/v1/completions", "/completion"
MSG = [{"role": "user", "content": "Hello"}]
VOCAB = 279   # tiny-qwen3's
U32 = gguf.GGUFValueType.UINT32


def fuzz(n: int):
    return settings(max_examples=n, deadline=None, derandomize=True, database=None, print_blob=False,
                    suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def extra_server(tmp_path_factory):
    """tiny-qwen3 with FIM tokens and a Qwen3-style template (tool calls, thinking), serving
    embeddings: /infill, /v1/embeddings, /embedding and constrained tool calls answer."""
    spec = TINY["tiny-qwen3"]
    extra = {"tokenizer.ggml.fim_pre_token_id": (100, U32), "tokenizer.ggml.fim_suf_token_id": (101, U32),
             "tokenizer.ggml.fim_mid_token_id": (102, U32), "tokenizer.ggml.fim_sep_token_id": (103, U32),
             "tokenizer.ggml.fim_rep_token_id": (104, U32)}
    path = tmp_path_factory.mktemp("fuzz") / "tiny-fuzz.gguf"
    write_model(path, type(spec)(**{**spec.__dict__, "extra": extra, "chat_template": QWEN3}))
    yield from serving(str(path), *SERVER_ARGS, "--embeddings", "--pooling", "mean")


# -- sending -----------------------------------------------------------------------------------------
_RAW = "@@raw:"   # a string "@@raw:TEXT" is written into the JSON text as TEXT (numbers JSON cannot carry)


def encode(body, ascii_only: bool = True) -> bytes:
    """The body's JSON text; lone surrogates become \\ud800 escapes (or, not ascii_only, invalid UTF-8)."""
    text = json.dumps(body, ensure_ascii=ascii_only)
    while (i := text.find('"' + _RAW)) >= 0:
        j = text.index('"', i + 1)
        text = text[:i] + text[i + 1 + len(_RAW):j] + text[j + 1:]
    return text.encode("utf-8", "surrogatepass")


NOT_SUPPORTED = ("/v1/embeddings", "/embedding")   # 501 on a server without --embeddings


def check(srv, path: str, raw: bytes) -> tuple[int, bytes]:
    status, out = srv.request("POST", path, raw, timeout=120)
    assert status < 500 or (status == 501 and path in NOT_SUPPORTED), f"{path} {raw[:3000]!r} -> {status} {out[:2000]!r}"
    if status >= 400:
        err = json.loads(out)["error"]
        assert isinstance(err, dict) and err["code"] == status and isinstance(err["type"], str), out
        message = err["message"]
        assert isinstance(message, str) and "Traceback" not in message and "<state>" not in message, message
        assert len(message) < 1000, f"{path} {raw[:500]!r}: a message of {len(message)} characters: {message[:300]}"
    assert srv.proc.poll() is None, srv.log[-5000:]
    if currently_in_test_context():
        event(f"status {status}")   # --hypothesis-show-statistics: how many got through
    return status, out


def send(srv, path: str, body, ascii_only: bool = True) -> tuple[int, bytes]:
    return check(srv, path, encode(body, ascii_only))


def _int_like(v) -> bool:
    return (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer())


def bounded(body, api: str, most: int = 2):
    """The body with the token limit that applies cut to `most` (or set where none is given);
    values the server refuses are left as they are."""
    if not isinstance(body, dict):
        return body
    names = {"chat": ("max_tokens", "max_completion_tokens"), "llama": ("n_predict", "max_tokens")}.get(
        api, ("max_tokens",))
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        if _int_like(value) and (value > most or (value == -1 and api == "llama")) and abs(value) <= 10 ** 6:
            body[name] = most
        return body
    body[names[0]] = most
    return body


# -- values --------------------------------------------------------------------------------------------
BOUNDARY_INTS = st.sampled_from([0, 1, -1, 2, 255, 256, 257, 278, 279, 2 ** 31 - 1, 2 ** 31, -2 ** 31, 2 ** 53 + 1,
                                 2 ** 63 - 1, 2 ** 63, -2 ** 63 - 1, 2 ** 64, 10 ** 30, -10 ** 30])
ODD_FLOATS = st.sampled_from([0.5, -0.0, 0.0, 1e308, -1e308, 1e-320, 5e-324, 1.5, 2.0, 100.0, 100.0000001, -100.5,
                              1e20, 0.1, 3.0, -2.0, 9.999999e15])
RAW_NUMBERS = st.sampled_from([_RAW + t for t in ("1e400", "-1e400", "1e-400", "-0", "0e0", "1" * 400, "1E+2",
                                                  "123456789012345678901234567890.5")])
ODD_STRINGS = ["", " ", "\x00", "\ud83d\ude00", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>",
               "</tool_call>", "{{ messages }}", "{% for %}", "\u202e", "é", "🙂", "x" * 600, "\n" * 40, "%json {}",
               "[" * 100, "\\u0000", "null", "<|endoftext|>", "get_weather", "0", "-1", "99999999999999999999",
               '{"name": "get_weather", "arguments": {}}', "<function=f>", "\r\n\t", "hi hi hi hi hi hi"]
SAFE_TEXT = st.one_of(st.text(max_size=12), st.sampled_from(ODD_STRINGS))   # no lone surrogates
_CHARS = st.one_of(st.characters(), st.characters(categories=["Cs"]), st.sampled_from("\x00\n\t\\\"{}<>|/%#"))
TEXT = st.one_of(SAFE_TEXT, st.text(_CHARS, max_size=12), st.sampled_from(["\ud800", "a\udfffb"]))
SCALAR = st.one_of(st.none(), st.booleans(), BOUNDARY_INTS, st.integers(-300, 600), ODD_FLOATS,
                   st.floats(allow_nan=False, allow_infinity=False), TEXT, RAW_NUMBERS)
JSON = st.recursive(SCALAR, lambda c: st.lists(c, max_size=4) | st.dictionaries(TEXT, c, max_size=4), max_leaves=10)
ANY = st.one_of(SCALAR, JSON)


def mostly(good, bad=ANY, odds: int = 6):
    """`good` about (odds - 1) times in odds, else `bad` (shrinks towards good)."""
    return st.integers(0, odds - 1).flatmap(lambda i: bad if i == odds - 1 else good)


def floats(lo, hi):
    return st.one_of(st.floats(lo, hi), st.sampled_from([lo, hi]))


def unbounded(lo, hi):
    return st.one_of(floats(lo, hi), st.sampled_from([1e308, 3e38, 1e-320, 5e-324]))


PROB = floats(0.0, 1.0)
TOKEN_IDS = st.lists(mostly(st.integers(0, VOCAB - 1), BOUNDARY_INTS, odds=20), min_size=1, max_size=12)
STOP = st.one_of(SAFE_TEXT, st.lists(SAFE_TEXT, max_size=4))
BANS = st.sampled_from([{str(i): False for i in range(VOCAB)}, {str(i): False for i in range(1, VOCAB)},
                        [[i, False] for i in range(VOCAB)], {str(i): -100 for i in range(VOCAB)}])
LOGIT_BIAS = st.one_of(BANS,
    st.dictionaries(mostly(st.integers(0, VOCAB - 1).map(str), st.sampled_from(
        ["-1", "279", " 2", "+3", "1_0", "0x10", "١", "²", "9" * 30, "-0", "1.0", "1e3", "\x00", "", "abc"])),
        mostly(st.one_of(floats(-100.0, 100.0), st.just(False), st.integers(-100, 100)), SCALAR), max_size=4),
    st.lists(st.tuples(st.integers(0, VOCAB - 1), st.one_of(floats(-100.0, 100.0), st.just(False))).map(list),
             max_size=4))
SAMPLERS = st.one_of(
    st.lists(st.sampled_from(["top_k", "top-p", "typ_p", "min_p", "xtc", "temperature", "temp", "top_n_sigma",
                              "nucleus", "TOP_K", " top_k "]), max_size=5, unique=True).map(lambda s: ["penalties"] + s),
    st.text("kypmxts", max_size=6), st.lists(st.sampled_from(["dry", "infill", "bogus", ""]), max_size=2))
SAMPLING = {
    "temperature": unbounded(0.0, 2.0), "top_k": st.integers(-1, 100),
    "top_p": PROB, "min_p": PROB, "typical_p": PROB, "repeat_penalty": unbounded(1e-6, 3.0),
    "repeat_last_n": st.integers(0, 300), "frequency_penalty": floats(-2.0, 2.0), "presence_penalty": floats(-2.0, 2.0),
    "logit_bias": LOGIT_BIAS, "top_n_sigma": unbounded(-1.0, 5.0), "xtc_probability": PROB, "xtc_threshold": PROB,
    "dynatemp_range": unbounded(0.0, 2.0), "dynatemp_exponent": unbounded(0.0, 3.0), "min_keep": st.integers(0, 10),
    "dry_multiplier": unbounded(0.0, 2.0), "dry_base": unbounded(0.0, 3.0), "dry_allowed_length": st.integers(0, 3),
    "dry_penalty_last_n": st.integers(-1, 300), "mirostat": st.integers(0, 2), "mirostat_tau": unbounded(0.0, 10.0),
    "mirostat_eta": unbounded(0.0, 1.0), "seed": st.one_of(st.integers(-1, 2 ** 64 - 1), BOUNDARY_INTS), "samplers": SAMPLERS,
    "dry_sequence_breakers": st.lists(SAFE_TEXT, max_size=3),
}

# -- JSON schemas and grammars -------------------------------------------------------------------------
REGEX = st.one_of(st.sampled_from([
    "a+", "(", "[", "\\", "(a|b)*c", "a{2,5}", "a{1000000}", "a{5,2}", "(?=a)", "\\p{L}+", "^$", "(a*)*b", ".*" * 20,
    "[z-a]", "\\d{0,99999999999}", "(?P<x>a)", "a**", "\\1", "[^\\x00-\\x{10FFFF}]", "\\u{D800}", "(?i)abc",
    "x{4294967296}", "((((((((((a))))))))))", "\\b", "$^", "a|" * 30 + "b"]), TEXT)
REFS = st.sampled_from(["#", "#/$defs/a", "#/$defs/b", "#/properties/x", "#/$defs/a/properties/b", "http://x.y/s",
                        "#/definitions/a", "#/$defs/%61", "#//", "#/items", "#/anyOf/0", "a", "", "#/$defs/a~1b",
                        "#/$defs/"])
TYPES = st.sampled_from(["string", "integer", "number", "boolean", "null", "object", "array", "objectx", ""])
COUNT = mostly(st.integers(0, 6), st.one_of(st.integers(-2, -1), BOUNDARY_INTS, ODD_FLOATS, RAW_NUMBERS))
SCHEMA_LEAF = st.fixed_dictionaries({}, optional={
    "type": mostly(st.one_of(TYPES, st.lists(TYPES, max_size=3))), "minLength": COUNT, "maxLength": COUNT,
    "pattern": REGEX, "format": st.sampled_from(["date-time", "email", "uuid", "uri", "date", "time", "bogus", ""]),
    "minimum": mostly(floats(-5.0, 5.0)), "maximum": mostly(floats(-5.0, 5.0)), "exclusiveMinimum": SCALAR,
    "multipleOf": st.one_of(floats(-1.0, 3.0), ODD_FLOATS), "enum": st.lists(JSON, max_size=3), "const": JSON,
    "$ref": REFS, "minItems": COUNT, "maxItems": COUNT, "minProperties": COUNT, "maxProperties": COUNT,
    "uniqueItems": st.booleans(), "default": JSON})
SCHEMA = st.recursive(st.one_of(SCHEMA_LEAF, st.booleans()), lambda c: st.fixed_dictionaries({}, optional={
    "type": TYPES, "properties": st.dictionaries(st.sampled_from(["x", "a", "b", ""]) | TEXT, c, max_size=3),
    "items": c, "prefixItems": st.lists(c, max_size=3), "anyOf": st.lists(c, max_size=3),
    "allOf": st.lists(c, max_size=3), "oneOf": st.lists(c, max_size=3), "not": c, "additionalProperties": c,
    "required": mostly(st.lists(TEXT, max_size=3)), "$defs": st.dictionaries(st.sampled_from(["a", "b", "a/b"]), c,
                                                                             max_size=2),
    "definitions": st.dictionaries(st.sampled_from(["a", "b"]), c, max_size=2), "if": c, "then": c, "else": c,
    "patternProperties": st.dictionaries(REGEX, c, max_size=2), "$ref": REFS, "minItems": COUNT, "maxItems": COUNT,
    "dependentRequired": JSON, "propertyNames": c, "contains": c}), max_leaves=8)
GBNF_PIECES = st.sampled_from([
    "root ::= ", "start: ", "x ::= ", "x: ", '"a"', "'a'", '"\\u{110000}"', '"\\x"', "[a-z]", "[^]", "[z-a]", "x", "root",
    " | ", "*", "+", "?", "{0,1000000000}", "{5,2}", "{3}", "(", ")", "\n", "<[999999]>", "<[1]>", "<|im_end|>",
    "%json {\"type\": \"object\"}", "%json {\"$ref\": \"#\"}", "%json {\"minLength\": 1e400}", "%json [", "%llguidance {}",
    "/a+/", "/(/", "%ignore /[ ]+/", "# comment", ".", "\\", "::=", "%regex {\"substring_words\": \"a b\"}",
    "!x", "%import common.WS", "X.5: \"a\"", "lazy", "max_tokens=3", "y ::= x y"])
GRAMMARS = st.one_of(st.lists(GBNF_PIECES, max_size=10).map("".join), TEXT, st.sampled_from([
    'root ::= "a"', "root ::= root", 'root ::= ("a" | root)*', "root ::= x\nx ::= root", 'start: "a"',
    'root ::= %json {"type": "object"}', 'start: %json {"type": "integer", "minimum": 1e400}',
    "root ::= [a-z]{0,4294967296}", 'root ::= "' + "a" * 2000 + '"', "\n".join(f"r{i} ::= r{i + 1}" for i in range(300)),
    'start: <[999999]>', "start: /\\p{Zzzz}/", "start: %json " + "[" * 300, 'root ::= [a-z]+ ("," [a-z]+)*']))
ROOT_SCHEMA = mostly(SCHEMA, st.one_of(st.just(False), st.just(True), TEXT.map(json.dumps), ANY), odds=4)
RESPONSE_FORMAT = st.fixed_dictionaries(
    {"type": mostly(st.sampled_from(["text", "json_object", "json_schema"]))},
    optional={"json_schema": mostly(st.fixed_dictionaries({}, optional={"name": SAFE_TEXT, "schema": ROOT_SCHEMA,
                                                                          "strict": st.booleans()})),
              "schema": ROOT_SCHEMA})
GRAMMAR_FIELDS = {"json_schema": ROOT_SCHEMA, "grammar": GRAMMARS, "response_format": RESPONSE_FORMAT}
COMMON = {"n": st.integers(1, 4), "stream": st.booleans(),
          "stream_options": st.fixed_dictionaries({}, optional={"include_usage": mostly(st.booleans())}),
          "stop": STOP, "ignore_eos": st.booleans(), "cache_prompt": st.booleans(), "return_tokens": st.booleans(),
          "model": SAFE_TEXT, "echo": st.just(False), "suffix": st.none(), "max_tokens": st.integers(0, 2),
          **SAMPLING, **GRAMMAR_FIELDS}


@st.composite
def bodies(draw, required: dict, optional: dict):
    """Schema-shaped bodies: the required fields and some optional ones with good values, then
    up to three fields (or unknown keys) given odd values or left out."""
    fields = {**optional, **required}
    body = {name: draw(s) for name, s in required.items()}
    for name in draw(st.lists(st.sampled_from(sorted(optional)), max_size=6, unique=True)) if optional else ():
        body[name] = draw(optional[name])
    for name in draw(st.lists(st.sampled_from(sorted(fields) + ["?"]), max_size=3, unique=True)):
        how = draw(st.sampled_from(["odd", "odd", "drop", "null"]))
        if name == "?":
            body[draw(TEXT)] = draw(JSON)
        elif how == "drop":
            body.pop(name, None)
        else:
            body[name] = None if how == "null" else draw(st.one_of(ANY, BOUNDARY_INTS, ODD_FLOATS, RAW_NUMBERS))
    return body


# -- chat ----------------------------------------------------------------------------------------------------
ARGUMENTS = mostly(st.dictionaries(SAFE_TEXT, JSON, max_size=3).map(json.dumps), st.one_of(JSON.map(json.dumps), JSON,
                   st.sampled_from(["", "{", "[" * 3000 + "]" * 3000, '{"a": ' * 1500 + "1" + "}" * 1500, "1e400",
                                    '"\\ud800"', "null", "{}", '{"a": 1e400}', '{"a": NaN}']))).filter(
    lambda a: len(a) < 20000 if isinstance(a, str) else True)
TOOL_CALL = mostly(st.fixed_dictionaries(
    {"function": mostly(st.fixed_dictionaries({"name": st.sampled_from(["get_weather", "f", ""])},
                                              optional={"arguments": ARGUMENTS}))},
    optional={"id": SAFE_TEXT, "type": st.just("function")}), odds=10)
PART = mostly(st.fixed_dictionaries({"type": st.just("text"), "text": SAFE_TEXT}), odds=10)
MESSAGE = mostly(st.fixed_dictionaries(
    {"role": mostly(st.sampled_from(["user", "assistant", "system", "tool"]), st.sampled_from(["", "developer", 5])),
     "content": mostly(st.one_of(SAFE_TEXT, st.lists(PART, max_size=3)), st.one_of(st.none(), TEXT, ANY))},
    optional={"tool_calls": st.lists(TOOL_CALL, max_size=2), "tool_call_id": mostly(SAFE_TEXT),
              "name": mostly(SAFE_TEXT), "reasoning_content": mostly(SAFE_TEXT)}), odds=12)
PARAMETERS = st.one_of(st.just({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
                       st.just({"type": "object"}), SCHEMA)
TOOL = mostly(st.fixed_dictionaries(
    {"type": st.just("function"), "function": mostly(st.fixed_dictionaries(
        {"name": mostly(st.sampled_from(["get_weather", "f"]), TEXT)},
        optional={"description": SAFE_TEXT, "parameters": PARAMETERS, "strict": mostly(st.booleans())}))}), odds=10)
TOOL_CHOICE = st.one_of(st.sampled_from(["auto", "none", "required"]), st.fixed_dictionaries(
    {"type": st.just("function"), "function": mostly(st.fixed_dictionaries(
        {"name": mostly(st.sampled_from(["get_weather", "f"]), TEXT)}))}))
CHAT_FIELDS = {
    **COMMON, "max_completion_tokens": st.integers(0, 2), "logprobs": st.booleans(),
    "top_logprobs": st.integers(0, 20), "tools": st.lists(TOOL, max_size=3),
    "tool_choice": TOOL_CHOICE, "parallel_tool_calls": st.booleans(),
    "reasoning_format": st.sampled_from(["none", "deepseek", "auto", "deepseek-legacy"]),
    "chat_template_kwargs": st.dictionaries(st.one_of(st.sampled_from(
        ["enable_thinking", "add_generation_prompt", "messages", "tools", "bos_token", "raise_exception", "range",
         "namespace", "loop", "self"]), SAFE_TEXT), JSON, max_size=3),
}
CHAT_BODY = bodies({"messages": st.lists(MESSAGE, min_size=1, max_size=4)}, CHAT_FIELDS)
TOOL_CHAT_BODY = bodies({"messages": st.lists(MESSAGE, min_size=1, max_size=4),
                         "tools": st.lists(TOOL, min_size=1, max_size=3)},
                        {k: v for k, v in CHAT_FIELDS.items() if k != "tools"})

# -- completions, /completion, /infill ---------------------------------------------------------------------
PROMPT = mostly(st.one_of(SAFE_TEXT.filter(bool), TOKEN_IDS), st.one_of(
    st.lists(SAFE_TEXT, max_size=3), st.lists(TOKEN_IDS, max_size=2), st.lists(st.one_of(TEXT, TOKEN_IDS), max_size=3),
    TEXT, ANY))
COMP_BODY = bodies({"prompt": PROMPT}, {**COMMON, "logprobs": st.integers(0, 20)})
LLAMA_FIELDS = {**COMMON, "n": st.just(1), "n_predict": st.integers(-1, 2), "n_probs": st.integers(0, 20),
                "id_slot": st.integers(-1, 3), "t_max_predict_ms": st.integers(0, 1000)}
LLAMA_BODY = bodies({"prompt": PROMPT}, LLAMA_FIELDS)
CHUNK = mostly(st.fixed_dictionaries({"text": SAFE_TEXT}, optional={"filename": SAFE_TEXT}), odds=10)
INFILL_BODY = bodies({"input_prefix": st.one_of(SAFE_TEXT, TOKEN_IDS), "input_suffix": st.one_of(SAFE_TEXT, TOKEN_IDS)},
                     {**LLAMA_FIELDS, "prompt": SAFE_TEXT, "input_extra": st.lists(CHUNK, max_size=3)})

# -- tokens, embeddings ---------------------------------------------------------------------------------
TOKENIZE_BODY = bodies({"content": SAFE_TEXT}, {"add_special": st.booleans(), "with_pieces": st.booleans()})
DETOKENIZE_BODY = bodies({"tokens": TOKEN_IDS}, {})
EMBED_INPUT = st.one_of(SAFE_TEXT.filter(bool), TOKEN_IDS,
                        st.lists(st.one_of(SAFE_TEXT.filter(bool), TOKEN_IDS), min_size=1, max_size=4))
EMBED_FIELDS = {"encoding_format": st.sampled_from(["float", "base64"]), "dimensions": st.just(64),
                "embd_normalize": st.integers(-1, 3), "model": SAFE_TEXT}
EMBED_BODY = st.one_of(bodies({"input": EMBED_INPUT}, EMBED_FIELDS), bodies({"content": EMBED_INPUT}, EMBED_FIELDS))


# -- the tests -----------------------------------------------------------------------------------------
@fuzz(300)
@given(body=CHAT_BODY, ascii_only=st.sampled_from([True, True, True, False]))
@example(body={"messages": MSG, "response_format": {"type": "json_schema", "json_schema": {"name": "x",
                                                                                          "schema": False}}},
         ascii_only=True)
def test_chat(server, body, ascii_only):
    send(server, CHAT, bounded(body, "chat"), ascii_only)


@fuzz(250)
@given(body=TOOL_CHAT_BODY)
def test_chat_with_tools(extra_server, body):
    send(extra_server, CHAT, bounded(body, "chat", most=6))


@fuzz(100)
@given(body=CHAT_BODY)
def test_apply_template(server, body):
    send(server, "/apply-template", body)


@fuzz(250)
@given(body=COMP_BODY)
def test_completions(server, body):
    send(server, COMP, bounded(body, "completions"))


@fuzz(250)
@given(body=LLAMA_BODY)
def test_llama_completion(server, body):
    send(server, LLAMA, bounded(body, "llama"))


@fuzz(300)
@given(schema=ROOT_SCHEMA, where=st.sampled_from(["json_schema", "response_format", "grammar"]), gbnf=GRAMMARS)
def test_grammars(server, schema, where, gbnf):
    body = {"prompt": "Hello", "max_tokens": 2}
    if where == "json_schema":
        body["json_schema"] = schema
    elif where == "response_format":
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    else:
        body["grammar"] = gbnf
    send(server, COMP, body)


@fuzz(150)
@given(body=INFILL_BODY)
def test_infill(extra_server, body):
    send(extra_server, "/infill", bounded(body, "llama"))


@fuzz(100)
@given(body=TOKENIZE_BODY)
def test_tokenize(server, body):
    send(server, "/tokenize", body)


@fuzz(50)
@given(body=DETOKENIZE_BODY)
def test_detokenize(server, body):
    send(server, "/detokenize", body)


@fuzz(150)
@given(body=EMBED_BODY, oai=st.booleans())
def test_embeddings(extra_server, body, oai):
    send(extra_server, "/v1/embeddings" if oai else "/embedding", body)


@fuzz(15)
@given(body=EMBED_BODY)
def test_embeddings_disabled(server, body):
    status, _ = send(server, "/v1/embeddings", body)
    assert status == 501


PATHS = st.sampled_from([CHAT, COMP, LLAMA, "/tokenize", "/detokenize", "/apply-template", "/infill",
                         "/v1/embeddings", "/embedding"])
RAW_BODY = st.one_of(
    st.binary(max_size=64),
    st.builds(lambda b, n: encode(b)[:n], st.one_of(CHAT_BODY, COMP_BODY), st.integers(0, 200)),
    st.builds(lambda o, c, n: (o * n + c * n).encode(), st.sampled_from(["[", "{\"a\":"]), st.sampled_from(["]", "}"]),
              st.sampled_from([1, 100, 999, 1001, 20000])),
    st.builds(lambda b, junk: encode(b)[:-1] + junk, st.one_of(CHAT_BODY, COMP_BODY),
              st.sampled_from([b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\x00", b" NaN", b"}}", b",}", b"\x80"])),
    st.sampled_from([b"", b"null", b"[]", b"1e400", b'"x"', b"{", b"\xef\xbb\xbf{}", b'{"prompt": "a", "prompt": 1}',
                     b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 1e400}',
                     b'{"prompt": "x", "max_tokens": 1, "temperature": -Infinity}']))


@fuzz(200)
@given(path=PATHS, raw=RAW_BODY)
def test_raw_bodies(server, extra_server, path, raw):
    check(server, path, raw)
    check(extra_server, path, raw)


# what the fuzzing found: each was a 500 (or stopped the scheduler) and is a 400 naming the field
ALL_BANNED = {str(i): False for i in range(VOCAB)}
REGRESSIONS = [
    # a grammar with no way to start (grammar_compile.check_starts) or a rule that never ends
    # (grammar_limits._endless_rule): the first token, or the one reaching the rule, had none allowed
    (COMP, {"prompt": "hi", "max_tokens": 4, "grammar": "root ::= root"}, "grammar", "never ends"),
    (COMP, {"prompt": "hi", "max_tokens": 4, "grammar": "start: /[^\\x00-\\x{10FFFF}]/"}, "grammar",
     "no first character"),
    (COMP, {"prompt": "hi", "max_tokens": 4, "grammar": 'root ::= "a" x\nx ::= x'}, "grammar", "never ends"),
    (COMP, {"prompt": "hi", "max_tokens": 4, "grammar": 'root ::= "a" x\nx ::= "b" x'}, "grammar", "never ends"),
    (LLAMA, {"prompt": "hi", "n_predict": 4, "grammar": 'start: "a" | "b" x\nx: "c" x'}, "grammar", "'x'"),
    # an integer of hundreds of digits where a number goes: float() overflowed (validation.get_float)
    (COMP, {"prompt": "hi", "max_tokens": 1, "top_p": _RAW + "1" * 400}, "top_p", "an integer of 400 digits"),
    (LLAMA, {"prompt": "hi", "n_predict": 1, "dry_base": _RAW + "-" + "9" * 310}, "dry_base", "311 digits"),
    # every token banned: probabilities of NaN (validation.get_logit_bias)
    (COMP, {"prompt": "hi", "max_tokens": 2, "logit_bias": ALL_BANNED}, "logit_bias", "bans every token"),
    (CHAT, {"messages": MSG, "max_tokens": 2, "logit_bias": [[i, False] for i in range(VOCAB)]}, "logit_bias",
     "bans every token"),
]


@pytest.mark.parametrize("path,body,param,words", REGRESSIONS, ids=[f"{i}" for i in range(len(REGRESSIONS))])
def test_found_by_fuzzing(server, path, body, param, words):
    status, out = send(server, path, body)
    err = json.loads(out)["error"]
    assert status == 400 and err.get("param") == param and words in err["message"], out


def test_near_limits_still_served(server):
    """The bounds those fixes added leave their neighbours served; samplers given extreme values
    work (they overflowed: DRY's base^length past float32 in the scheduler thread, which stopped it;
    mirostat's logits over a temperature of 1e-320 or 0)."""
    for body in ({"prompt": "hi hi hi hi", "max_tokens": 3, "dry_multiplier": 1e308, "dry_base": 1e38,
                  "dry_allowed_length": 0},
                 {"prompt": "hi hi hi hi hi hi", "max_tokens": 3, "dry_multiplier": 1e308, "dry_base": 1e308,
                  "dry_allowed_length": 0},
                 {"prompt": "hi", "max_tokens": 2, "mirostat": 2, "temperature": 1e-30},
                 {"prompt": "hi", "max_tokens": 2, "mirostat": 2, "temperature": 1e-320},
                 {"prompt": "hi", "max_tokens": 2, "mirostat": 1, "temperature": 0},
                 {"prompt": "hi", "max_tokens": 2, "mirostat": 1, "temperature": 0, "samplers": ["top_k"]},
                 {"prompt": "hi", "max_tokens": 2, "logit_bias": {str(i): False for i in range(1, VOCAB)}},
                 {"prompt": "hi", "max_tokens": 2, "grammar": 'root ::= "a" x?\nx ::= "b" x?'},
                 {"prompt": "hi", "max_tokens": 2, "grammar": 'root ::= ("a" | root)*'}):
        status, out = send(server, COMP, body)
        assert status == 200, (body, out)


def test_logs_are_clean(server, extra_server):
    """After the fuzzing: no traceback (a 500 logs one) and no failed request in either log."""
    for srv in (server, extra_server):
        assert srv.proc.poll() is None
        assert srv.get("/health")[0] == 200
        assert "Traceback" not in srv.log, srv.log[-20000:]
        assert " failed" not in srv.log, srv.log[-20000:]
