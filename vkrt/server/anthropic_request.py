"""An Anthropic Messages API request (/v1/messages, /v1/messages/count_tokens) -> the chat path's
GenRequest: `system`, `messages` of text / tool_use / tool_result / thinking blocks, `tools` with
`input_schema`, `tool_choice`, `thinking`, `stop_sequences`; base64 `image` blocks in user turns
and tool results (with a vision projector: image_parts.py). Fields vkrt cannot honour are refused
by name."""

from __future__ import annotations

from .image_parts import MEDIA_MARKER, source_image
from .schemas import GenRequest, Limits, parse_chat
from .translate import check_fields, set_thinking, token_limit
from .validation import BadRequest, get_dict, get_stop, get_str

ENDPOINT = "/v1/messages"
TAKEN = frozenset({"model", "messages", "max_tokens", "system", "metadata", "stop_sequences", "stream", "temperature",
                   "top_p", "top_k", "tools", "tool_choice", "thinking", "service_tier"})
COUNTED = frozenset({"model", "messages", "system", "tools", "tool_choice", "thinking"})
REFUSED = {
    "container": "vkrt runs no code execution containers",
    "mcp_servers": "vkrt connects to no MCP servers",
    "context_management": "vkrt does not edit the conversation's context",
    "output_format": "structured outputs are not supported here (OpenAI's /v1/chat/completions takes "
                     "response_format)",
    "output_config": "vkrt has no output effort setting (use 'thinking' with a 'budget_tokens')",
    "inference_geo": "vkrt runs where it is started",
}
BLOCKS = "text, image, tool_use, tool_result, thinking and redacted_thinking blocks"


def parse_messages(body: dict, limits: Limits, counting: bool = False) -> GenRequest:
    """The request as the chat path's; `counting` (count_tokens) takes no generation fields."""
    check_fields(body, f"{ENDPOINT}/count_tokens" if counting else ENDPOINT, COUNTED if counting else TAKEN, REFUSED)
    get_dict(body, "metadata")
    get_str(body, "service_tier", None)
    tools, images = _tools(body.get("tools")), []
    chat = {"messages": _system(body.get("system")) + _messages(body.get("messages"), images), "tools": tools,
            **{k: body[k] for k in ("model", "temperature", "top_p", "top_k", "stream") if body.get(k) is not None}}
    chat.update(_tool_choice(body.get("tool_choice"), tools))
    req = parse_chat(chat, limits)
    req.images = images
    req.max_tokens = None if counting else token_limit(body, "max_tokens", limits, required=True)
    req.stop = get_stop(body, "stop_sequences")
    set_thinking(req, _thinking_budget(get_dict(body, "thinking")))
    return req


def _flag(obj: dict, key: str, at: str) -> bool:
    value = obj.get(key, False)
    if value is not None and not isinstance(value, bool):
        raise BadRequest(f"'{at}.{key}' must be true or false, got {value!r}", f"{at}.{key}")
    return bool(value)


def _text(block: dict, at: str) -> str:
    if not isinstance(block.get("text"), str):
        raise BadRequest(f"'{at}.text' must be a string", f"{at}.text")
    return block["text"]


def _blocks(content, at: str) -> list[dict]:
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise BadRequest(f"'{at}' must be a string or an array of content blocks ({BLOCKS})", at)
    for j, b in enumerate(content):
        if not isinstance(b.get("type"), str):
            raise BadRequest(f"'{at}[{j}].type' must be a string (the block's kind)", f"{at}[{j}].type")
    return content


def _refuse_block(block: dict, at: str, allowed: str):
    kind = block["type"]
    what = {"document": "vkrt reads no documents (send their text as text blocks)",
            "image": f"images go in user turns and tool results; the blocks there are {allowed}"}.get(
        kind, f"the blocks there are {allowed}")
    raise BadRequest(f"'{at}.type' is {kind!r}, a block vkrt's {ENDPOINT} does not take: {what}", f"{at}.type")


def _system(system) -> list[dict]:
    if system is None:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}] if system else []
    texts = []
    for j, b in enumerate(_blocks(system, "system")):
        if b["type"] != "text":
            _refuse_block(b, f"system[{j}]", "text blocks")
        texts.append(_text(b, f"system[{j}]"))
    return [{"role": "system", "content": "\n\n".join(texts)}]


