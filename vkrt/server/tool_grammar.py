"""Grammars that hold a chat reply to tool calls, in the format the chat template teaches
(tool_calls.py, glm_tools.py, harmony.py), written in llguidance's Lark dialect with each
function's JSON schema embedded (`%json {...}`):

- tool_choice "required" or a named function: the reply is tool calls and nothing else, of the
  offered functions (or the named one), their arguments fitting each function's `parameters`;
  one call with parallel_tool_calls false, one or more with true (Llama 3.x calls are joined by
  `;`; a harmony call ends generation, so one). Thinking may come first, as llama-server's
  grammars allow: the whole reasoning when the prompt opened `<think>`, an optional `<think>…</think>`
  where the template thinks and the prompt did not close it (as enable_thinking false does), gpt-oss's
  optional analysis message.
- `strict: true` functions with tool_choice "auto": llama-server's lazy grammar. Any text until
  the model opens a call, then the call fits (the strict functions' arguments their schemas, the
  others' any object), then text again. A call opens with `<tool_call>` (Hermes, Qwen; also
  Qwen's bare `<function=`), and a `<tool_call>` written while thinking opens one too; a Llama
  3.x reply is calls when it opens with `{` or holds <|python_tag|>; a harmony message is a
  call when its header names `to=functions.NAME`.
- the generic format (generic_tools.py), for templates of none of these: whenever tools are
  offered, the reply is its JSON, a call or (with tool_choice auto) a response.

Free text and the marker that ends it are one lexeme (or the text cannot hold the marker's first
character): llguidance's lexer takes a lexeme as far as it goes and never splits it back, so text
that may run on through a marker would swallow it.

A marker the vocabulary holds as a special token (Qwen's `<tool_call>` and `<think>`, gpt-oss's
`<|channel|>`) goes in as that token (`<[id]>`), any other as text."""

from __future__ import annotations

import json
from dataclasses import dataclass

import llguidance

from ..engine.grammar_compile import JSON_WHITESPACE, GrammarError, json_schema_grammar, lark_grammar
from ..engine.grammar_limits import check_schema
from .chat_output import HARMONY
from .generic_tools import GENERIC
from .glm_tools import GLM45, KEY_CLOSE, KEY_OPEN, VALUE_CLOSE, VALUE_OPEN
from .harmony import MARKERS as HARMONY_MARKERS
from .reasoning import THINK_CLOSE, THINK_OPEN
from .tool_calls import CALL_CLOSE, CALL_OPEN, FUNCTION_OPEN, HERMES, LLAMA3, PYTHON_TAG, QWEN_XML
from .validation import BadRequest

# the thinking before a forced call: none, an optional <think>…</think>, or the rest of one the prompt opened
NO_THINKING, MAY_THINK, THINKING = "none", "may", "open"

MARKERS = (CALL_OPEN, CALL_CLOSE, THINK_OPEN, THINK_CLOSE, PYTHON_TAG, KEY_OPEN, KEY_CLOSE, VALUE_OPEN,
           VALUE_CLOSE) + HARMONY_MARKERS   # maybe special tokens
PARAM_CLOSE = "</parameter>"
# keywords a raw-text (Qwen XML) string parameter is held to or that only annotate it (`format`
# too: an annotation by JSON Schema's default); others are refused
_RAW_STRING_KEYS = {"type", "minLength", "maxLength", "pattern", "enum", "const", "format", "description", "title",
                    "default", "examples", "$comment", "contentMediaType", "contentEncoding"}


@dataclass(frozen=True)
class Function:
    """A function the request offers."""

    index: int          # in the request's tools
    name: str
    parameters: dict    # the JSON schema of its arguments
    strict: bool


def functions(tools: list | None) -> list[Function]:
    out = []
    for i, t in enumerate(tools or ()):
        f = t["function"]
        params = f.get("parameters") if isinstance(f.get("parameters"), dict) else {"type": "object"}
        out.append(Function(i, f["name"], params, f.get("strict") is True))
    return out


def special_markers(tokens: list[str], types: list[int]) -> dict[str, int]:
    """The MARKERS the vocabulary holds as control or user-defined tokens: marker -> token id."""
    return {t: i for i, (t, ty) in enumerate(zip(tokens, types)) if ty in (3, 4) and t in MARKERS}


