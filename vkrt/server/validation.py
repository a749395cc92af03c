"""Typed reads of JSON request fields: every wrong value is a BadRequest naming the field."""

from __future__ import annotations

import json
import math
import re

from ..errors import VkrtError

_MISSING = object()


class ApiError(VkrtError):
    """Answered with `status` and an OpenAI-style error body (naming `param` when there is one)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 type: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.status, self.type = message, param, status, type


class BadRequest(ApiError):
    """A request the server cannot take as it is (400 unless said otherwise)."""


def parse_json_object(raw: bytes) -> dict:
    """The request body as a JSON object (NaN and Infinity are not JSON)."""
    def no_constants(name):
        raise ValueError(f"{name} is not valid JSON")

    try:
        body = json.loads(raw.decode("utf-8"), parse_constant=no_constants)
    except UnicodeDecodeError as exc:
        raise BadRequest(f"the request body is not UTF-8: {exc.reason} at byte {exc.start}") from None
    except ValueError as exc:  # JSONDecodeError is a ValueError
        raise BadRequest(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise BadRequest("the request body is nested too deeply") from None
    if not isinstance(body, dict):
        raise BadRequest(f"the request body must be a JSON object, got {_kind(body)}")
    if _SURROGATE_ESCAPE.search(raw) and not _all_text(body):
        _check_strings(body)
    return body


# the one way a lone UTF-16 surrogate gets into parsed JSON: a \uD800-\uDFFF escape (the body is
# strict UTF-8); a body without one needs no walk over its values (2,000,000 of them take a second)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _all_text(value) -> bool:
    """Whether every string and key in `value` is encodable text (a walk without paths)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if not v.isascii():
                try:
                    v.encode("utf-8")
                except UnicodeEncodeError:
                    return False
        elif isinstance(v, dict):
            stack.extend(v)
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return True


def _check_strings(body: dict) -> None:
    """Every string (and key) must be encodable text: JSON's \\ud800 escapes can smuggle in a
    lone UTF-16 surrogate, which no tokenizer or template can take. The error names where."""
    stack: list[tuple[str, object]] = [("", body)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, dict):
            for k, v in value.items():
                at = f"{where}.{k}" if where else str(k)
                _encodable(k, at)
                stack.append((at, v))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(value))
        elif isinstance(value, str):
            _encodable(value, where)


