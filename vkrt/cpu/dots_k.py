"""Row dot products of the 256-value super-block types (k-quants, IQ4_XS) against q8_K
activations. Signature as in dots_legacy: dot(w, o, q, d, s, nb) -> float32, with q8_K's d (one
float per 256 values) and s (the int32 sum of every 16 values). Each 32 values are one
simd_k.mac_fields (or mac_lut_nibbles) call with their scales; the mins and the signed offsets
go through s. A block's 8 calls sit in two nested constant loops (2 x 4 or 4 x 2), the form
LLVM unrolls fully, so that every shift and offset is a constant (a single loop of 8 runs at
half the speed). Whether the s terms sit beside the calls or in a loop of their own is what
measured faster for each type (it moves Q3_K, Q5_K and Q6_K by a sixth to a third)."""

from __future__ import annotations

import numpy as np
from numba import njit

from .dots_legacy import IQ4_NL_VALUES
from .simd_k import acc_sum, acc_zero, mac_fields, mac_lut_nibbles
from .tables import F16


@njit(inline="always")
def _f16(w, o):
    return F16[np.int64(w[o]) | (np.int64(w[o + 1]) << 8)]


@njit(inline="always")
def _u32(w, o):
    return np.int64(w[o]) | (np.int64(w[o + 1]) << 8) | (np.int64(w[o + 2]) << 16) | (np.int64(w[o + 3]) << 24)


@njit(inline="always")
def _scale_min_k4(j, w, so):
    """Q4_K / Q5_K: the 6-bit scale and min of sub-block j from the 12 packed bytes at so."""
    if j < 4:
        return np.int32(w[so + j] & 63), np.int32(w[so + j + 4] & 63)
    sc = (np.int32(w[so + j + 4]) & 15) | ((np.int32(w[so + j - 4]) >> 6) << 4)
    mn = (np.int32(w[so + j + 4]) >> 4) | ((np.int32(w[so + j]) >> 6) << 4)
    return sc, mn


@njit(inline="always")
def _scales_q3_k(w, so):
    """Q3_K: the 16 6-bit scales (before their -32) from the 12 packed bytes at so, as the bytes of
    two int64 (scales 0-7, 8-15): low nibbles from bytes 0-7 (scales 0-7 the low, 8-15 the high
    nibbles), high bit pairs from bytes 8-11 (pair k of byte j: scale 4 k + j)."""
    a0, a1, a2 = _u32(w, so), _u32(w, so + 4), _u32(w, so + 8)
    lo = (a0 & 0x0F0F0F0F) | ((a2 & 0x03030303) << 4) | (((a1 & 0x0F0F0F0F) | (((a2 >> 2) & 0x03030303) << 4)) << 32)
    hi = (((a0 >> 4) & 0x0F0F0F0F) | (((a2 >> 4) & 0x03030303) << 4)) \
        | ((((a1 >> 4) & 0x0F0F0F0F) | (((a2 >> 6) & 0x03030303) << 4)) << 32)
    return lo, hi


@njit(inline="always")
def dot_q2_k(w, o, q, d, s, nb):
    """Q2_K: 16 scale bytes (low nibble scale, high nibble min of each 16 values), 64 bytes of
    2-bit values, fp16 d, fp16 dmin; each 128 values are 32 bytes whose 4 bit pairs are 4 runs of
    32; value d sc n - dmin mn."""
    acc = np.float32(0)
    for b in range(nb):
        bo = o + b * 84
        xo = b * 256
        a = acc_zero()
        for h in range(2):
            for l in range(4):
                c = 4 * h + l
                a = mac_fields(a, w, bo + 16 + 32 * h, 2 * l, 2, bo, 0, 0, q, xo + 32 * c,
                               w[bo + 2 * c] & 15, w[bo + 2 * c + 1] & 15)
        msum = np.int32(0)
        for i in range(16):
            msum += np.int32(w[bo + i] >> 4) * s[b * 16 + i]
        acc += d[b] * (_f16(w, bo + 80) * np.float32(acc_sum(a)) - _f16(w, bo + 82) * np.float32(msum))
    return acc


@njit(inline="always")
def dot_q3_k(w, o, q, d, s, nb):
    """Q3_K: 32 bytes of high bits (bit l of byte j: value 32 l + j), 64 bytes of 2-bit values as
    Q2_K, 12 bytes of 6-bit scales less 32, fp16 d; value d sc (n + 4 hbit - 4)."""
    acc = np.float32(0)
    for b in range(nb):
        bo = o + b * 110
        xo = b * 256
        scales = _scales_q3_k(w, bo + 96)
        a = acc_zero()
        for h in range(2):
            for l in range(4):
                c = 4 * h + l
                sc0 = ((scales[h] >> (16 * l)) & 63) - 32
                sc1 = ((scales[h] >> (16 * l + 8)) & 63) - 32
                a = mac_fields(a, w, bo + 32 + 32 * h, 2 * l, 2, bo, c, 1, q, xo + 32 * c, sc0, sc1)
        osum = np.int32(0)
        for i in range(16):
            osum += (((scales[i >> 3] >> (8 * (i & 7))) & 63) - 32) * s[b * 16 + i]
        acc += d[b] * _f16(w, bo + 108) * np.float32(acc_sum(a) - 4 * osum)
    return acc