def constrains(tools: list | None, choice: str, fmt: str | None = None) -> bool:
    """Whether a reply is held to tool calls: tool_choice required or named, or "auto" with strict
    functions; any tools offered to a template of the generic format (its replies are JSON)."""
    fns = functions(tools)
    return bool(fns) and choice != "none" and (choice != "auto" or fmt == GENERIC or any(f.strict for f in fns))


def tool_grammar(fmt: str, tools: list, *, choice: str, name: str | None, parallel: bool,
                 thinking: str, specials: dict[str, int], response: dict | None = None) -> str | None:
    """The grammar a reply must fit, or None (no tool constraint: tool_choice "none", or "auto"
    without strict functions). choice: "auto" | "none" | "required" (name: the named function).
    response: the request's response_format / json_schema / grammar ({"kind", "source", "field"}),
    which a generic reply's "response" fits."""
    if not constrains(tools, choice, fmt):
        return None
    fns = functions(tools)
    forced = choice == "required"
    if name is not None:
        fns = [f for f in fns if f.name == name]
    held = [f for f in fns if forced or f.strict or fmt == GENERIC]
    for f in held:
        _check_limits(f)
    g = _Writer(specials)
    if fmt == GENERIC:
        text = g.generic(fns, forced, parallel, thinking, _response_schema(response))
    else:
        text = g.forced(fmt, fns, parallel, thinking) if forced else g.lazy(fmt, fns)
    try:
        return lark_grammar(text)
    except GrammarError as exc:
        for f in held:   # name the function whose schema was refused
            _check_schema(f)
        if response is not None:
            _refused_at(response["source"], response["field"])
        raise BadRequest(f"the tools' grammar was refused by the grammar library (llguidance): {exc}",
                         "tools") from None


def _response_schema(response: dict | None):
    """The schema a generic reply's "response" fits (None: any string)."""
    if response is None:
        return None
    if response["kind"] != "json_schema":
        raise BadRequest(f"'{response['field']}': with tools, this chat template's replies are JSON (llama-server's "
                         f"generic tool-call format), whose response a JSON schema may hold, not a grammar",
                         response["field"])
    return response["source"]


def _check_limits(f: Function) -> None:
    """A 400 naming the function whose parameters are past grammar_limits.py's bounds."""
    _refused(f, check_schema, "")


def _check_schema(f: Function) -> None:
    _refused(f, json_schema_grammar, "was refused by the grammar library (llguidance): ")


def _refused(f: Function, check, why: str) -> None:
    """check(f.parameters); its GrammarError (a limit's too) as a 400 naming the function's parameters."""
    field = f"tools[{f.index}].function.parameters"
    try:
        check(f.parameters)
    except GrammarError as exc:
        raise BadRequest(f"'{field}' {why}{exc}", field) from None


def _refused_at(schema, field: str) -> None:
    """A 400 naming `field` where llguidance refuses its JSON schema."""
    try:
        check_schema(schema)
        json_schema_grammar(schema)
    except GrammarError as exc:
        raise BadRequest(f"'{field}' was refused by the grammar library (llguidance): {exc}", field) from None


def _pattern(pattern, field: str) -> str:
    """A JSON Schema `pattern` as a Lark regex over the whole text: a match anywhere in it, as
    JSON Schema (and llguidance's JSON) reads one, unless ^ or $ anchor it."""
    if not isinstance(pattern, str):
        raise BadRequest(f"'{field}.pattern' must be a string (a regular expression)", f"{field}.pattern")
    head = "" if pattern.startswith("^") else "(?s:.*)"
    tail = "" if pattern.endswith("$") and not pattern.endswith("\\$") else "(?s:.*)"
    core = pattern[1 if not head else 0:len(pattern) - (0 if tail else 1)]
    return f"/{head}(?:{llguidance.regex_to_lark(core, 'dw')}){tail}/"   # \d, \w: ASCII, as in JSON Schema


ROOT_DEF = "vkrt_tool_parameters"   # where a parameter's schema finds the root its references name


