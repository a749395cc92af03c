"""The top-level fields of the generation endpoints (/v1/chat/completions, /v1/completions,
/completion, /infill): OpenAI's and llama-server's. vkrt never ignores one: each is honoured
(schemas.py reads it), taken at a value that asks for nothing more than vkrt does (AT_DEFAULT),
taken as bookkeeping that changes no reply (METADATA), or refused with a 400 naming it; so is a
field neither API defines. Checked before any other field (a misspelt name fails at once)."""

from __future__ import annotations

import difflib
import json

from .validation import BadRequest, _kind, _short

SAMPLING = frozenset({
    "temperature", "top_k", "top_p", "min_p", "typical_p", "repeat_penalty", "repeat_last_n", "frequency_penalty",
    "presence_penalty", "logit_bias", "top_n_sigma", "xtc_probability", "xtc_threshold", "dynatemp_range",
    "dynatemp_exponent", "min_keep", "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
    "dry_sequence_breakers", "mirostat", "mirostat_tau", "mirostat_eta", "seed", "samplers"})
COMMON = SAMPLING | {
    "model", "stream", "stream_options", "n", "n_cmpl", "max_tokens", "max_completion_tokens", "n_predict", "stop",
    "ignore_eos", "cache_prompt", "return_tokens", "timings_per_token", "id_slot", "json_schema", "grammar",
    "response_format", "echo", "suffix", "speculative.n_max", "speculative.n_min", "speculative.p_min"}
CHAT_ONLY = frozenset({"messages", "logprobs", "top_logprobs", "n_probs", "tools", "tool_choice", "parallel_tool_calls",
                       "reasoning_format", "reasoning_effort", "chat_template_kwargs", "reasoning_budget_tokens",
                       "thinking_budget_tokens", "reasoning_budget_message"})
TAKEN = {
    "chat": COMMON | CHAT_ONLY,
    "completions": COMMON | {"prompt", "logprobs", "n_probs"},
    "llama": COMMON | {"prompt", "n_probs", "logprobs"},
    "infill": COMMON | {"prompt", "n_probs", "logprobs", "input_prefix", "input_suffix", "input_extra"},
}
ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "llama": "/completion",
             "infill": "/infill"}

# OpenAI's bookkeeping: no effect on a reply; taken when of this type
METADATA = {"user": str, "metadata": dict, "safety_identifier": str, "prompt_cache_key": str,
            "prompt_cache_retention": str, "service_tier": str}

_NO_SHIFT = "vkrt never shifts a slot's context: a reply ends when its slot is full"
# taken at these values (what vkrt does anyway), refused at any other
AT_DEFAULT = {
    "t_max_predict_ms": ((0,), "vkrt has no time limit a request: limit the reply's tokens (max_tokens, n_predict)"),
    "n_keep": ((0, -1), _NO_SHIFT),
    "n_discard": ((0,), _NO_SHIFT),
    "n_cache_reuse": ((0,), "vkrt reuses a slot's longest cached prefix, not shifted chunks of it"),
    "n_indent": ((0,), "vkrt does not stop a reply at an indentation"),
    "post_sampling_probs": ((False,), "vkrt reports the probabilities before sampling"),
    "return_progress": ((False,), "vkrt sends no prompt-progress chunks"),
    "backend_sampling": ((False,), "vkrt chooses where it samples"),
    "lora": (([],), "vkrt loads no LoRA adapters"),
    "response_fields": (([],), "vkrt answers with whole objects"),
    "add_generation_prompt": ((True,), "vkrt always renders the generation prompt"),
    "parse_tool_calls": ((True,), "vkrt parses the tool calls of a reply whenever tools are offered"),
    "store": ((False,), "vkrt keeps no chat completions (/v1/responses keeps its responses)"),
    "modalities": ((["text"],), "vkrt replies in text"),
    "verbosity": (("medium",), "vkrt cannot steer a reply's length ('medium' only)"),
    "best_of": ((1,), "vkrt generates one candidate a choice (ask for more choices with 'n')"),
}

_INTERNAL = "llama-server's own field; vkrt takes it from the chat template and the request's tools"
_SPEC = "vkrt's speculative decoding is set at start (--spec-type, -md); a request tunes speculative.n_max/n_min/p_min"
_BUDGET = "vkrt closes a thinking block with the template's own tag"
REFUSED = {
    "functions": "OpenAI's deprecated form: give 'tools'",
    "function_call": "OpenAI's deprecated form: give 'tool_choice'",
    "audio": "vkrt replies in text",
    "prediction": "vkrt takes no predicted outputs",
    "web_search_options": "vkrt runs no web search",
    "adaptive_target": "vkrt has no adaptive-p sampler",
    "adaptive_decay": "vkrt has no adaptive-p sampler",
    **dict.fromkeys(("grammar_lazy", "grammar_triggers", "preserved_tokens", "chat_format", "chat_parser",
                     "thinking_forced_open"), _INTERNAL),
    **dict.fromkeys(("speculative.type", "speculative.ngram_size_n", "speculative.ngram_size_m",
                     "speculative.ngram_m_hits"), _SPEC),
    **dict.fromkeys(("reasoning_budget_start_tag", "reasoning_budget_end_tag", "reasoning_budget_arm_immediately"),
                    _BUDGET),
}


def check_fields(body: dict, api: str) -> None:
    """A 400 naming the first field of `body` that `api` ("chat", "completions", "llama",
    "infill") does not take; a null value counts as absent."""
    taken, endpoint = TAKEN[api], ENDPOINTS[api]
    for name, value in body.items():
        if value is None or name in taken:
            continue
        if name in METADATA:
            if not isinstance(value, METADATA[name]):
                what = "a string" if METADATA[name] is str else "an object"
                raise BadRequest(f"'{name}' must be {what}, got {_kind(value)}", name)
        elif name in AT_DEFAULT:
            allowed, why = AT_DEFAULT[name]
            if value not in allowed or type(value) is not type(allowed[0]):
                raise BadRequest(f"'{name}' {_short(value)} is not supported: {why} (it takes "
                                 f"{' or '.join(json.dumps(a) for a in allowed)})", name)
        elif name in REFUSED:
            raise BadRequest(f"'{name}' is not supported by vkrt's {endpoint}: {REFUSED[name]}", name)
        else:
            short = name if len(name) <= 64 else name[:64] + "..."
            near = difflib.get_close_matches(name, sorted(taken), n=1) if len(name) <= 64 else []
            hint = f"; did you mean '{near[0]}'?" if near else " (docs/serving.md lists the fields it takes)"
            raise BadRequest(f"'{short}' is not a field of {endpoint}{hint}", short)
