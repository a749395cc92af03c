"""/infill: llama-server's fill-in-the-middle prompt (format_prompt_infill, prefix-suffix-middle
order) from the FIM tokens the GGUF names:

    [FIM_REP]myproject\\n [FIM_SEP]file\\n chunk ... [FIM_SEP]filename\\n     (input_extra; REP/SEP if the file has them)
    [BOS] [FIM_PRE] prefix prompt [FIM_SUF] suffix [FIM_MID]

The prefix keeps its last 3/4 of a batch of tokens, the suffix its first quarter less the
prompt; the extra context fills what the slot leaves past a batch."""

from __future__ import annotations

from dataclasses import dataclass

from .request_fields import check_fields
from .validation import BadRequest, get_token_ids

INFILL_FIELDS = ("input_prefix", "input_suffix", "input_extra")

# token id keys llama.cpp reads, newest first (the older prefix/suffix/middle names of CodeLlama files)
_KEYS = {
    "pre": ("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"),
    "suf": ("tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"),
    "mid": ("tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"),
    "rep": ("tokenizer.ggml.fim_rep_token_id",),
    "sep": ("tokenizer.ggml.fim_sep_token_id",),
}
# the bytes llama-server puts between extra chunks when the model has no FIM_SEP
_CHUNK_SEPARATOR = "\n\n--- snippet ---\n\n"


@dataclass(frozen=True)
class FimTokens:
    pre: int | None
    suf: int | None
    mid: int | None
    rep: int | None
    sep: int | None

    @staticmethod
    def from_metadata(meta: dict, vocab: int) -> "FimTokens":
        def first(keys):
            for key in keys:
                value = meta.get(key)
                if isinstance(value, int) and 0 <= value < vocab:
                    return value
            return None

        return FimTokens(**{name: first(keys) for name, keys in _KEYS.items()})

    def check(self) -> None:
        """A 400 for a model without the prefix, suffix or middle token (llama-server answers 501
        with the same words; a request this model cannot serve is the client's to change)."""
        missing = "".join(f"{what} token is missing. " for what, t in
                          (("prefix", self.pre), ("suffix", self.suf), ("middle", self.mid)) if t is None)
        if missing:
            raise BadRequest(f"Infill is not supported by this model: {missing}(the GGUF names no "
                             f"tokenizer.ggml.fim_pre/suf/mid_token_id; serve a model with FIM tokens)")


def infill_tokens(fim: FimTokens, encode, prefix: list[int], suffix: list[int], extra: list[dict],
                  prompt: list[int], n_batch: int, n_ctx: int, bos: int | None, n_predict: int = -1) -> list[int]:
    """format_prompt_infill's token layout. encode(text) tokenizes without BOS; extra holds
    {"text", "filename"} chunks; bos is prepended when the model adds one. Only the extra context's
    last tokens are kept, so its pieces are tokenised from the end until they fill that room (6 MB
    of extra context costs what a slot's worth does)."""
    parts = []   # the extra context's pieces in order, each tokenised when asked
    if fim.rep is not None:
        parts.append(lambda: [fim.rep] + encode("myproject\n"))
    for chunk in extra:
        if fim.sep is not None:
            parts.append(lambda c=chunk: [fim.sep] + encode(c.get("filename", "tmp") + "\n"))
        else:
            parts.append(lambda: encode(_CHUNK_SEPARATOR))
        parts.append(lambda c=chunk: encode(c["text"]))
    if fim.sep is not None:
        parts.append(lambda: [fim.sep] + encode("filename\n"))
    room = max(0, n_ctx - n_batch - 2 * n_predict)
    tail: list[list[int]] = []
    have = 0
    for part in reversed(parts):
        if have >= room:
            break
        tail.append(part())
        have += len(tail[-1])
    extra_tokens = [t for piece in reversed(tail) for t in piece]
    n_prefix = min(len(prefix), 3 * (n_batch // 4))
    n_suffix = min(len(suffix), max(0, n_batch // 4 - (2 + len(prompt))))
    n_extra = min(room, len(extra_tokens))
    head = ([] if bos is None else [bos]) + [fim.pre] + prefix[len(prefix) - n_prefix:] + prompt
    return extra_tokens[len(extra_tokens) - n_extra:] + head + [fim.suf] + suffix[:n_suffix] + [fim.mid]


def infill_prompt(state, body: dict) -> list[int]:
    """The /infill request's prompt tokens, its fields checked as llama-server does (and its field
    names: request_fields.py)."""
    check_fields(body, "infill")
    tok = state.request_tokenizer
    fim = FimTokens.from_metadata(state.model.gguf.metadata, state.limits.vocab)
    fim.check()
    prompt = body.get("prompt", "")
    if not isinstance(prompt, str):
        raise BadRequest("'prompt' must be a string", "prompt")
    parts = {}
    for name in ("input_prefix", "input_suffix"):
        value = body.get(name)
        if isinstance(value, str):
            parts[name] = tok.encode(value, add_special=False, field=name)
        elif isinstance(value, list):
            parts[name] = get_token_ids(value, name, state.limits.vocab)
        else:
            raise BadRequest(f"'{name}' is required: a string or an array of token ids", name)
    extra = body.get("input_extra", [])
    if not isinstance(extra, list):
        raise BadRequest("'input_extra' must be an array of {\"filename\": string, \"text\": string}", "input_extra")
    for i, chunk in enumerate(extra):
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise BadRequest(f"'input_extra[{i}]' must contain a \"text\" field with a string value", "input_extra")
        if not isinstance(chunk.get("filename", ""), str):
            raise BadRequest(f"'input_extra[{i}].filename' must be a string", "input_extra")
    bos = tok.bos_id if tok.add_bos else None
    return infill_tokens(fim, lambda text: tok.encode(text, add_special=False, field="input_extra"),
                         parts["input_prefix"], parts["input_suffix"], extra,
                         tok.encode(prompt, add_special=False, field="prompt"),
                         state.engine.n_batch, state.n_ctx_slot, bos)


def completion_body(body: dict, tokens: list[int]) -> dict:
    """The /completion request an /infill request becomes: its prompt the framed tokens."""
    return {**{k: v for k, v in body.items() if k not in INFILL_FIELDS}, "prompt": tokens}