def _encodable(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadRequest(f"'{where}' holds a lone UTF-16 surrogate (\\u{ord(text[exc.start]):04x}) at character "
                         f"{exc.start}: not text", where.split(".")[0].split("[")[0] or None) from None


def _kind(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _given(body: dict, name: str, default) -> bool:
    """Whether the field holds a value; absent or null means the default (an error when required)."""
    if body.get(name) is None:
        if default is _MISSING:
            raise BadRequest(f"'{name}' is required", name)
        return False
    return True


def get_int(body: dict, name: str, default=_MISSING, lo: int | None = None, hi: int | None = None,
            hint: str = "") -> int:
    """`hint` is added to the message of a value above `hi`."""
    if not _given(body, name, default):
        return default
    value = body[name]
    if isinstance(value, float) and value.is_integer() and abs(value) < 2 ** 63:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"'{name}' must be an integer, got {_kind(value)}", name)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        rng = f">= {lo}" if hi is None else f"<= {hi}" if lo is None else f"in [{lo}, {hi}]"
        raise BadRequest(f"'{name}' must be {rng}, got {value}{hint if hi is not None and value > hi else ''}", name)
    return value


def get_float(body: dict, name: str, default=_MISSING, lo: float | None = None, hi: float | None = None) -> float:
    if not _given(body, name, default):
        return default
    value = body[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest(f"'{name}' must be a number, got {_kind(value)}", name)
    given = value
    try:
        value = float(value)
    except OverflowError:   # an integer of hundreds of digits
        value = math.inf
    if not math.isfinite(value) or (lo is not None and value < lo) or (hi is not None and value > hi):
        rng = "" if lo is None and hi is None else f" >= {lo}" if hi is None else f" in [{lo}, {hi}]"
        raise BadRequest(f"'{name}' must be a finite number{rng}, got {_short(given)}", name)
    return value


def _get_typed(body: dict, name: str, default, typ: type, what: str):
    if not _given(body, name, default):
        return default
    value = body[name]
    if not isinstance(value, typ):
        raise BadRequest(f"'{name}' must be {what}, got {_kind(value)}", name)
    return value


def get_bool(body: dict, name: str, default=_MISSING) -> bool:
    return _get_typed(body, name, default, bool, "true or false")


def get_str(body: dict, name: str, default=_MISSING) -> str:
    return _get_typed(body, name, default, str, "a string")


def get_dict(body: dict, name: str) -> dict:
    return _get_typed(body, name, {}, dict, "an object")


def get_stop(body: dict, name: str = "stop", max_count: int = 16, max_len: int = 512) -> list[str]:
    """A string or an array of strings."""
    value = body[name] if _given(body, name, []) else []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise BadRequest(f"'{name}' must be a string or an array of strings", name)
    if len(value) > max_count:
        raise BadRequest(f"'{name}' may hold at most {max_count} strings, got {len(value)}", name)
    if any(len(s) > max_len for s in value):
        raise BadRequest(f"'{name}' strings may be at most {max_len} characters long", name)
    return value


def get_token_ids(value, name: str, vocab: int, most: int | None = None, why: str = "") -> list[int]:
    """A list of token ids in [0, vocab); more than `most` is refused first, by its length alone
    (`why` says where the limit comes from). The checks run in C: a Python loop over millions of
    ids would contend with the scheduler thread and the event loop for the GIL for a second."""
    if most is not None and len(value) > most:
        raise BadRequest(f"'{name}' holds {len(value)} token ids; at most {most} fit{why}", name)
    if not set(map(type, value)) <= {int}:   # not bool, float or str
        raise BadRequest(f"'{name}' must hold token ids (integers)", name)
    if value and not (min(value) >= 0 and max(value) < vocab):
        bad = next(t for t in value if not 0 <= t < vocab)
        raise BadRequest(f"'{name}' holds token id {_short(bad)}, outside the vocabulary [0, {vocab})", name)
    return list(value)


_TOKEN_ID = re.compile(r"-?[0-9]{1,18}")


def _short(value, limit: int = 40) -> str:
    """repr(value) cut to `limit` characters (an error message quotes what it refused)."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10 ** 30 else f"an integer of {len(str(value))} digits"
    return text if len(text) <= limit else text[:limit] + "..."


def get_logit_bias(body: dict, name: str, vocab: int) -> tuple:
    """OpenAI's {"token id": bias} or llama-server's [[token id, bias], ...]; a bias of false
    bans the token. ((id, bias), ...) sorted by id, repeated ids summed."""
    value = body[name] if _given(body, name, {}) else {}
    if isinstance(value, dict):
        pairs = list(value.items())
    elif isinstance(value, list) and all(isinstance(v, list) and len(v) == 2 for v in value):
        pairs = [tuple(v) for v in value]
    else:
        raise BadRequest(f"'{name}' must be an object of token id -> bias or an array of [token id, bias] pairs", name)
    out: dict[int, float] = {}
    for tok, bias in pairs:
        if isinstance(tok, str) and _TOKEN_ID.fullmatch(tok.strip()):   # ASCII digits: int() takes "²" and 5000 digits badly
            tok = int(tok)
        if isinstance(tok, bool) or not isinstance(tok, int):
            raise BadRequest(f"'{name}' keys must be token ids (integers), got {_short(tok)}", name)
        if not 0 <= tok < vocab:
            raise BadRequest(f"'{name}' holds token id {_short(tok)}, outside the vocabulary [0, {vocab})", name)
        if bias is False:
            bias = -math.inf
        elif isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -100 <= bias <= 100:   # also nan
            raise BadRequest(f"'{name}' bias of token {tok} must be a number in [-100, 100] or false, got "
                             f"{_short(bias)}", name)
        out[tok] = out.get(tok, 0.0) + float(bias)
    if sum(b == -math.inf for b in out.values()) >= vocab:
        raise BadRequest(f"'{name}' bans every token of the vocabulary: nothing could be generated", name)
    return tuple(sorted(out.items()))


def reject_truthy(body: dict, names: tuple[str, ...], why: str) -> None:
    for name in names:
        if body.get(name):
            raise BadRequest(f"'{name}' is not supported: {why}", name)
