"""An OpenAI Responses API request (/v1/responses) -> the chat path's GenRequest: `input` as text or
items (messages, function_call, function_call_output, reasoning), `instructions`, function
`tools`, `tool_choice`, `text.format`, `reasoning.effort` as a thinking budget, the stored
conversation of `previous_response_id` (with its images), and `input_image` parts with data URLs
(with a vision projector: image_parts.py). Fields vkrt cannot honour are refused by name."""

from __future__ import annotations

import json
from dataclasses import dataclass

from .grammar_source import JSON_OBJECT, GrammarSource
from .image_parts import image_part
from .reasoning_budget import EFFORT_BUDGET
from .responses_items import input_items
from .responses_store import ResponseStore
from .schemas import GenRequest, Limits, parse_chat
from .translate import check_fields, set_thinking, token_limit
from .validation import BadRequest, get_bool, get_dict, get_str

ENDPOINT = "/v1/responses"
TAKEN = frozenset({"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text",
                   "max_output_tokens", "temperature", "top_p", "reasoning", "stream", "store", "previous_response_id",
                   "metadata", "user", "truncation", "include", "service_tier", "safety_identifier", "prompt_cache_key",
                   "stream_options"})
REFUSED = {
    "background": "vkrt answers within the request",
    "conversation": "vkrt keeps no conversation objects (continue one with 'previous_response_id')",
    "prompt": "vkrt has no stored prompt templates",
    "max_tool_calls": "vkrt does not count a response's tool calls",
    "top_logprobs": "log-probabilities are served by /v1/chat/completions",
}
ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


@dataclass
class ResponsesTurn:
    req: GenRequest
    history: list[dict]   # the conversation as chat messages, without the instructions (what is stored)
    echo: dict            # the request's settings the response object repeats
    store: bool
    images: list          # the conversation's images, (field, bytes) each, in the order of their markers
    inputs: list[dict]    # the request's own input items, with ids (GET /v1/responses/{id}/input_items)


def parse_responses(body: dict, limits: Limits, stored: ResponseStore) -> ResponsesTurn:
    check_fields(body, ENDPOINT, TAKEN, REFUSED)
    _check_settings(body)
    previous = get_str(body, "previous_response_id", None)
    history, images = [], []
    if previous is not None:
        kept = stored.get(previous)
        if kept is None:
            raise BadRequest(f"'previous_response_id' {previous!r} names no response this server keeps (it keeps "
                             f"the last {stored.max_count} for {stored.max_age:g} s, not those sent with store "
                             f"false)", "previous_response_id")
        history, images = list(kept.messages), list(kept.images)
    history += _input(body.get("input"), images)
    if not history:
        raise BadRequest("'input' is required (a string or an array of input items)", "input")
    instructions = get_str(body, "instructions", None)
    tools = _tools(body.get("tools"))
    chat = {"messages": ([{"role": "system", "content": instructions}] if instructions else []) + history,
            "tools": tools, "tool_choice": _tool_choice(body.get("tool_choice"), tools),
            **{k: body[k] for k in ("model", "temperature", "top_p", "stream", "parallel_tool_calls")
               if body.get(k) is not None}}
    req = parse_chat(chat, limits)
    req.images = images
    req.max_tokens = token_limit(body, "max_output_tokens", limits, required=False)
    text = get_dict(body, "text")
    req.grammar_source = _text_format(text)
    strict = any(t["function"].get("strict") for t in tools or ())
    if req.grammar_source is not None and (req.tool_choice == "required" or (req.tool_choice == "auto" and strict)):
        raise BadRequest("a reply held to tool calls ('tool_choice' required or a function, or 'strict' tools) "
                         "cannot also be held to 'text.format'", "text.format")
    reasoning = get_dict(body, "reasoning")
    set_thinking(req, _effort_budget(reasoning))
    echo = {"instructions": instructions, "max_output_tokens": body.get("max_output_tokens"),
            "metadata": get_dict(body, "metadata"), "parallel_tool_calls": req.parallel_tool_calls,
            "previous_response_id": previous, "store": get_bool(body, "store", True),
            "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
            "temperature": body.get("temperature", 1.0), "top_p": body.get("top_p", 1.0),
            "text": {"format": text.get("format") or {"type": "text"}},
            "tool_choice": body.get("tool_choice") or "auto", "tools": body.get("tools") or [],
            "truncation": "disabled", "user": body.get("user")}
    return ResponsesTurn(req, history, echo, echo["store"], images, input_items(body.get("input")))


