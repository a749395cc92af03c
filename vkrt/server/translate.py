"""What the translations of other APIs' requests (Anthropic Messages, OpenAI Responses) into the
chat path's GenRequest share: the fields an endpoint takes, the thinking budget, the token limit."""

from __future__ import annotations

from .reasoning import DEEPSEEK
from .schemas import GenRequest, Limits
from .validation import BadRequest, get_int


def check_fields(body: dict, endpoint: str, taken: frozenset, refused: dict[str, str]) -> None:
    """A 400 naming the first field `endpoint` does not take: one of `refused` (name -> why), or
    one it does not know. A null value counts as absent."""
    for name, value in body.items():
        if value is None or name in taken:
            continue
        if name in refused:
            raise BadRequest(f"'{name}' is not supported by vkrt's {endpoint}: {refused[name]}", name)
        raise BadRequest(f"'{name}' is not a field of {endpoint} (it takes {', '.join(sorted(taken))})", name)


def token_limit(body: dict, name: str, limits: Limits, required: bool) -> int | None:
    """The reply's token limit: at least 1; above a slot's context it is held to the context (the
    reply could not outgrow it anyway: it ends there as cut short)."""
    n = get_int(body, name, lo=1) if required else get_int(body, name, None, lo=1)
    if n is None:
        return None
    return min(n, limits.n_ctx)


def set_thinking(req: GenRequest, budget: int | None) -> None:
    """The reply's thinking: None the server's default, 0 off (the template rendered with
    enable_thinking false), N > 0 on with at most N tokens. The thinking is always split from the
    answer (these APIs give it a block or item of its own)."""
    req.reasoning_format = DEEPSEEK
    req.reasoning_budget = budget
    if budget is not None:
        req.template_kwargs = {**req.template_kwargs, "enable_thinking": budget != 0}
