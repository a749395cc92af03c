"""Request bodies of the generation endpoints -> GenRequest, validated field by field."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..engine.dry import DEFAULT_BREAKERS
from ..engine.sampler import SamplingParams
from ..engine.sampler_order import parse_order
from ..errors import ConfigError
from .grammar_source import JSON_OBJECT, GrammarSource
from .image_parts import IMAGE_PARTS, image_part, multimodal_prompt
from .reasoning import REASONING_FORMATS
from .reasoning_budget import EFFORT_BUDGET
from .request_fields import check_fields
from .validation import (BadRequest, get_bool, get_dict, get_float, get_int, get_logit_bias, get_stop, get_str,
                         get_token_ids, reject_truthy, _short)

CHAT, COMPLETIONS, LLAMA = "chat", "completions", "llama"


@dataclass
class Limits:
    """What requests are checked against: a slot's context (-c over --parallel) and the vocabulary."""

    n_ctx: int
    vocab: int
    speculative: bool = False   # the server drafts (--spec-type / -md): requests may tune it
    n_slots: int = 1            # --parallel: the slots a request's id_slot may name


@dataclass
class GenRequest:
    api: str                          # CHAT (/v1/chat/completions), COMPLETIONS (/v1/completions), LLAMA (/completion)
    stream: bool = False
    max_tokens: int | None = None     # None: until end of generation or the context
    params: SamplingParams = field(default_factory=SamplingParams)
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    cache_prompt: bool = True
    include_usage: bool = False
    return_tokens: bool = False
    timings_per_token: bool = False   # llama-server's: each streamed chunk carries the timings so far
    id_slot: int = -1                 # llama-server's: the slot to run on (-1: the scheduler's choice)
    model: str | None = None
    prompt: str | list[int] | None = None
    messages: list[dict] | None = None
    tools: list | None = None
    tool_choice: str = "auto"         # "auto" | "none" | "required" (a named function is required)
    tool_name: str | None = None      # the named function of tool_choice {"type": "function", ...}
    parallel_tool_calls: bool = True
    reasoning_format: str | None = None   # None: the server's --reasoning-format
    reasoning_budget: int | None = None   # thinking tokens: None the server's --reasoning-budget, 0 off, N>0 at most N
    budget_message: str | None = None     # forced before a budget's close (None: --reasoning-budget-message)
    template_kwargs: dict = field(default_factory=dict)
    logprobs: int | None = None       # None: no log-probabilities; n: the chosen token's and the n best
    dry_sequence_breakers: tuple = DEFAULT_BREAKERS
    n: int = 1                        # choices (OpenAI's n), one job each
    draft: tuple | None = None        # llama-server's speculative.n_max / n_min / p_min (None each: the server's)
    grammar_source: GrammarSource | None = None   # what the output must fit (response_format, json_schema, grammar)
    grammar: str | None = None        # its llguidance grammar, or the tool calls', once compiled (routes.py)
    images: list = field(default_factory=list)   # (field, encoded image) a media marker stands for (image_parts.py)


MAX_LOGPROBS = 20   # the most likely tokens a step reports at most (OpenAI's top_logprobs limit)
MAX_CHOICES = 16    # OpenAI's n: choices a request (each takes a slot while it runs)


