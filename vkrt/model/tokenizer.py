"""Tokenizer built from a GGUF vocabulary with the `tokenizers` library, matching llama.cpp.

Two kinds, as llama.cpp names them in `tokenizer.ggml.model`:
- "gpt2": byte-level BPE with merges and a pre-tokenizer regex chosen by `tokenizer.ggml.pre`;
- "llama": SentencePiece-style BPE over scores, with byte fallback (<0xXX> tokens).
Special (control) and user-defined tokens in the text are matched whole, as llama.cpp does
when it parses special tokens in prompts.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer as HFTokenizer, decoders, models, normalizers, pre_tokenizers

from ..errors import VkrtError

log = logging.getLogger("vkrt.tokenizer")

TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# qwen35: QWEN2's shape with combining marks (\p{M}) kept with their letters and out of punctuation runs
_QWEN35 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
           r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# gpt-4o / o200k (gpt-oss, llama4) as llama.cpp writes it: the original's upper- and lower-case
# letter classes become letters that are not a-z, and letters that are not A-Z
_GPT4O = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
          r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
          r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
          r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# tekken (Mistral: Ministral 3, Mistral Small 3.x): gpt-4o's letter classes without its
# contractions, and digits one at a time
_TEKKEN = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
           r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
           r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# tokenizer.ggml.pre -> the regexes llama.cpp applies one after another (llama-vocab.cpp)
PRE_TOKENIZERS: dict[str, list[str]] = {
    "default": [r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
    "gpt-2": [_GPT2], "gpt2": [_GPT2], "mpt": [_GPT2], "olmo": [_GPT2], "jais": [_GPT2],
    "llama3": [_LLAMA3], "llama-v3": [_LLAMA3], "llama-bpe": [_LLAMA3], "falcon3": [_LLAMA3],
    "glm4": [_LLAMA3], "chatglm-bpe": [_LLAMA3],
    "qwen2": [_QWEN2], "qwen2.5": [_QWEN2], "qwen-2.5": [_QWEN2], "deepseek-r1-qwen": [_QWEN2], "stablelm2": [_QWEN2],
    "qwen35": [_QWEN35],
    "gpt-4o": [_GPT4O], "llama4": [_GPT4O], "tekken": [_TEKKEN],
    "smollm": [r"\p{N}", _GPT2], "starcoder": [r"\p{N}", _GPT2], "refact": [r"\p{N}", _GPT2],
    "command-r": [r"\p{N}", _GPT2], "codeshell": [r"\p{N}", _GPT2],
}


# pre-tokenizers whose files' BOS token llama.cpp ignores (special_bos_id = LLAMA_TOKEN_NULL)
NO_BOS_PRE = ("glm4", "chatglm-bpe")


class TokenizerError(VkrtError):
    """The GGUF vocabulary is missing something or uses an unsupported tokenizer kind."""


@dataclass(eq=False)   # one per model, compared and hashed by identity (caches key on it)
class Tokenizer:
    """encode(text) -> ids and decode(ids) -> text, with the model's BOS/EOS conventions."""

    hf: HFTokenizer
    kind: str
    bos_id: int | None
    eos_id: int | None
    eog_ids: frozenset[int]
    add_bos: bool
    tokens: list[str]
    token_types: list[int]

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        """Token ids of `text`; BOS first when the model asks for it and add_special is set."""
        return self.with_bos(self.hf.encode(text, add_special_tokens=False).ids, add_special)

    def with_bos(self, ids: list[int], add_special: bool = True) -> list[int]:
        """`ids` of a text, with BOS first when the model asks for it and add_special is set."""
        if add_special and self.add_bos and self.bos_id is not None:
            return [self.bos_id] + ids
        return ids

    def decode(self, ids, skip_special: bool = False) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special)

    def piece_bytes(self, token: int) -> bytes:
        """The bytes one token stands for (for streaming text out token by token)."""
        return self.decode([token]).encode("utf-8", "surrogatepass")

    @staticmethod
    def from_metadata(meta: dict, cache_dir: Path | None = None) -> "Tokenizer":
        """Build from GGUF metadata values (`tokenizer.ggml.*` keys); built tokenizers are kept
        in `cache_dir` (settings.tokenizer_cache_dir; None: not cached)."""
        try:
            kind = meta["tokenizer.ggml.model"]
            tokens = list(meta["tokenizer.ggml.tokens"])
        except KeyError as exc:
            raise TokenizerError(f"GGUF metadata lacks {exc.args[0]}: no tokenizer") from None
        types = list(meta.get("tokenizer.ggml.token_type", [TOKEN_NORMAL] * len(tokens)))
        if kind not in ("gpt2", "llama"):
            raise TokenizerError(f"tokenizer.ggml.model={kind!r} is not supported (supported: gpt2, llama)")
        add_bos_default = kind == "llama"
        cached = _cache_path(meta, cache_dir)
        if cached is not None and cached.is_file():
            hf = HFTokenizer.from_str(cached.read_text())
        else:
            hf = _byte_level_bpe(meta, tokens) if kind == "gpt2" else _sentencepiece_bpe(meta, tokens, types)
            specials = [AddedToken(t, special=True, normalized=False)
                        for t, ty in zip(tokens, types) if ty in (TOKEN_CONTROL, TOKEN_USER_DEFINED) and t]
            hf.add_special_tokens(specials)
            _store(cached, hf)
        bos = meta.get("tokenizer.ggml.bos_token_id")
        if meta.get("tokenizer.ggml.pre") in NO_BOS_PRE:   # llama.cpp drops their BOS token
            bos = None
        eos = meta.get("tokenizer.ggml.eos_token_id")
        eog = {eos} if eos is not None else set()
        for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
            if meta.get(key) is not None:
                eog.add(meta[key])
        for i, t in enumerate(tokens):  # llama.cpp also ends generation on these control tokens
            if types[i] == TOKEN_CONTROL and t in ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|endoftext|>",
                                                   "<|end|>", "<|eom_id|>", "<|return|>", "<|call|>"):
                eog.add(i)
        eog -= _harmony_end(tokens, eog)
        return Tokenizer(hf, kind, bos, eos, frozenset(eog),
                         bool(meta.get("tokenizer.ggml.add_bos_token", add_bos_default)), tokens, types)