@njit(inline="always")
def _dot_k45(w, o, q, d, s, nb, size, high):
    """Q4_K (high 0) and Q5_K (high 1): fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins,
    with Q5_K 32 bytes of high bits (bit l of byte j: value 32 l + j), then 128 bytes of nibbles,
    each 64 values 32 bytes, low nibbles then high; value d sc (n + 16 hbit) - dmin mn."""
    acc = np.float32(0)
    for b in range(nb):
        bo = o + b * size
        xo = b * 256
        a = acc_zero()
        for p in range(4):
            for n in range(2):
                c = 2 * p + n
                sc = _scale_min_k4(c, w, bo + 4)[0]
                a = mac_fields(a, w, bo + 16 + 32 * high + 32 * p, 4 * n, 4, bo + 16 * high, c * high, high, q,
                               xo + 32 * c, sc, sc)
        msum = np.int32(0)
        for c in range(8):
            msum += _scale_min_k4(c, w, bo + 4)[1] * (s[b * 16 + 2 * c] + s[b * 16 + 2 * c + 1])
        acc += d[b] * (_f16(w, bo) * np.float32(acc_sum(a)) - _f16(w, bo + 2) * np.float32(msum))
    return acc


@njit(inline="always")
def dot_q4_k(w, o, q, d, s, nb):
    """Q4_K (see _dot_k45)."""
    return _dot_k45(w, o, q, d, s, nb, 144, 0)


@njit(inline="always")
def dot_q5_k(w, o, q, d, s, nb):
    """Q5_K (see _dot_k45)."""
    return _dot_k45(w, o, q, d, s, nb, 176, 1)


@njit(inline="always")
def dot_q6_k(w, o, q, d, s, nb):
    """Q6_K: 128 bytes of low nibbles (each 128 values: 64 bytes, low nibbles then high), 64 bytes
    of high bit pairs (each 128 values: 32 bytes, 4 pairs), 16 int8 scales, fp16 d; value
    d sc (n - 32)."""
    acc = np.float32(0)
    for b in range(nb):
        bo = o + b * 210
        xo = b * 256
        a = acc_zero()
        osum = np.int32(0)
        for h in range(2):
            for l in range(4):
                c = 4 * h + l
                sc0, sc1 = np.int32(np.int8(w[bo + 192 + 2 * c])), np.int32(np.int8(w[bo + 193 + 2 * c]))
                a = mac_fields(a, w, bo + 64 * h + 32 * (l & 1), 4 * (l >> 1), 4, bo + 128 + 32 * h, 2 * l, 2,
                               q, xo + 32 * c, sc0, sc1)
                osum += sc0 * s[b * 16 + 2 * c] + sc1 * s[b * 16 + 2 * c + 1]
        acc += d[b] * _f16(w, bo + 208) * np.float32(acc_sum(a) - 32 * osum)
    return acc


@njit(inline="always")
def dot_iq4_xs(w, o, q, d, s, nb):
    """IQ4_XS: fp16 d, 2 bytes of the scales' high bit pairs, 4 bytes of their low nibbles, 128
    bytes of table indices (each 32 values: 16 bytes, low nibbles then high); value
    d (sc - 32) IQ4_NL_VALUES[n]."""
    acc = np.float32(0)
    for b in range(nb):
        bo = o + b * 136
        xo = b * 256
        hi = np.int32(w[bo + 2]) | (np.int32(w[bo + 3]) << 8)
        a = acc_zero()
        for p in range(4):
            for n in range(2):
                c = 2 * p + n
                sc = ((np.int32(w[bo + 4 + p]) >> (4 * n)) & 15) | (((hi >> (2 * c)) & 3) << 4)
                a = mac_lut_nibbles(a, w, bo + 8 + 16 * c, IQ4_NL_VALUES, q, xo + 32 * c, sc - 32)
        acc += d[b] * _f16(w, bo) * np.float32(acc_sum(a))
    return acc


DOTS = {"Q2_K": ("q8_K", dot_q2_k), "Q3_K": ("q8_K", dot_q3_k), "Q4_K": ("q8_K", dot_q4_k),
        "Q5_K": ("q8_K", dot_q5_k), "Q6_K": ("q8_K", dot_q6_k), "IQ4_XS": ("q8_K", dot_iq4_xs)}