def _joined(pieces: list[str]) -> str:
    """Text blocks joined by blank lines; an image's marker joins its neighbours directly (as
    chat's content parts join), so an image then a text reads as the same chat parts would."""
    out = []
    for k, piece in enumerate(pieces):
        if k and MEDIA_MARKER not in (piece, pieces[k - 1]):
            out.append("\n\n")
        out.append(piece)
    return "".join(out)


def _messages(messages, images: list) -> list[dict]:
    """The chat messages of `messages`; each image block's image appended to `images`."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty array of {'role', 'content'} objects", "messages")
    out = []
    for i, m in enumerate(messages):
        at = f"messages[{i}]"
        if not isinstance(m, dict):
            raise BadRequest(f"'{at}' must be an object with 'role' and 'content'", at)
        role, content = m.get("role"), m.get("content")
        if role not in ("user", "assistant"):
            raise BadRequest(f"'{at}.role' must be 'user' or 'assistant', got {role!r}", f"{at}.role")
        if role == "assistant" and i == len(messages) - 1:
            raise BadRequest(f"'{at}.role' is 'assistant' in the last message (a prefill to continue), which vkrt "
                             f"does not take: end 'messages' with a user turn", f"{at}.role")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
        elif role == "user":
            out.extend(_user(_blocks(content, f"{at}.content"), f"{at}.content", images))
        else:
            out.append(_assistant(_blocks(content, f"{at}.content"), f"{at}.content"))
    return out


def _user(blocks: list[dict], at: str, images: list) -> list[dict]:
    """A user turn's blocks: each tool_result a tool message, the text and images between them
    user messages."""
    out, texts = [], []

    def flush():
        if texts:
            out.append({"role": "user", "content": _joined(texts)})
            texts.clear()
    for j, b in enumerate(blocks):
        if b["type"] == "text":
            texts.append(_text(b, f"{at}[{j}]"))
        elif b["type"] == "image":
            texts.append(source_image(b, f"{at}[{j}]", images))
        elif b["type"] == "tool_result":
            flush()
            out.append(_tool_result(b, f"{at}[{j}]", images))
        else:
            _refuse_block(b, f"{at}[{j}]", "text, image and tool_result blocks in a user turn")
    flush()
    return out


def _tool_result(block: dict, at: str, images: list) -> dict:
    """A tool message; a result with is_error true reads "Error: ..." (chat templates have no flag for it)."""
    call = block.get("tool_use_id")
    if not isinstance(call, str) or not call:
        raise BadRequest(f"'{at}.tool_use_id' must be the id of the tool_use it answers", f"{at}.tool_use_id")
    content = block.get("content", "")
    if not isinstance(content, str):
        texts = []
        for k, b in enumerate(_blocks(content, f"{at}.content")):
            if b["type"] == "image":
                texts.append(source_image(b, f"{at}.content[{k}]", images))
            elif b["type"] == "text":
                texts.append(_text(b, f"{at}.content[{k}]"))
            else:
                _refuse_block(b, f"{at}.content[{k}]", "text and image blocks in a tool_result")
        content = _joined(texts)
    if _flag(block, "is_error", at):
        content = f"Error: {content}"
    return {"role": "tool", "tool_call_id": call, "content": content}


def _assistant(blocks: list[dict], at: str) -> dict:
    """An assistant turn's blocks as one message: text as its content, thinking as its
    reasoning_content, tool_use as its tool calls. redacted_thinking is opaque (another server's
    encrypted thinking): it is dropped."""
    texts, thoughts, calls = [], [], []
    for j, b in enumerate(blocks):
        where = f"{at}[{j}]"
        if b["type"] == "text":
            texts.append(_text(b, where))
        elif b["type"] == "thinking":
            if not isinstance(b.get("thinking"), str):
                raise BadRequest(f"'{where}.thinking' must be a string", f"{where}.thinking")
            thoughts.append(b["thinking"])
        elif b["type"] == "tool_use":
            calls.append(_tool_use(b, where))
        elif b["type"] != "redacted_thinking":
            _refuse_block(b, where, "text, thinking, redacted_thinking and tool_use blocks in an assistant turn")
    msg = {"role": "assistant", "content": "\n\n".join(texts) if texts or not calls else None}
    if thoughts:
        msg["reasoning_content"] = "\n\n".join(thoughts)
    if calls:
        msg["tool_calls"] = calls
    return msg


def _tool_use(block: dict, at: str) -> dict:
    for key in ("id", "name"):
        if not isinstance(block.get(key), str) or not block[key]:
            raise BadRequest(f"'{at}.{key}' must be a non-empty string", f"{at}.{key}")
    if not isinstance(block.get("input", {}), dict):
        raise BadRequest(f"'{at}.input' must be an object (the call's arguments)", f"{at}.input")
    return {"id": block["id"], "type": "function", "function": {"name": block["name"],
                                                                "arguments": block.get("input", {})}}


def _tools(tools) -> list | None:
    """Anthropic's client tools -> OpenAI function tools; server tools (web search, code
    execution, ...) are refused."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise BadRequest("'tools' must be an array of {'name', 'description', 'input_schema'} objects", "tools")
    out = []
    for i, t in enumerate(tools):
        at = f"tools[{i}]"
        if not isinstance(t, dict):
            raise BadRequest(f"'{at}' must be an object with 'name' and 'input_schema'", at)
        if t.get("type") not in (None, "custom"):
            raise BadRequest(f"'{at}.type' is {t['type']!r}: vkrt runs no server tools; it takes client tools "
                             f"(no 'type', or 'custom') with a 'name' and an 'input_schema'", f"{at}.type")
        if not isinstance(t.get("name"), str) or not t["name"]:
            raise BadRequest(f"'{at}.name' must be a non-empty string", f"{at}.name")
        schema = t.get("input_schema")
        if not isinstance(schema, dict):
            raise BadRequest(f"'{at}.input_schema' must be a JSON schema object", f"{at}.input_schema")
        fn = {"name": t["name"], "parameters": schema}
        if t.get("description") is not None:
            if not isinstance(t["description"], str):
                raise BadRequest(f"'{at}.description' must be a string", f"{at}.description")
            fn["description"] = t["description"]
        if _flag(t, "strict", at):
            fn["strict"] = True
        out.append({"type": "function", "function": fn})
    return out or None


