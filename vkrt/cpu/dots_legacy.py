"""Row dot products of the 32-value block types against q8_0 activations.

Every dot function has one signature: dot(w, o, q, d, s, nb) -> float32, the dot product of the
row whose `nb` blocks start at byte `o` of the uint8 array `w` with the q8_0 activation row
(q int8 values, d float32 per 32, s int32 sum per 32). In every type but Q8_0 a block's 16 quant
bytes hold nibbles n, values 0-15 in the low nibbles and 16-31 in the high ones."""

from __future__ import annotations

import numpy as np
from numba import njit

from .simd import dot_i8
from .simd_lut import dot_lut_nibbles, dot_nibbles, dot_nibbles5
from .tables import E8M0_HALF, F16

IQ4_NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)
MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)   # E2M1, doubled


@njit(inline="always")
def _byte(w, o, k):
    """w[o + k] as uint32; an unsigned index, so numba adds no negative-index wraparound."""
    return np.uint32(w[np.uint64(o + k)])


@njit(inline="always")
def _f16(w, o):
    return F16[_byte(w, o, 0) | (_byte(w, o, 1) << 8)]


@njit(inline="always")
def _u32(w, o):
    return _byte(w, o, 0) | (_byte(w, o, 1) << 8) | (_byte(w, o, 2) << 16) | (_byte(w, o, 3) << 24)


@njit(inline="always")
def dot_q4_0(w, o, q, d, s, nb):
    """Q4_0: fp16 d, 16 bytes of nibbles, value (n - 8) d."""
    acc = np.float32(0)
    for b in range(nb):
        bo = o + b * 18
        i = dot_nibbles(w, bo + 2, q, b * 32) - 8 * s[b]
        acc += _f16(w, bo) * d[b] * np.float32(i)
    return acc


@njit(inline="always")
def dot_q4_1(w, o, q, d, s, nb):
    """Q4_1: fp16 d, fp16 m, 16 bytes of nibbles, value n d + m."""
    acc = np.float32(0)
    for b in range(nb):
        bo = o + b * 20
        i = dot_nibbles(w, bo + 4, q, b * 32)
        acc += d[b] * (_f16(w, bo) * np.float32(i) + _f16(w, bo + 2) * np.float32(s[b]))
    return acc


@njit(inline="always")
def dot_q5_0(w, o, q, d, s, nb):
    """Q5_0: fp16 d, 32 fifth bits h (little-endian uint32), 16 bytes of nibbles, value (n + 16 h - 16) d."""
    acc = np.float32(0)
    for b in range(nb):
        bo = o + b * 22
        i = dot_nibbles5(w, bo + 6, _u32(w, bo + 2), q, b * 32) - 16 * s[b]
        acc += _f16(w, bo) * d[b] * np.float32(i)
    return acc


@njit(inline="always")
def dot_q5_1(w, o, q, d, s, nb):
    """Q5_1: fp16 d, fp16 m, 32 fifth bits h (little-endian uint32), 16 bytes of nibbles, value (n + 16 h) d + m."""
    acc = np.float32(0)
    for b in range(nb):
        bo = o + b * 24
        i = dot_nibbles5(w, bo + 8, _u32(w, bo + 4), q, b * 32)
        acc += d[b] * (_f16(w, bo) * np.float32(i) + _f16(w, bo + 2) * np.float32(s[b]))
    return acc


@njit(inline="always")
def dot_q8_0(w, o, q, d, s, nb):
    """Q8_0: fp16 d, 32 int8 values."""
    acc = np.float32(0)
    for b in range(nb):
        bo = o + b * 34
        acc += _f16(w, bo) * d[b] * np.float32(dot_i8(w, bo + 2, q, b * 32, 32))
    return acc


@njit(inline="always")
def dot_iq4_nl(w, o, q, d, s, nb):
    """IQ4_NL: fp16 d, 16 bytes of nibbles, value IQ4_NL_VALUES[n] d."""
    acc = np.float32(0)
    for b in range(nb):
        bo = o + b * 18
        acc += _f16(w, bo) * d[b] * np.float32(dot_lut_nibbles(w, bo + 2, IQ4_NL_VALUES, q, b * 32))
    return acc


@njit(inline="always")
def dot_mxfp4(w, o, q, d, s, nb):
    """MXFP4: E8M0 exponent byte e, 16 bytes of nibbles, value MXFP4_VALUES[n] 2^(e - 128)."""
    acc = np.float32(0)
    for b in range(nb):
        bo = o + b * 17
        acc += E8M0_HALF[_byte(w, bo, 0)] * d[b] * np.float32(dot_lut_nibbles(w, bo + 1, MXFP4_VALUES, q, b * 32))
    return acc


DOTS = {
    "Q4_0": ("q8_0", dot_q4_0),
    "Q4_1": ("q8_0", dot_q4_1),
    "Q5_0": ("q8_0", dot_q5_0),
    "Q5_1": ("q8_0", dot_q5_1),
    "Q8_0": ("q8_0", dot_q8_0),
    "IQ4_NL": ("q8_0", dot_iq4_nl),
    "MXFP4": ("q8_0", dot_mxfp4),
}