def _harmony_end(tokens: list[str], eog: set[int]) -> set[int]:
    """gpt-oss's harmony format ends a message with <|end|> and generation with <|return|> or
    <|call|>: with all three among the end-of-generation tokens, <|end|> is not one (llama.cpp)."""
    names = {tokens[i]: i for i in eog}
    return {names["<|end|>"]} if {"<|end|>", "<|return|>", "<|call|>"} <= names.keys() else set()


_CACHE_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
               "tokenizer.ggml.scores", "tokenizer.ggml.merges", "tokenizer.ggml.add_space_prefix",
               "tokenizer.ggml.unknown_token_id")
_VERSION = "1"


def _cache_path(meta: dict, cache_dir: Path | None) -> Path | None:
    """Built tokenizers are cached (SentencePiece merges take seconds to derive from scores)."""
    if cache_dir is None:
        return None
    h = hashlib.sha256(_VERSION.encode())
    for key in _CACHE_KEYS:
        value = meta.get(key)
        h.update(key.encode() + b"\0")
        h.update(("\x1f".join(map(str, value)) if isinstance(value, (list, tuple)) else repr(value)).encode("utf-8",
                                                                                                       "surrogatepass"))
    return Path(cache_dir) / f"{h.hexdigest()}.json"


def _store(path: Path | None, hf: HFTokenizer) -> None:
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(hf.to_str())
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("cannot cache the tokenizer at %s: %s", path, exc)


def _byte_level_bpe(meta: dict, tokens: list[str]) -> HFTokenizer:
    merges_raw = meta.get("tokenizer.ggml.merges")
    if merges_raw is None:
        raise TokenizerError("a gpt2 (BPE) tokenizer needs tokenizer.ggml.merges")
    merges = []
    for m in merges_raw:
        left, sep, right = m.partition(" ")
        if not sep:
            raise TokenizerError(f"malformed BPE merge {m!r}")
        merges.append((left, right))
    vocab = {t: i for i, t in enumerate(tokens)}
    hf = HFTokenizer(models.BPE(vocab, merges, ignore_merges=False))
    pre = meta.get("tokenizer.ggml.pre", "default")
    regexes = PRE_TOKENIZERS.get(pre)
    if regexes is None:
        raise TokenizerError(f"tokenizer.ggml.pre={pre!r} is not supported (supported: {', '.join(sorted(PRE_TOKENIZERS))})")
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    hf.decoder = decoders.ByteLevel()
    return hf


def _sentencepiece_bpe(meta: dict, tokens: list[str], types: list[int]) -> HFTokenizer:
    scores = meta.get("tokenizer.ggml.scores")
    if scores is None:
        raise TokenizerError("a llama (SentencePiece) tokenizer needs tokenizer.ggml.scores")
    vocab = {t: i for i, t in enumerate(tokens)}
    # merges in the order SentencePiece applies them: the merged piece's score, best first
    pairs = []
    for piece, i in vocab.items():
        if types[i] not in (TOKEN_NORMAL, TOKEN_USER_DEFINED) or len(piece) < 2:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                pairs.append((-scores[i], vocab[left], vocab[right], left, right))
    pairs.sort()
    merges = [(left, right) for *_, left, right in pairs]
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if unk_id is not None else None
    hf = HFTokenizer(models.BPE(vocab, merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
    norm = [normalizers.Replace(" ", "\u2581")]
    if meta.get("tokenizer.ggml.add_space_prefix", True):
        norm.insert(0, normalizers.Prepend("\u2581"))
    hf.normalizer = normalizers.Sequence(norm)
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if meta.get("tokenizer.ggml.add_space_prefix", True):
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    hf.decoder = decoders.Sequence(steps)
    return hf