def _sampling(body: dict, vocab: int) -> SamplingParams:
    d = SamplingParams()
    order = d.order
    if body.get("samplers") is not None:
        try:
            order = parse_order(body["samplers"], "'samplers'")
        except ConfigError as exc:
            raise BadRequest(str(exc), "samplers") from None
    seed = get_int(body, "seed", -1, lo=-1, hi=2 ** 64 - 1)
    return SamplingParams(
        temperature=get_float(body, "temperature", d.temperature, lo=0.0),
        top_k=get_int(body, "top_k", d.top_k),   # <= 0: no top-k cut
        top_p=get_float(body, "top_p", d.top_p, lo=0.0, hi=1.0),
        min_p=get_float(body, "min_p", d.min_p, lo=0.0, hi=1.0),
        typical_p=get_float(body, "typical_p", d.typical_p, lo=0.0, hi=1.0),
        repeat_penalty=get_float(body, "repeat_penalty", d.repeat_penalty, lo=1e-6),
        repeat_last_n=get_int(body, "repeat_last_n", d.repeat_last_n, lo=0),
        frequency_penalty=get_float(body, "frequency_penalty", d.frequency_penalty, lo=-2.0, hi=2.0),
        presence_penalty=get_float(body, "presence_penalty", d.presence_penalty, lo=-2.0, hi=2.0),
        logit_bias=get_logit_bias(body, "logit_bias", vocab),
        top_n_sigma=get_float(body, "top_n_sigma", d.top_n_sigma),
        xtc_probability=get_float(body, "xtc_probability", d.xtc_probability, lo=0.0, hi=1.0),
        xtc_threshold=get_float(body, "xtc_threshold", d.xtc_threshold, lo=0.0, hi=1.0),
        dynatemp_range=get_float(body, "dynatemp_range", d.dynatemp_range, lo=0.0),
        dynatemp_exponent=get_float(body, "dynatemp_exponent", d.dynatemp_exponent, lo=0.0),
        min_keep=get_int(body, "min_keep", d.min_keep, lo=0),
        dry_multiplier=get_float(body, "dry_multiplier", d.dry_multiplier, lo=0.0),
        dry_base=get_float(body, "dry_base", d.dry_base, lo=0.0),
        dry_allowed_length=get_int(body, "dry_allowed_length", d.dry_allowed_length, lo=0),
        dry_penalty_last_n=get_int(body, "dry_penalty_last_n", d.dry_penalty_last_n, lo=-1),
        mirostat=get_int(body, "mirostat", d.mirostat, lo=0, hi=2),
        mirostat_tau=get_float(body, "mirostat_tau", d.mirostat_tau, lo=0.0),
        mirostat_eta=get_float(body, "mirostat_eta", d.mirostat_eta, lo=0.0),
        seed=None if seed == -1 else seed, order=order)


