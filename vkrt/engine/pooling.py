"""Embedding pooling and normalisation as llama.cpp does them: a sequence's per-token hidden
states (Engine.hidden_states) become one vector (mean, cls: the first token, last) or stay one a
token (none); common_embd_normalize's norms."""

from __future__ import annotations

import numpy as np

# ggml's llama_pooling_type, by the value GGUF files store in {arch}.pooling_type
POOLING = ("none", "mean", "cls", "last", "rank")


def default_pooling(metadata: dict, arch: str) -> str:
    """The pooling a file asks for; llama.cpp's default without the key (decoder models): none."""
    value = metadata.get(f"{arch}.pooling_type")
    if isinstance(value, int) and 0 <= value < len(POOLING):
        return POOLING[value]
    return "none"


def pool(rows: np.ndarray, pooling: str) -> np.ndarray:
    """[n_tokens, n_embd] hidden states -> [1, n_embd] (mean, cls, last) or all rows (none)."""
    if pooling == "none":
        return rows
    if pooling == "mean":
        return rows.mean(axis=0, dtype=np.float64, keepdims=True).astype(np.float32)
    if pooling == "cls":
        return rows[:1]
    if pooling == "last":
        return rows[-1:]
    raise ValueError(f"pooling {pooling!r} is not one vkrt computes (none, mean, cls, last)")


def normalize(v: np.ndarray, norm: int) -> np.ndarray:
    """common_embd_normalize: -1 none, 0 max-abs scaled to int16's range, 2 euclidean, p > 0
    the p-norm (1: taxicab); a zero vector stays zero."""
    x = np.asarray(v, np.float64)
    if norm == -1:
        total = 1.0
    elif norm == 0:
        total = np.abs(x).max(initial=0.0) / 32760.0
    elif norm == 2:
        total = np.sqrt((x * x).sum())
    else:
        total = (np.abs(x) ** norm).sum() ** (1.0 / norm)
    scale = 1.0 / total if total > 0 else 0.0
    return (x * scale).astype(np.float32)
