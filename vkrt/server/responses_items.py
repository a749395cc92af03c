"""A /v1/responses request's input items as GET /v1/responses/{id}/input_items lists them: each with
an id (its own, else a new one) and a status, text given as a string made a part, image parts
without their data (vkrt takes no `include`); one page at a time in OpenAI's list shape."""

from __future__ import annotations

from .responses_format import new_id
from .validation import BadRequest

PREFIX = {"message": "msg_", "function_call": "fc_", "function_call_output": "fco_", "reasoning": "rs_"}
QUERY = ("limit", "order", "after", "before", "include")
MAX_LIMIT, DEFAULT_LIMIT = 100, 20


def input_items(given) -> list[dict]:
    """The request's `input` (checked by parse_responses) as listed items."""
    if given is None:
        return []
    if isinstance(given, str):
        given = [{"type": "message", "role": "user", "content": given}]
    return [_item(item) for item in given]


def _item(item: dict) -> dict:
    kind = item.get("type", "message")
    out = {"id": item.get("id") or new_id(PREFIX[kind]), "type": kind,
           **{k: v for k, v in item.items() if k not in ("id", "type")}}
    out.setdefault("status", "completed")
    if kind == "message":
        text_kind = "output_text" if out.get("role") == "assistant" else "input_text"
        out["content"] = _parts(out.get("content"), text_kind)
    elif kind == "function_call_output" and isinstance(out.get("output"), list):
        out["output"] = _parts(out["output"], "input_text")
    return out


def _parts(parts, text_kind: str) -> list[dict]:
    """Content parts: a string as one `text_kind` part; an image part without its data URL."""
    if isinstance(parts, str):
        parts = [{"type": text_kind, "text": parts}]
    out = []
    for p in parts:
        p = {k: v for k, v in p.items() if not (p.get("type") == "input_image" and k == "image_url")}
        if p["type"] == "input_image":
            p.setdefault("detail", "auto")
        elif p["type"] == "output_text":
            p.setdefault("annotations", [])
        out.append(p)
    return out


def item_page(items: list[dict], query) -> dict:
    """One page of `items` as OpenAI's list: `query` (the URL's) has limit (1-100, default 20),
    order (asc or desc, default desc), after / before (an item id); `include` is refused."""
    _check_query(query)
    limit = _limit(query.get("limit"))
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise BadRequest(f"'order' must be 'asc' or 'desc', got {order!r}", "order")
    ordered = items if order == "asc" else items[::-1]
    start = _position(ordered, query.get("after"), "after") + 1 if "after" in query else 0
    end = _position(ordered, query.get("before"), "before") if "before" in query else len(ordered)
    page = ordered[start:end][:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": start + len(page) < end}


def _check_query(query) -> None:
    """A 400 naming an unknown, repeated or `include` query parameter."""
    for key in query:
        name = key.removesuffix("[]")
        if name not in QUERY:
            raise BadRequest(f"'{key}' is not a parameter of GET /v1/responses/{{id}}/input_items (it takes "
                             f"{', '.join(QUERY)})", key)
        if name == "include":
            values = query.getall(key)
            raise BadRequest(f"'include' {values} is not supported: vkrt adds no extra data to input items",
                             "include")
        if len(query.getall(key)) > 1:
            raise BadRequest(f"'{key}' is given more than once", key)


def _limit(value: str | None) -> int:
    if value is None:
        return DEFAULT_LIMIT
    try:
        n = int(value)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_LIMIT:
        raise BadRequest(f"'limit' must be an integer from 1 to {MAX_LIMIT}, got {value!r}", "limit")
    return n


def _position(items: list[dict], item_id: str, name: str) -> int:
    for i, item in enumerate(items):
        if item["id"] == item_id:
            return i
    raise BadRequest(f"'{name}' {item_id!r} is not the id of one of this response's input items", name)
