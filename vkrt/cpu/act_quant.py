"""Activations quantised to q8 blocks for the integer dot products, as llama.cpp's CPU backend
does: q8_0 (32 values, one float scale) for the legacy types, q8_K (256 values, one float scale,
the sum of every 16 values) for the k-quants and i-quants.

Each quantiser fills, for the rows of x [n, K]: q int8 [n, K], d float32 [n, K / block] and
s int32 [n, K / 32] (q8_0: each block's sum) or [n, K / 16] (q8_K: every 16 values' sum)."""

from __future__ import annotations

import numpy as np
from numba import njit

FAMILIES = {"q8_0": (32, 32), "q8_K": (256, 16)}   # family -> (block, values per sum)


@njit(inline="always")
def _quantize_block(x, q, o, n):
    amax = np.float32(0)
    for j in range(n):
        a = abs(x[o + j])
        if a > amax:
            amax = a
    d = amax / np.float32(127)
    inv = np.float32(1) / d if d > 0 else np.float32(0)
    for j in range(n):
        q[o + j] = np.int8(np.rint(x[o + j] * inv))
    return d


@njit(nogil=True, cache=True)
def quantize_rows(x, q, d, s, block, per_sum):
    """Quantise every row of x in blocks of `block` values; s gets the sum of each `per_sum`
    (one thread: a step's rows are few, a parallel launch would cost more than it saves)."""
    n, K = x.shape
    for i in range(n):
        for b in range(K // block):
            d[i, b] = _quantize_block(x[i], q[i], b * block, block)
        for c in range(K // per_sum):
            total = 0
            for j in range(per_sum):
                total += q[i, c * per_sum + j]
            s[i, c] = total


def quantized(x: np.ndarray, family: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q, d, s) of the float32 rows x [n, K] in `family`'s blocks (K a multiple of the block)."""
    block, per_sum = FAMILIES[family]
    n, K = x.shape
    q = np.empty((n, K), np.int8)
    d = np.empty((n, K // block), np.float32)
    s = np.empty((n, K // per_sum), np.int32)
    quantize_rows(np.ascontiguousarray(x, dtype=np.float32), q, d, s, block, per_sum)
    return q, d, s


def dequantized(q: np.ndarray, d: np.ndarray, family: str) -> np.ndarray:
    """The float values q8 blocks stand for (the numpy reference of the dot products)."""
    block = FAMILIES[family][0]
    return (q.astype(np.float32).reshape(q.shape[0], -1, block) * d[:, :, None]).reshape(q.shape)