def _check_settings(body: dict) -> None:
    """The taken fields whose other values vkrt cannot honour; the metadata ones are checked for type."""
    truncation = get_str(body, "truncation", "disabled")
    if truncation != "disabled":
        raise BadRequest(f"'truncation' {truncation!r} is not supported: vkrt never drops input items "
                         f"('disabled' only; a prompt too long for a slot is refused)", "truncation")
    include = body.get("include") or []
    if not isinstance(include, list) or include:
        raise BadRequest(f"'include' must be empty: vkrt adds no extra output data, got {include!r}", "include")
    for name in ("user", "service_tier", "safety_identifier", "prompt_cache_key"):
        get_str(body, name, None)
    get_dict(body, "stream_options")
    get_dict(body, "metadata")


def _text_of(parts, at: str, kinds: tuple[str, ...], images: list | None = None) -> str:
    """A string, or text parts of `kinds` ({"type", "text"}) joined; with `images`, input_image
    parts too, each image appended there and its media marker in the text."""
    if isinstance(parts, str):
        return parts
    if not isinstance(parts, list):
        raise BadRequest(f"'{at}' must be a string or an array of {' / '.join(kinds)} parts", at)
    texts = []
    for j, p in enumerate(parts):
        kind = p.get("type") if isinstance(p, dict) else None
        if kind == "input_image" and images is not None:
            texts.append(image_part(p, f"{at}[{j}]", images))
            continue
        if kind not in kinds:
            why = {"input_file": "vkrt reads no files", "input_audio": "vkrt takes no audio",
                   "input_image": "images go in input messages and function call outputs"}.get(
                kind, f"it takes {' / '.join(kinds)} parts")
            raise BadRequest(f"'{at}[{j}].type' is {kind!r}, a part vkrt's {ENDPOINT} does not take: {why}",
                             f"{at}[{j}].type")
        key = "refusal" if kind == "refusal" else "text"
        if not isinstance(p.get(key), str):
            raise BadRequest(f"'{at}[{j}].{key}' must be a string", f"{at}[{j}].{key}")
        texts.append(p[key])
    return "".join(texts)


def _open_assistant(out: list[dict], empty: bool) -> dict:
    """The assistant message the next output item extends: the last message if it is the
    assistant's (and, with `empty`, has no text or calls yet), else a new one."""
    last = out[-1] if out else None
    if last is None or last["role"] != "assistant" or (empty and (last["content"] or last.get("tool_calls"))):
        last = {"role": "assistant", "content": ""}
        out.append(last)
    return last


def _input(items, images: list) -> list[dict]:
    """Input items -> chat messages, their images appended to `images`; a response's output items
    (reasoning, message, function calls) in a row make one assistant message."""
    if items is None:
        return []
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise BadRequest("'input' must be a string or an array of input items", "input")
    out: list[dict] = []
    for i, item in enumerate(items):
        at = f"input[{i}]"
        if not isinstance(item, dict):
            raise BadRequest(f"'{at}' must be an input item object", at)
        kind = item.get("type", "message")
        if kind == "message":
            _message(item, at, out, images)
        elif kind == "function_call":
            msg = _open_assistant(out, empty=False)
            msg.setdefault("tool_calls", []).append(_function_call(item, at))
        elif kind == "function_call_output":
            call = _id(item, "call_id", at)
            out.append({"role": "tool", "tool_call_id": call,
                        "content": _text_of(item.get("output"), f"{at}.output", ("input_text",), images)})
        elif kind == "reasoning":
            text = _reasoning(item, at)
            if text:
                _open_assistant(out, empty=True)["reasoning_content"] = text
        else:
            raise BadRequest(f"'{at}.type' is {kind!r}: vkrt's {ENDPOINT} takes message, function_call, "
                             f"function_call_output and reasoning items", f"{at}.type")
    return out


def _message(item: dict, at: str, out: list[dict], images: list) -> None:
    role = ROLES.get(item.get("role"))
    if role is None:
        raise BadRequest(f"'{at}.role' must be one of {', '.join(ROLES)}, got {item.get('role')!r}", f"{at}.role")
    kinds = ("output_text", "refusal") if role == "assistant" else ("input_text",)
    text = _text_of(item.get("content"), f"{at}.content", kinds, None if role == "assistant" else images)
    if role == "assistant":
        _open_assistant(out, empty=True)["content"] = text
    else:
        out.append({"role": role, "content": text})


def _id(item: dict, key: str, at: str) -> str:
    if not isinstance(item.get(key), str) or not item[key]:
        raise BadRequest(f"'{at}.{key}' must be a non-empty string", f"{at}.{key}")
    return item[key]