def _common(body: dict, api: str, limits: Limits, fields: str | None = None) -> GenRequest:
    """The fields every generation API shares; `fields` names the endpoint whose field list the
    body is checked against (request_fields.py; default: the API's)."""
    check_fields(body, fields or api)
    reject_truthy(body, ("echo", "suffix"), "vkrt does not implement it")
    n_name = "n" if body.get("n") is not None or body.get("n_cmpl") is None else "n_cmpl"   # llama-server's alias
    n = get_int(body, n_name, 1, lo=1, hi=MAX_CHOICES)
    if n != 1 and api == LLAMA:
        raise BadRequest(f"'{n_name}' must be 1 on /completion (one choice a request; /v1 endpoints take up to "
                         f"{MAX_CHOICES}), got {n}", n_name)
    grammar = _grammar(body)
    max_tokens = _max_tokens(body, api, limits)
    if api == CHAT:   # logprobs: true, top_logprobs: n (or llama-server's n_probs)
        top = get_int(body, "top_logprobs", None, lo=0, hi=MAX_LOGPROBS)
        logprobs = (top or 0) if get_bool(body, "logprobs", False) else None
        if top is not None and logprobs is None:
            raise BadRequest("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        if logprobs is None:
            logprobs = get_int(body, "n_probs", 0, lo=0, hi=MAX_LOGPROBS) or None
    elif api == COMPLETIONS and body.get("n_probs") is None:   # logprobs: n (0: the chosen token's only)
        logprobs = get_int(body, "logprobs", None, lo=0, hi=MAX_LOGPROBS)
    else:   # llama-server: n_probs (or logprobs: n)
        name = "n_probs" if body.get("n_probs") is not None else "logprobs"
        logprobs = get_int(body, name, 0, lo=0, hi=MAX_LOGPROBS) or None
    stream = get_bool(body, "stream", False)
    opts = get_dict(body, "stream_options")
    draft = _draft(body, limits)
    return GenRequest(
        api=api, stream=stream, max_tokens=max_tokens, params=_sampling(body, limits.vocab),
        stop=get_stop(body), ignore_eos=get_bool(body, "ignore_eos", False),
        cache_prompt=get_bool(body, "cache_prompt", True),
        include_usage=stream and get_bool(opts, "include_usage", False),
        return_tokens=get_bool(body, "return_tokens", False), model=get_str(body, "model", None),
        timings_per_token=get_bool(body, "timings_per_token", False),
        id_slot=get_int(body, "id_slot", -1, lo=-1, hi=limits.n_slots - 1),
        logprobs=logprobs, n=n, dry_sequence_breakers=tuple(get_stop(body, "dry_sequence_breakers", max_len=40)
                                                       if body.get("dry_sequence_breakers") is not None
                                                       else DEFAULT_BREAKERS), grammar_source=grammar, draft=draft)


def _max_tokens(body: dict, api: str, limits: Limits) -> int | None:
    """The reply's token limit (None: until the end of generation or the context): llama-server's
    n_predict, else max_tokens, else max_completion_tokens; -1 is no limit where llama-server takes it."""
    hint = f" (a slot holds {limits.n_ctx} tokens: -c over --parallel; raise -c)"
    for name in ("n_predict", "max_tokens", "max_completion_tokens"):
        if body.get(name) is not None:
            lo = -1 if name == "n_predict" or (name == "max_tokens" and api == LLAMA) else 0
            n = get_int(body, name, lo=lo, hi=limits.n_ctx, hint=hint)
            return None if n == -1 else n
    return None


DRAFT_FIELDS = ("speculative.n_max", "speculative.n_min", "speculative.p_min")


def _draft(body: dict, limits: Limits) -> tuple | None:
    """llama-server's per-request speculative.n_max / n_min / p_min (None: none given); a 400
    where the server does not speculate (it would have no effect)."""
    given = [k for k in DRAFT_FIELDS if body.get(k) is not None]
    if not given:
        return None
    if not limits.speculative:
        raise BadRequest(f"'{given[0]}': this server runs without speculative decoding (start it with --spec-type "
                         f"ngram or a draft model, -md)", given[0])
    return (get_int(body, DRAFT_FIELDS[0], None, lo=0, hi=256), get_int(body, DRAFT_FIELDS[1], None, lo=0, hi=256),
            get_float(body, DRAFT_FIELDS[2], None, lo=0.0, hi=1.0))


def _grammar(body: dict) -> GrammarSource | None:
    """The grammar the output must fit: OpenAI's response_format (json_object, json_schema) or
    llama-server's top-level json_schema or GBNF grammar; at most one of them."""
    given = [k for k in ("json_schema", "grammar") if body.get(k) is not None]
    fmt = get_dict(body, "response_format")
    kind = fmt.get("type", "text")
    if kind not in ("text", "json_object", "json_schema"):
        raise BadRequest(f"'response_format.type' must be 'text', 'json_object' or 'json_schema', got {kind!r}",
                         "response_format.type")
    if kind != "text":
        given.append("response_format")
    if len(given) > 1:
        raise BadRequest(f"give one of 'response_format', 'json_schema' and 'grammar', not {' and '.join(given)}",
                         given[1])
    if kind == "json_object":   # llama-server also takes a schema here
        schema = fmt.get("schema")
        return GrammarSource("json_schema", JSON_OBJECT if schema is None else schema, "response_format.schema")
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict):
            raise BadRequest("'response_format.json_schema' must be an object with 'name' and 'schema'",
                             "response_format.json_schema")
        schema = spec.get("schema")
        return GrammarSource("json_schema", JSON_OBJECT if schema is None else schema,
                             "response_format.json_schema.schema")
    if body.get("json_schema") is not None:
        return GrammarSource("json_schema", body["json_schema"], "json_schema")
    if body.get("grammar") is not None:
        if not isinstance(body["grammar"], str):
            raise BadRequest("'grammar' must be a GBNF grammar (a string)", "grammar")
        return GrammarSource("gbnf", body["grammar"], "grammar")
    return None