def _tool_choice(choice, tools: list | None) -> dict:
    """{"auto"}, {"any"} (a call, of any tool), {"tool", "name"}, {"none"}, each with
    disable_parallel_tool_use -> the chat request's tool_choice and parallel_tool_calls."""
    if choice is None:
        return {}
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
        raise BadRequest(f"'tool_choice' must be {{'type': 'auto' | 'any' | 'tool' | 'none'}}, got {choice!r}",
                         "tool_choice")
    kind = choice["type"]
    out = {"parallel_tool_calls": not _flag(choice, "disable_parallel_tool_use", "tool_choice")}
    if kind in ("any", "tool") and not tools:
        raise BadRequest(f"'tool_choice' {kind!r} needs 'tools' to call", "tool_choice")
    if kind == "tool":
        names = [t["function"]["name"] for t in tools]
        name = choice.get("name")
        if name not in names:
            raise BadRequest(f"'tool_choice.name' must be one of the tools ({', '.join(names)}), got {name!r}",
                             "tool_choice.name")
        out["tool_choice"] = {"type": "function", "function": {"name": name}}
    else:
        out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
    return out


def _thinking_budget(thinking: dict) -> int | None:
    """{"type": "enabled", "budget_tokens": N} -> N, {"type": "disabled"} -> 0, {"type":
    "adaptive"} or none -> None (the server's --reasoning-budget)."""
    if not thinking:
        return None
    kind = thinking.get("type")
    if kind == "enabled":
        n = thinking.get("budget_tokens")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise BadRequest(f"'thinking.budget_tokens' must be an integer >= 1 with 'thinking.type' 'enabled', "
                             f"got {n!r}", "thinking.budget_tokens")
        return n
    if kind == "disabled":
        return 0
    if kind == "adaptive":
        return None
    raise BadRequest(f"'thinking.type' must be 'enabled', 'disabled' or 'adaptive', got {kind!r}", "thinking.type")