def _function_call(item: dict, at: str) -> dict:
    call, name = _id(item, "call_id", at), _id(item, "name", at)
    args = item.get("arguments", "")
    if not isinstance(args, str):
        raise BadRequest(f"'{at}.arguments' must be the call's arguments as JSON text", f"{at}.arguments")
    try:
        parsed = json.loads(args) if args.strip() else {}
    except (ValueError, RecursionError):
        raise BadRequest(f"'{at}.arguments' is not valid JSON", f"{at}.arguments") from None
    if not isinstance(parsed, dict):
        raise BadRequest(f"'{at}.arguments' must be a JSON object", f"{at}.arguments")
    return {"id": call, "type": "function", "function": {"name": name, "arguments": parsed}}


def _reasoning(item: dict, at: str) -> str:
    """A reasoning item's text: its content, else its summary. encrypted_content is another
    server's: vkrt cannot read it (and writes none)."""
    for key, kind in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = item.get(key) or []
        if parts:
            return _text_of(parts, f"{at}.{key}", (kind,))
    return ""


def _tools(tools) -> list | None:
    """Responses function tools ({"type": "function", "name", "parameters", ...}) -> chat's; the
    hosted tools (web search, file search, code interpreter, ...) are refused."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise BadRequest("'tools' must be an array of {'type': 'function', 'name', 'parameters'} objects", "tools")
    out = []
    for i, t in enumerate(tools):
        at = f"tools[{i}]"
        if not isinstance(t, dict):
            raise BadRequest(f"'{at}' must be a function tool object", at)
        if t.get("type") != "function":
            raise BadRequest(f"'{at}.type' is {t.get('type')!r}: vkrt runs no hosted tools; it takes function "
                             f"tools ({{'type': 'function', 'name', 'parameters'}})", f"{at}.type")
        name = _id(t, "name", at)
        fn = {"name": name}
        for key, kind, what in (("description", str, "a string"), ("parameters", dict, "a JSON schema object"),
                                ("strict", bool, "true or false")):
            if t.get(key) is not None:
                if not isinstance(t[key], kind):
                    raise BadRequest(f"'{at}.{key}' must be {what}", f"{at}.{key}")
                fn[key] = t[key]
        out.append({"type": "function", "function": fn})
    return out or None


def _tool_choice(choice, tools: list | None):
    """"auto" | "none" | "required" | {"type": "function", "name"} -> chat's tool_choice."""
    if choice is None or choice in ("auto", "none", "required"):
        if choice == "required" and not tools:
            raise BadRequest("'tool_choice' 'required' needs 'tools' to call", "tool_choice")
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        names = [t["function"]["name"] for t in tools or ()]
        if choice.get("name") not in names:
            raise BadRequest(f"'tool_choice.name' must be one of the tools ({', '.join(names) or 'none given'}), "
                             f"got {choice.get('name')!r}", "tool_choice.name")
        return {"type": "function", "function": {"name": choice["name"]}}
    raise BadRequest(f"'tool_choice' must be 'auto', 'none', 'required' or {{'type': 'function', 'name': ...}} "
                     f"(vkrt runs no hosted tools), got {choice!r}", "tool_choice")


def _text_format(text: dict) -> GrammarSource | None:
    """text.format: {"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "name",
    "schema", "strict"} (always held to the schema)."""
    verbosity = text.get("verbosity")
    if verbosity not in (None, "medium"):
        raise BadRequest(f"'text.verbosity' {verbosity!r} is not supported: vkrt cannot steer a reply's length "
                         f"('medium' only)", "text.verbosity")
    fmt = text.get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return GrammarSource("json_schema", JSON_OBJECT, "text.format")
    if kind == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise BadRequest("'text.format.schema' must be a JSON schema object", "text.format.schema")
        return GrammarSource("json_schema", fmt["schema"], "text.format.schema")
    raise BadRequest(f"'text.format.type' must be 'text', 'json_object' or 'json_schema', got {kind!r}",
                     "text.format.type")


def _effort_budget(reasoning: dict) -> int | None:
    """reasoning.effort -> the thinking budget (EFFORT_BUDGET); none given: the server's."""
    for key in ("summary", "generate_summary"):   # vkrt writes no summaries: the reasoning item holds the text
        if reasoning.get(key) not in (None, "auto", "concise", "detailed"):
            raise BadRequest(f"'reasoning.{key}' must be 'auto', 'concise' or 'detailed', got {reasoning[key]!r}",
                             f"reasoning.{key}")
    effort = reasoning.get("effort")
    if effort is None:
        return None
    if effort not in EFFORT_BUDGET:
        raise BadRequest(f"'reasoning.effort' must be one of {', '.join(EFFORT_BUDGET)}, got {effort!r}",
                         "reasoning.effort")
    return EFFORT_BUDGET[effort]