def parse_completion(body: dict, api: str, limits: Limits, fields: str | None = None) -> GenRequest:
    """/v1/completions and /completion: `prompt` is a string or token ids (or one of either in an
    array); more ids than a slot holds are refused by their count alone. `fields`: as _common's."""
    req = _common(body, api, limits, fields)
    prompt = body.get("prompt")
    if prompt is None:
        raise BadRequest("'prompt' is required", "prompt")
    if isinstance(prompt, dict):   # llama-server's {"prompt_string": ..., "multimodal_data": [...]}
        prompt = multimodal_prompt(prompt, req.images)
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, list):
        if prompt and all(isinstance(p, (str, list)) for p in prompt):
            raise BadRequest("'prompt' may hold one prompt per request", "prompt")
        prompt = get_token_ids(prompt, "prompt", limits.vocab, most=limits.n_ctx - 1,
                               why=f" a slot of {limits.n_ctx} tokens with room for one generated token "
                                   f"(-c over --parallel; raise -c)")
    elif not isinstance(prompt, str):
        raise BadRequest("'prompt' must be a string or an array of token ids", "prompt")
    req.prompt = prompt
    return req


def parse_chat(body: dict, limits: Limits) -> GenRequest:
    """/v1/chat/completions: `messages` with roles and text content; `tools` go to the template (and,
    with tool_choice required or named or strict functions, into a grammar: routes.py, tool_grammar.py)."""
    req = _common(body, CHAT, limits)
    messages = body.get("messages")
    if messages is None:
        raise BadRequest("'messages' is required", "messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty array of message objects", "messages")
    req.messages = [_message(m, f"messages[{i}]", req.images) for i, m in enumerate(messages)]
    req.tools = _tools(body.get("tools"))
    req.tool_choice, req.tool_name = _tool_choice(body.get("tool_choice"), req.tools)
    strict = [i for i, t in enumerate(req.tools or ()) if t["function"].get("strict") is True]
    if req.grammar_source is not None and (req.tool_choice == "required" or (req.tool_choice == "auto" and strict)):
        field = "tool_choice" if req.tool_choice == "required" else f"tools[{strict[0]}].function.strict"
        raise BadRequest("a reply held to tool calls ('tool_choice' required or named, or 'strict' tools) cannot "
                         "also be held to 'response_format', 'json_schema' or 'grammar'", field)
    req.parallel_tool_calls = get_bool(body, "parallel_tool_calls", True)
    req.reasoning_format = get_str(body, "reasoning_format", None)
    if req.reasoning_format is not None and req.reasoning_format not in REASONING_FORMATS:
        raise BadRequest(f"'reasoning_format' must be one of {', '.join(REASONING_FORMATS)}, got "
                         f"{req.reasoning_format!r}", "reasoning_format")
    req.template_kwargs = get_dict(body, "chat_template_kwargs")
    req.reasoning_budget = _reasoning_budget(body)
    req.budget_message = get_str(body, "reasoning_budget_message", None)
    return req


BUDGET_FIELDS = ("reasoning_budget_tokens", "thinking_budget_tokens")   # llama-server's name, and its alias


def _reasoning_budget(body: dict) -> int | None:
    """llama-server's per-request reasoning_budget_tokens (or thinking_budget_tokens): -1 or absent
    the server's --reasoning-budget (None), 0 no thinking, N at most N thinking tokens; else
    OpenAI's reasoning_effort as a budget (EFFORT_BUDGET)."""
    for key in BUDGET_FIELDS:
        if body.get(key) is not None:
            n = get_int(body, key, -1, lo=-1)
            return None if n == -1 else n
    effort = body.get("reasoning_effort")
    if effort is None:
        return None
    if not isinstance(effort, str) or effort not in EFFORT_BUDGET:
        raise BadRequest(f"'reasoning_effort' must be one of {', '.join(EFFORT_BUDGET)}, got {_short(effort)}",
                         "reasoning_effort")
    return EFFORT_BUDGET[effort]


