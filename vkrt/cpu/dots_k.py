"""Row dot products of the 256-value super-block types (k-quants, IQ4_XS) against q8_K
activations. Signature as in dots_legacy: dot(w, o, q, d, s, nb) -> float32, with q8_K's d (one
float per 256 values) and s (the int32 sum of every 16 values)."""

from __future__ import annotations

import numpy as np
from numba import njit

from .simd import dot_field
from .tables import F16


@njit(inline="always")
def _f16(w, o):
    return F16[np.int64(w[o]) | (np.int64(w[o + 1]) << 8)]


@njit(inline="always")
def _scale_min_k4(j, w, so):
    """Q4_K / Q5_K: the 6-bit scale and min of sub-block j from the 12 packed bytes at so."""
    if j < 4:
        return np.int32(w[so + j] & 63), np.int32(w[so + j + 4] & 63)
    sc = (np.int32(w[so + j + 4]) & 15) | ((np.int32(w[so + j - 4]) >> 6) << 4)
    mn = (np.int32(w[so + j + 4]) >> 4) | ((np.int32(w[so + j]) >> 6) << 4)
    return sc, mn


@njit(inline="always")
def dot_q4_k(w, o, q, d, s, nb):
    """Q4_K: fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles; each 64
    values are 32 bytes, low nibbles then high; value d sc n - dmin mn."""
    acc = np.float32(0)
    for b in range(nb):
        bo = o + b * 144
        qo = bo + 16
        xo = b * 256
        isum = np.int32(0)
        msum = np.int32(0)
        for j in range(4):
            sc0, m0 = _scale_min_k4(2 * j, w, bo + 4)
            sc1, m1 = _scale_min_k4(2 * j + 1, w, bo + 4)
            isum += sc0 * dot_field(w, qo + 32 * j, 0, 15, q, xo + 64 * j, 32)
            isum += sc1 * dot_field(w, qo + 32 * j, 4, 15, q, xo + 64 * j + 32, 32)
            so = b * 16 + 4 * j
            msum += m0 * (s[so] + s[so + 1]) + m1 * (s[so + 2] + s[so + 3])
        acc += d[b] * (_f16(w, bo) * np.float32(isum) - _f16(w, bo + 2) * np.float32(msum))
    return acc


DOTS = {"Q4_K": ("q8_K", dot_q4_k)}
