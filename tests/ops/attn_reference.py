"""float64 numpy reference and input builders for the attention tests (flash and non-flash).

Arrays are in numpy order: q (batch, n_head, n_q, hsk), k (batch, n_head_kv, n_kv, hsk),
v (batch, n_head_kv, n_kv, hsv), mask (nem3, nem2, n_q_padded, n_kv), out (batch, n_q, n_head, hsv).
"""

from __future__ import annotations

import numpy as np

NEG_INF = -np.inf


def alibi_slopes(n_head: int, max_bias: float) -> np.ndarray:
    if max_bias <= 0:
        return np.ones(n_head)
    n2 = 1 << int(np.floor(np.log2(n_head)))
    m0, m1 = 2.0 ** (-max_bias / n2), 2.0 ** (-(max_bias / 2.0) / n2)
    return np.array([m0 ** (h + 1) if h < n2 else m1 ** (2 * (h - n2) + 1) for h in range(n_head)])


def attention_reference(q, k, v, mask=None, *, scale, softcap=0.0, max_bias=0.0, sinks=None) -> np.ndarray:
    """softmax(softcap * tanh(scale QK^T / softcap) + slope * mask) V in float64; fully masked rows
    are 0. sinks (one a query head): exp(sink) joins each row's denominator, with no value."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    batch, n_head, n_q, _ = q.shape
    g = n_head // k.shape[1]
    kk, vv = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = q @ kk.transpose(0, 1, 3, 2) * scale
    if softcap:
        s = softcap * np.tanh(s / softcap)
    if mask is not None:
        m = np.asarray(mask, np.float64)
        slopes = alibi_slopes(n_head, max_bias)
        for b in range(batch):
            for h in range(n_head):
                s[b, h] += slopes[h] * m[b % m.shape[0], h % m.shape[1], :n_q]
    mx = s.max(axis=-1, keepdims=True)
    sink = None if sinks is None else np.asarray(sinks, np.float64)[None, :, None, None]
    if sink is not None:
        mx = np.maximum(mx, sink)
    live = np.isfinite(mx)
    e = np.where(live, np.exp(s - np.where(live, mx, 0.0)), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    if sink is not None:
        total = total + np.exp(sink - mx)
    p = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    return (p @ vv).transpose(0, 2, 1, 3)


def nmse(got: np.ndarray, ref: np.ndarray) -> float:
    """Normalised mean squared error (ggml test-backend-ops' measure)."""
    ref = np.asarray(ref, np.float64)
    return float(((np.asarray(got, np.float64) - ref) ** 2).sum() / max((ref ** 2).sum(), 1e-300))


def causal_mask(n_q: int, n_kv: int, *, pad_to: int | None = None, window: int = 0) -> np.ndarray:
    """Query i sits at position n_kv - n_q + i and sees keys up to it (and, with a window, only the
    last `window` of them). Padding rows (beyond n_q) are NaN: no kernel may read them."""
    rows = pad_to or n_q
    m = np.full((rows, n_kv), np.nan, np.float16)
    pos = n_kv - n_q + np.arange(n_q)[:, None]
    keys = np.arange(n_kv)[None, :]
    visible = keys <= pos
    if window:
        visible &= keys > pos - window
    m[:n_q] = np.where(visible, 0.0, NEG_INF)
    return m[None, None]


def alibi_mask(n_q: int, n_kv: int) -> np.ndarray:
    """Causal, with ALiBi's distance bias -(pos - key) on the visible keys (as llama.cpp builds it)."""
    dist = (n_kv - n_q + np.arange(n_q)[:, None]) - np.arange(n_kv)[None, :]
    return np.where(dist >= 0, -dist, NEG_INF).astype(np.float16)[None, None]


def random_mask(rng, n_q: int, n_kv: int, *, masked: float = 0.3, dead_rows=()) -> np.ndarray:
    """Finite random biases with a `masked` share of -inf, and rows in dead_rows fully masked."""
    m = rng.uniform(-2.0, 2.0, (n_q, n_kv))
    m[rng.random((n_q, n_kv)) < masked] = NEG_INF
    m[list(dead_rows)] = NEG_INF
    return m.astype(np.float16)[None, None]


def make_qkv(rng, *, batch=1, n_head=4, n_head_kv=2, n_q=16, n_kv=64, hsk=64, hsv=None, kv_dtype=np.float16):
    """q f32; k, v in kv_dtype holding f16-representable values (so f16 and f32 runs share a reference)."""
    hsv = hsv or hsk
    q = rng.standard_normal((batch, n_head, n_q, hsk)).astype(np.float32)
    k = rng.standard_normal((batch, n_head_kv, n_kv, hsk)).astype(np.float16).astype(kv_dtype)
    v = rng.standard_normal((batch, n_head_kv, n_kv, hsv)).astype(np.float16).astype(kv_dtype)
    return q, k, v