def _tools(tools) -> list | None:
    """OpenAI's tools: [{"type": "function", "function": {"name", "description", "parameters"}}]."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise BadRequest("'tools' must be an array of {'type': 'function', 'function': {...}} objects", "tools")
    for i, t in enumerate(tools):
        at = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
            raise BadRequest(f"'{at}' must be {{'type': 'function', 'function': {{'name': ..., 'parameters': ...}}}}"
                             " (only function tools are supported)", at)
        f = t["function"]
        if not isinstance(f.get("name"), str) or not f["name"]:
            raise BadRequest(f"'{at}.function.name' must be a non-empty string", f"{at}.function.name")
        if f.get("parameters") is not None and not isinstance(f["parameters"], dict):
            raise BadRequest(f"'{at}.function.parameters' must be a JSON schema object", f"{at}.function.parameters")
        if f.get("strict") is not None and not isinstance(f["strict"], bool):
            raise BadRequest(f"'{at}.function.strict' must be a boolean", f"{at}.function.strict")
    return tools or None


def _tool_choice(choice, tools: list | None) -> tuple[str, str | None]:
    """("auto" | "none" | "required", the named function or None); a named function is required."""
    if choice is None or choice in ("auto", "none"):
        return choice or "auto", None
    if choice == "required" or (isinstance(choice, dict) and choice.get("type") == "function"):
        name = None
        if choice != "required":
            f = choice.get("function")
            name = f.get("name") if isinstance(f, dict) else None
            if not isinstance(name, str) or not name:
                raise BadRequest("'tool_choice.function.name' must be the name of one of the 'tools'",
                                 "tool_choice.function.name")
        if not tools:
            raise BadRequest(f"'tool_choice' {choice!r} needs 'tools' to call", "tool_choice")
        names = [t["function"]["name"] for t in tools]
        if name is not None and name not in names:
            raise BadRequest(f"'tool_choice.function.name' is {name!r}, not one of the tools ({', '.join(names)})",
                             "tool_choice.function.name")
        return "required", name
    raise BadRequest(f"'tool_choice' must be 'auto', 'none', 'required' or {{'type': 'function', 'function': "
                     f"{{'name': ...}}}}, got {choice!r}", "tool_choice")


def _tool_calls(calls, where: str) -> list[dict]:
    """An assistant message's tool calls, with JSON arguments as objects (templates such as Qwen3.5's
    and gpt-oss's read them as mappings; llama-server passes them so)."""
    if not isinstance(calls, list):
        raise BadRequest(f"'{where}' must be an array of tool calls", where)
    out = []
    for i, c in enumerate(calls):
        at = f"{where}[{i}]"
        f = c.get("function") if isinstance(c, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            raise BadRequest(f"'{at}' must be {{'id': ..., 'type': 'function', 'function': {{'name': ..., "
                             f"'arguments': ...}}}}", at)
        args = f.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                raise BadRequest(f"'{at}.function.arguments' is not valid JSON", f"{at}.function.arguments") from None
            except RecursionError:
                raise BadRequest(f"'{at}.function.arguments' is nested too deeply", f"{at}.function.arguments") from None
        if not isinstance(args, dict):
            raise BadRequest(f"'{at}.function.arguments' must be a JSON object (or its text)",
                             f"{at}.function.arguments")
        out.append({**c, "type": "function", "function": {**f, "arguments": args}})
    return out


def _message(m, where: str, images: list | None = None) -> dict:
    if not isinstance(m, dict):
        raise BadRequest(f"'{where}' must be an object with 'role' and 'content'", where)
    role = m.get("role")
    if not isinstance(role, str) or not role:
        raise BadRequest(f"'{where}.role' must be a non-empty string", f"{where}.role")
    content = m.get("content")
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            at = f"{where}.content[{j}]"
            if images is not None and isinstance(part, dict) and part.get("type") in IMAGE_PARTS:
                texts.append(image_part(part, at, images))   # its image goes where the marker stands
                continue
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else None
                raise BadRequest(f"'{at}' must be a text part ({{'type': 'text', 'text': ...}}); "
                                 f"{kind!r} parts are not supported", at)
            if not isinstance(part.get("text"), str):
                raise BadRequest(f"'{at}.text' must be a string", f"{at}.text")
            texts.append(part["text"])
        content = "".join(texts)
    elif content is None:
        if not m.get("tool_calls"):
            raise BadRequest(f"'{where}.content' is required", f"{where}.content")
    elif not isinstance(content, str):
        raise BadRequest(f"'{where}.content' must be a string or an array of text parts", f"{where}.content")
    out = {**m, "content": content}
    if m.get("tool_calls") is not None:
        out["tool_calls"] = _tool_calls(m["tool_calls"], f"{where}.tool_calls")
    for key in ("tool_call_id", "name", "reasoning_content"):
        if m.get(key) is not None and not isinstance(m[key], str):
            raise BadRequest(f"'{where}.{key}' must be a string", f"{where}.{key}")
    return out
