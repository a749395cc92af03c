"""float64 numpy references of the gated delta rule (Gated DeltaNet, as llama.cpp runs qwen35):
a token-by-token loop, and the chunked (WY / UT) algorithm the chunked kernels implement.

Arrays are in numpy order (the reverse of ggml's ne): qkv [T, conv_dim], alpha and beta [T, Hv],
dt_bias and ssm_a [Hv], state [n_slots, Hv, D, D] with state[slot, h, i, j] = S_h[i][j] (i value
row, j key column), slots [n_seqs]; the output is [T, Hv * D]. T = n_seqs * tokens per sequence.
"""

from __future__ import annotations

import numpy as np


def softplus(x):
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def gdn_inputs(qkv, alpha, beta, dt_bias, ssm_a, *, n_k_heads: int, n_v_heads: int, head_dim: int, eps: float):
    """Per token and value head: q (L2-normalised, / sqrt(D)), k (L2-normalised), v [T, Hv, D];
    the log-decay g and the write strength b [T, Hv]. Key head of value head h: h % n_k_heads."""
    hk, hv, d = n_k_heads, n_v_heads, head_dim
    x = np.asarray(qkv, np.float64)
    n = x.shape[0]
    q = x[:, :hk * d].reshape(n, hk, d)
    k = x[:, hk * d:2 * hk * d].reshape(n, hk, d)
    v = x[:, 2 * hk * d:].reshape(n, hv, d)
    q = q / np.maximum(np.linalg.norm(q, axis=-1, keepdims=True), eps) / np.sqrt(d)
    k = k / np.maximum(np.linalg.norm(k, axis=-1, keepdims=True), eps)
    kh = np.arange(hv) % hk
    g = softplus(np.asarray(alpha, np.float64) + np.asarray(dt_bias, np.float64)) * np.asarray(ssm_a, np.float64)
    b = 1.0 / (1.0 + np.exp(-np.asarray(beta, np.float64)))
    return q[:, kh], k[:, kh], v, g, b


def _setup(qkv, alpha, beta, dt_bias, ssm_a, state, n_k_heads, n_v_heads, head_dim, n_seqs, eps):
    """Inputs per token and head, the output array, a float64 copy of the state, tokens a sequence."""
    q, k, v, g, b = gdn_inputs(qkv, alpha, beta, dt_bias, ssm_a, n_k_heads=n_k_heads, n_v_heads=n_v_heads,
                               head_dim=head_dim, eps=eps)
    out = np.zeros((q.shape[0], n_v_heads, head_dim))
    return q, k, v, g, b, out, np.array(state, np.float64), q.shape[0] // n_seqs


def delta_net_loop(qkv, alpha, beta, dt_bias, ssm_a, state, slots, *, n_k_heads, n_v_heads, head_dim, n_seqs,
                   eps):
    """(out [T, Hv * D], new state) by the recurrence, one token at a time."""
    q, k, v, g, b, out, new_state, per = _setup(qkv, alpha, beta, dt_bias, ssm_a, state, n_k_heads, n_v_heads,
                                                head_dim, n_seqs, eps)
    for s in range(n_seqs):
        S = new_state[slots[s]]
        for t in range(s * per, (s + 1) * per):
            for h in range(n_v_heads):
                S[h] *= np.exp(g[t, h])
                u = b[t, h] * (v[t, h] - S[h] @ k[t, h])
                S[h] += np.outer(u, k[t, h])
                out[t, h] = S[h] @ q[t, h]
    return out.reshape(len(out), -1), new_state


def chunk_step(S, q, k, v, g, b):
    """One chunk of one head: S [D, D] at the chunk's start, q/k/v [C, D], g/b [C] (padded tokens
    have k = v = 0, g = b = 0). Returns (outputs [C, D], the state after the chunk)."""
    n = len(g)
    gc = np.cumsum(g)
    diff = gc[:, None] - gc[None, :]
    decay = np.exp(np.where(np.tril(np.ones((n, n), bool)), diff, -np.inf))   # exp(gc_t - gc_s), s <= t
    L = np.tril(b[:, None] * (k @ k.T) * decay, -1)
    T = np.linalg.solve(np.eye(n) + L, np.eye(n))
    U = T @ (b[:, None] * v)
    W = T @ (b[:, None] * np.exp(gc)[:, None] * k)
    Vn = U - W @ S.T
    O = (np.exp(gc)[:, None] * q) @ S.T + (q @ k.T * decay) @ Vn
    S = np.exp(gc[-1]) * S + Vn.T @ (np.exp(gc[-1] - gc)[:, None] * k)
    return O, S


def delta_net_chunked(qkv, alpha, beta, dt_bias, ssm_a, state, slots, *, n_k_heads, n_v_heads, head_dim, n_seqs,
                      eps, chunk=64):
    """(out [T, Hv * D], new state) by the chunked algorithm: chunks of `chunk` tokens per sequence,
    the last one padded."""
    q, k, v, g, b, out, new_state, per = _setup(qkv, alpha, beta, dt_bias, ssm_a, state, n_k_heads, n_v_heads,
                                                head_dim, n_seqs, eps)
    for s in range(n_seqs):
        S = new_state[slots[s]]
        for c0 in range(0, per, chunk):
            t0, n = s * per + c0, min(chunk, per - c0)
            pad = ((0, chunk - n), (0, 0))
            for h in range(n_v_heads):
                O, S[h] = chunk_step(S[h], np.pad(q[t0:t0 + n, h], pad), np.pad(k[t0:t0 + n, h], pad),
                                     np.pad(v[t0:t0 + n, h], pad), np.pad(g[t0:t0 + n, h], (0, chunk - n)),
                                     np.pad(b[t0:t0 + n, h], (0, chunk - n)))
                out[t0:t0 + n, h] = O[:n]
    return out.reshape(len(out), -1), new_state