def _root_refs(schema) -> bool:
    """Whether `schema` holds a $ref to its root or below it, other than into $defs/definitions."""
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str) and _rebasable(ref):
            return True
        return any(_root_refs(v) for v in schema.values())
    if isinstance(schema, list):
        return any(_root_refs(v) for v in schema)
    return False


def _rebasable(ref: str) -> bool:
    return ref.startswith("#") and not ref.startswith(("#/$defs/", "#/definitions/"))


def _rebased(schema, root: str):
    """`schema` with its references to its root ("#", "#/properties/...") pointing at `root`
    instead, where the schema is moved to (references into $defs / definitions stay: those are
    hoisted to the new root)."""
    if isinstance(schema, dict):
        out = {k: _rebased(v, root) for k, v in schema.items()}
        ref = schema.get("$ref")
        if isinstance(ref, str) and _rebasable(ref):
            out["$ref"] = root + ref[1:]
        return out
    if isinstance(schema, list):
        return [_rebased(v, root) for v in schema]
    return schema


def _regex_escape(text: str) -> str:
    return "".join("\\" + c if c in "\\.^$|?*+()[]{}/" else c for c in text)


def _quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


class _Writer:
    """A Lark grammar being written, rule by rule."""

    def __init__(self, specials: dict[str, int]):
        self.specials = specials
        self.rules: list[str] = []
        self.n = 0

    def rule(self, body: str, terminal: bool = False) -> str:
        """A new rule (or terminal) with `body`; its name."""
        self.n += 1
        name = f"T{self.n}" if terminal else f"r{self.n}"
        self.rules.append(f"{name}: {body}")
        return name

    def mark(self, marker: str) -> str:
        """A marker as its special token, or as text."""
        return f"<[{self.specials[marker]}]>" if marker in self.specials else _quote(marker)

    def text_without(self, markers: tuple[str, ...], lo: int = 0, hi: int | None = None) -> str:
        """A terminal of free text (lo to hi characters) that holds none of the text markers
        (special tokens cannot stand in text anyway)."""
        body = f"/(?s:.{{{lo},{'' if hi is None else hi}}})/"
        words = [_regex_escape(m) for m in markers if m not in self.specials]
        if words:
            body += f" & ~/(?s:.*)({'|'.join(words)})(?s:.*)/"
        return self.rule(body, terminal=True)

    def text_until(self, marker: str, avoid: tuple[str, ...] = ()) -> str:
        """Free text up to and with `marker` (and without the `avoid` markers): one terminal
        where the marker is text (llguidance's lexer takes that far better than the text and
        the marker apart), the text and the token where it is a special token."""
        text = self.text_without((marker,) + avoid)
        if marker in self.specials:
            return f"{text} {self.mark(marker)}"
        return self.rule(f"{text} {_quote(marker)}", terminal=True)

    @staticmethod
    def schema(schema) -> str:
        if isinstance(schema, dict):
            schema = {**schema, "x-guidance": {"whitespace_pattern": JSON_WHITESPACE, **schema.get("x-guidance", {})}}
        return f"%json {json.dumps(schema, ensure_ascii=False)}"

    def done(self, start: str) -> str:
        return "\n".join([f"start: {start}"] + self.rules) + "\n"

    # -- one call ----------------------------------------------------------------------------------
    def json_call(self, f: Function, key: str, constrain: bool, extra: dict | None = None) -> str:
        """A call as one JSON object {"name": ..., key: {arguments}} (Hermes: arguments, Llama 3: parameters),
        then the `extra` properties (required)."""
        args = _rebased(f.parameters, f"#/properties/{key}") if constrain else {"type": "object"}
        outer = {"type": "object", "properties": {"name": {"const": f.name}}, "required": ["name", key, *(extra or ())],
                 "additionalProperties": False}
        for defs in ("$defs", "definitions"):   # references are resolved from the root
            if defs in args:
                outer[defs] = args.pop(defs)
        outer["properties"][key] = args
        outer["properties"].update(extra or {})
        return self.rule(self.schema(outer))

    def xml_function(self, f: Function, constrain: bool) -> str:
        """Qwen's `NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n…</function>` (after `<function=`):
        the schema's properties in its order, the required ones always; string values as raw text."""
        props = f.parameters.get("properties") if constrain else None
        if not isinstance(props, dict) or not props:
            key = self.rule(r"/[^>\n]+/", terminal=True)
            params = self.rule(f'("<parameter=" {key} ">\\n" {self.text_until(PARAM_CLOSE)} "\\n")*')
        else:
            params = self.typed_params(f, lambda key: _quote(f"<parameter={key}>\n"),
                                       _quote("\n" + PARAM_CLOSE + "\n"), PARAM_CLOSE)
        return self.rule(f'{_quote(f.name + ">" + chr(10))} {params} "</function>"')

    def glm_function(self, f: Function, constrain: bool) -> str:
        """GLM's `NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n…` (after <tool_call>), as
        xml_function: the schema's properties in its order, string values as raw text."""
        props = f.parameters.get("properties") if constrain else None
        value_close = (f'{self.mark(VALUE_CLOSE)} "\\n"' if VALUE_CLOSE in self.specials
                       else _quote(VALUE_CLOSE + "\n"))
        if not isinstance(props, dict) or not props:
            key = self.rule(r"/[^<\n]+/", terminal=True)
            value = self.text_until(VALUE_CLOSE)
            params = self.rule(f'({self.mark(KEY_OPEN)} {key} {self.mark(KEY_CLOSE)} "\\n" {self.mark(VALUE_OPEN)} '
                               f'{value} "\\n")*')
        else:
            params = self.typed_params(f, lambda key: f'{self.mark(KEY_OPEN)} {_quote(key)} {self.mark(KEY_CLOSE)} '
                                                      f'"\\n" {self.mark(VALUE_OPEN)}', value_close, VALUE_CLOSE)
        return self.rule(f'{_quote(f.name + chr(10))} {params}')

    def typed_params(self, f: Function, head, close: str, stop: str) -> str:
        """The parameters f's schema names, in its order (the required ones always): head(key),
        the value and `close`; string values are raw text without `stop`."""
        props = f.parameters["properties"]
        required = set(f.parameters.get("required") or ())
        defs = {k: f.parameters[k] for k in ("$defs", "definitions") if k in f.parameters}
        if _root_refs(f.parameters):   # a value's schema stands alone: its root is kept beside it
            defs["$defs"] = {**defs.get("$defs", {}), ROOT_DEF: _rebased(f.parameters, f"#/$defs/{ROOT_DEF}")}
            defs["$defs"][ROOT_DEF].pop("$defs", None)
            defs["$defs"][ROOT_DEF].pop("definitions", None)
            props = {k: _rebased(v, f"#/$defs/{ROOT_DEF}") for k, v in props.items()}
        parts = []
        for key, schema in props.items():
            p = self.rule(f"{head(key)} {self.xml_value(f, key, schema, defs, close, stop)}")
            parts.append(p if key in required else p + "?")
        return self.rule(" ".join(parts))

    def xml_value(self, f: Function, key: str, schema, defs: dict, close: str, stop: str) -> str:
        """A parameter's value and the `close` after it (a raw string holds no `stop`)."""
        kind = schema.get("type") if isinstance(schema, dict) else None
        if kind not in ("string", ["string"]):
            return f"{self.schema({**defs, **schema} if isinstance(schema, dict) else schema)} {close}"
        field = f"tools[{f.index}].function.parameters.properties.{key}"
        extra = sorted(set(schema) - _RAW_STRING_KEYS)
        if extra:
            raise BadRequest(f"'{field}' has {', '.join(extra)}: this template writes string arguments as raw "
                             f"text, which vkrt holds only to minLength, maxLength, pattern, enum and const", field)
        words = [schema["const"]] if "const" in schema else schema.get("enum")
        if words is not None:
            if not all(isinstance(w, str) for w in words):
                raise BadRequest(f"'{field}' is a string with non-string enum/const values", field)
            return f"({' | '.join(_quote(w) for w in words)}) {close}"
        text = self.text_without((stop,), int(schema.get("minLength", 0)), schema.get("maxLength"))
        if "pattern" in schema:
            text = self.rule(f"{text} & {_pattern(schema['pattern'], field)}", terminal=True)
        return self.rule(f"{text} {close}", terminal=stop not in self.specials)   # one terminal: see text_until

    def harmony_call(self, f: Function) -> str:
        head = f"{self.mark('<|channel|>')} {_quote(f'commentary to=functions.{f.name} ')} " \
               f"{self.mark('<|constrain|>')} \"json\" {self.mark('<|message|>')}"
        return self.rule(f"{head} {self.schema(f.parameters)}")

    # -- whole replies -----------------------------------------------------------------------------
    def forced(self, fmt: str, fns: list[Function], parallel: bool, thinking: str) -> str:
        if fmt == HARMONY:
            analysis = (f"{self.mark('<|channel|>')} \"analysis\" {self.mark('<|message|>')} "
                        f"{self.text_until('<|end|>', HARMONY_MARKERS)} {self.mark('<|start|>')} \"assistant\"")
            call = self.rule(" | ".join(self.harmony_call(f) for f in fns))
            return self.done(f"({analysis})? {call}")
        if fmt == HERMES:
            body = " | ".join(self.json_call(f, "arguments", True) for f in fns)
            call = self.rule(f'{self.mark(CALL_OPEN)} "\\n" ({body}) "\\n" {self.mark(CALL_CLOSE)}')
        elif fmt == QWEN_XML:
            body = " | ".join(self.xml_function(f, True) for f in fns)
            call = self.rule(f'{self.mark(CALL_OPEN)} "\\n<function=" ({body}) "\\n" {self.mark(CALL_CLOSE)}')
        elif fmt == GLM45:
            body = " | ".join(self.glm_function(f, True) for f in fns)
            call = self.rule(f"{self.mark(CALL_OPEN)} ({body}) {self.mark(CALL_CLOSE)}")
        else:   # LLAMA3
            call = self.rule(" | ".join(self.json_call(f, "parameters", True) for f in fns))
        sep = '";"' if fmt == LLAMA3 else '"\\n"'
        calls = f"{call} ({sep} {call})*" if parallel else call
        return self.done(f"{self.think(thinking if fmt != LLAMA3 else NO_THINKING)} {calls}")

    def think(self, thinking: str) -> str:
        """What may come before a held reply: blanks, after the thinking `thinking` allows."""
        ws = self.rule(r"/[ \t\n]{1,8}/", terminal=True)
        if thinking == NO_THINKING:
            return f"{ws}?"
        body = self.text_until(THINK_CLOSE)
        return f"{body} {ws}?" if thinking == THINKING else f"({self.mark(THINK_OPEN)} {body})? {ws}?"

    def generic(self, fns: list[Function], forced: bool, parallel: bool, thinking: str, response) -> str:
        """llama-server's generic reply: {"tool_call": CALL}, or {"tool_calls": [CALL, ...]} (each
        with an "id") with parallel calls, or (unless forced) {"response": TEXT or `response`'s schema}."""
        ws = self.rule(r"/[ \t\n]{1,20}/", terminal=True)

        def member(key: str, value: str) -> str:
            return self.rule(f'"{{" {ws}? {_quote(chr(34) + key + chr(34))} {ws}? ":" {ws}? {value} {ws}? "}}"')
        id_ = {"id": {"type": "string", "minLength": 4, "maxLength": 32}} if parallel else {}   # the model's; unused
        call = self.rule(" | ".join(self.json_call(f, "arguments", True, id_) for f in fns))
        if parallel:
            reply = member("tool_calls", f'"[" {ws}? {call} ({ws}? "," {ws}? {call})* {ws}? "]"')
        else:
            reply = member("tool_call", call)
        if not forced:
            answer = self.rule(self.schema(response if response is not None else {"type": "string"}))
            reply = f"{reply} | {member('response', answer)}"
        return self.done(f"{self.think(thinking)} ({reply})")

    def lazy(self, fmt: str, fns: list[Function]) -> str:
        """Free text, and calls wherever the model opens one (<tool_call>, or Qwen XML's <function=)."""
        if fmt == HARMONY:
            return self.lazy_harmony(fns)
        if fmt == LLAMA3:
            return self.lazy_llama3(fns)
        triggers = (CALL_OPEN, FUNCTION_OPEN) if fmt == QWEN_XML else (CALL_OPEN,)   # Hermes, GLM: <tool_call>
        text = self.text_without(triggers)
        free = text
        thinks = [self.mark(m) for m in (THINK_OPEN, THINK_CLOSE) if m in self.specials]
        if thinks:   # special tokens are not text: free text may hold these ones
            free = self.rule(f"{text} (({' | '.join(thinks)}) {text})*")
        close = f'"\\n" {self.mark(CALL_CLOSE)}'
        if fmt == HERMES:
            body = " | ".join(self.json_call(f, "arguments", f.strict) for f in fns)
            calls = [f'"\\n" ({body}) {close}']
        elif fmt == GLM45:
            body = " | ".join(self.glm_function(f, f.strict) for f in fns)
            calls = [f"({body}) {self.mark(CALL_CLOSE)}"]
        else:
            body = self.rule(" | ".join(self.xml_function(f, f.strict) for f in fns))
            calls = [f'"\\n<function=" {body} {close}', body]
        tags = []
        for trigger, call in zip(triggers, calls):
            if trigger in self.specials:
                tags.append(self.rule(f"{free} {self.mark(trigger)} {call}"))
            else:
                head = self.rule(f"{text} {_quote(trigger)}", terminal=True)
                opened = self.rule(head) if not thinks else self.rule(f"({free} ({' | '.join(thinks)}))? {head}")
                tags.append(self.rule(f"{opened} {call}"))
        return self.done(f"({' | '.join(tags)})* {free}")

    def lazy_llama3(self, fns: list[Function]) -> str:
        """Llama 3.x: a reply that opens with `{` (after blanks) or holds <|python_tag|> is calls
        (joined by `;`); any other is free text."""
        call = self.rule(" | ".join(self.json_call(f, "parameters", f.strict) for f in fns))
        calls = self.rule(f'{call} (";" {call})*')
        text = r"/(?s:.*)/ & ~/[ \t\r\n]*\{(?s:.*)/"   # text that does not open with a call
        if PYTHON_TAG in self.specials:
            plain = self.rule(text, terminal=True)
            tagged = f"{plain} {self.mark(PYTHON_TAG)}"
        else:
            plain = self.rule(text + f" & ~/(?s:.*){_regex_escape(PYTHON_TAG)}(?s:.*)/", terminal=True)
            tagged = self.rule(f"{plain} {_quote(PYTHON_TAG)}", terminal=True)
        ws = self.rule(r"/[ \t\n]{1,8}/", terminal=True)
        return self.done(f"{plain} | {ws}? {calls} | {tagged} {calls}")

    def lazy_harmony(self, fns: list[Function]) -> str:
        """gpt-oss: messages as the model likes, and a message whose header names a recipient
        `to=functions.NAME` (in its role part or after its channel) is a call of NAME whose
        arguments fit; it ends generation (<|call|>)."""
        ch, msg, start = self.mark("<|channel|>"), self.mark("<|message|>"), self.mark("<|start|>")
        # header text (a channel's name, " json", a recipient) holds no "<", so no lexeme runs on
        # through the marker after it (llguidance's lexer takes the longest, never splitting back)
        no_to = r" & ~/(?s:.*)to=(?s:.*)/"
        head = self.rule(r"/[^<]{0,64}/" + no_to, terminal=True)
        message = f"{head} ({ch} {head})? {msg}"
        earlier = self.rule(f"{message} {self.text_until('<|end|>', HARMONY_MARKERS)} {start} \"assistant\"")
        final = self.rule(f"{message} {self.text_without(HARMONY_MARKERS)}")
        after_name = self.rule(r"/[ \t\n][^<]{0,31}/" + no_to, terminal=True)
        tail = self.rule(r"/[^<]{0,32}/" + no_to, terminal=True)
        names = []
        for f in fns:
            args = self.schema(f.parameters if f.strict else {"type": "object"})
            names.append(self.rule(f"{_quote(f.name)} {after_name}? ({ch} {tail})? ({self.mark('<|constrain|>')} "
                                   f"{tail})? {msg} {args}"))
        to = self.rule(f'(/[^<]{{0,64}}/{no_to}) "to=functions."', terminal=True)
        call = self.rule(f"({head} {ch})? {to} ({' | '.join(names)})")
        return self.done(f"{earlier}* ({final} | {call})")
