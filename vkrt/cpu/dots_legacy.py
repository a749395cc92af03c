"""Row dot products of the 32-value block types against q8_0 activations.

Every dot function has one signature: dot(w, o, q, d, s, nb) -> float32, the dot product of the
row whose `nb` blocks start at byte `o` of the uint8 array `w` with the q8_0 activation row
(q int8 values, d float32 per 32, s int32 sum per 32)."""

from __future__ import annotations

import numpy as np
from numba import njit

from .simd import dot_field, dot_i8
from .tables import F16


@njit(inline="always")
def _f16(w, o):
    return F16[np.int64(w[o]) | (np.int64(w[o + 1]) << 8)]


@njit(inline="always")
def dot_q4_0(w, o, q, d, s, nb):
    """Q4_0: fp16 d, 16 bytes of nibbles (low: values 0-15, high: 16-31), value (n - 8) d."""
    acc = np.float32(0)
    for b in range(nb):
        bo = o + b * 18
        xo = b * 32
        i = dot_field(w, bo + 2, 0, 15, q, xo, 16) + dot_field(w, bo + 2, 4, 15, q, xo + 16, 16) - 8 * s[b]
        acc += _f16(w, bo) * d[b] * np.float32(i)
    return acc


@njit(inline="always")
def dot_q8_0(w, o, q, d, s, nb):
    """Q8_0: fp16 d, 32 int8 values."""
    acc = np.float32(0)
    for b in range(nb):
        bo = o + b * 34
        acc += _f16(w, bo) * d[b] * np.float32(dot_i8(w, bo + 2, q, b * 32, 32))
    return acc


DOTS = {"Q4_0": ("q8_0", dot_q4_0), "Q8_0": ("q8_0", dot_q8_0)}
