"""Row dot products of the grid i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) against q8_K
activations. Signature as in dots_k: dot(w, o, q, d, s, nb) -> float32 over `nb` 256-value
blocks. Each 8 (IQ2) or 4 (IQ3) values are one grid entry (iq_grids) with a sign per value; the
block's fp16 d sits at byte 0 and its 4-bit sub-block scales sc give d (2 sc + 1) / 8 (IQ2),
d (2 sc + 1) / 4 (IQ3_XXS) or d (2 sc + 1) (IQ3_S), so the integer dots take (2 sc + 1) and
the block's float scale the rest. Every dot_grid call covers 32 values; IQ2_XXS and IQ2_XS
read their values pre-signed (iq_grids.SIGNED_*, dot_signed_grid), the others flip the
activations' signs by mask (dot_grid)."""

from __future__ import annotations

import numpy as np
from numba import njit

from .iq_grids import (
    GRID_IQ2_S,
    GRID_IQ3_S,
    GRID_IQ3_XXS,
    KSIGNS,
    SIGNED_IQ2_XS,
    SIGNED_IQ2_XXS,
)
from .simd_iq import dot_grid, dot_signed_grid, read_le
from .tables import F16


@njit(inline="always")
def _ksigns4(a):
    """The 32 sign bits of four 7-bit sign indices packed in the low 28 bits of a."""
    return (np.int64(KSIGNS[a & 127]) | (np.int64(KSIGNS[(a >> 7) & 127]) << 8)
            | (np.int64(KSIGNS[(a >> 14) & 127]) << 16) | (np.int64(KSIGNS[(a >> 21) & 127]) << 24))


@njit(inline="always")
def _bytes4(v, k):
    """Bytes 4k to 4k + 3 of the int64 v."""
    return (v >> (32 * k)) & 255, (v >> (32 * k + 8)) & 255, (v >> (32 * k + 16)) & 255, (v >> (32 * k + 24)) & 255


@njit(inline="always")
def _odd(scales, j):
    """2 sc + 1 of the 4-bit field j of the packed scales."""
    return 2 * ((scales >> (4 * j)) & 15) + 1


@njit(inline="always")
def dot_iq2_xxs(w, o, q, d, s, nb):
    """IQ2_XXS (66 bytes): fp16 d, then per 32 values 4 grid indices (bytes) and a uint32 of four
    7-bit sign indices and the 4-bit scale (bits 28-31)."""
    acc = np.float32(0)
    for b in range(nb):
        bo = o + b * 66
        isum = np.int32(0)
        for g in range(8):
            v = read_le(w, bo + 2 + 8 * g, 8)
            signs = v >> 24   # sign index k at bits 8 + 7k
            idx = ((v & 255) | (signs & 0x7F00), ((v >> 8) & 255) | ((signs >> 7) & 0x7F00),
                   ((v >> 16) & 255) | ((signs >> 14) & 0x7F00), ((v >> 24) & 255) | ((signs >> 21) & 0x7F00))
            sc = 2 * ((v >> 60) & 15) + 1
            isum += dot_signed_grid(SIGNED_IQ2_XXS, idx, (sc,), q, b * 256 + 32 * g)
        acc += d[b] * F16[read_le(w, bo, 2)] * np.float32(0.125) * np.float32(isum)
    return acc


@njit(inline="always")
def dot_iq2_xs(w, o, q, d, s, nb):
    """IQ2_XS (74 bytes): fp16 d, 32 uint16 (9-bit grid index, 7-bit sign index above it) for 8
    values each, 8 bytes of 4-bit scales, one per 16 values."""
    acc = np.float32(0)
    for b in range(nb):
        bo = o + b * 74
        scales = read_le(w, bo + 66, 8)
        isum = np.int32(0)
        for g in range(8):
            v = read_le(w, bo + 2 + 8 * g, 8)
            idx = (v & 0xFFFF, (v >> 16) & 0xFFFF, (v >> 32) & 0xFFFF, (v >> 48) & 0xFFFF)
            sc = (_odd(scales, 2 * g), _odd(scales, 2 * g + 1))
            isum += dot_signed_grid(SIGNED_IQ2_XS, idx, sc, q, b * 256 + 32 * g)
        acc += d[b] * F16[read_le(w, bo, 2)] * np.float32(0.125) * np.float32(isum)
    return acc


@njit(inline="always")
def dot_iq2_s(w, o, q, d, s, nb):
    """IQ2_S (82 bytes): fp16 d, 32 low index bytes, 32 sign bytes (one per 8 values), 8 bytes of
    the indices' 2 high bits (4 a byte), 8 bytes of 4-bit scales, one per 16 values."""
    acc = np.float32(0)
    for b in range(nb):
        bo = o + b * 82
        scales = read_le(w, bo + 74, 8)
        isum = np.int32(0)
        for g in range(8):
            lo = read_le(w, bo + 2 + 4 * g, 4)
            hi = read_le(w, bo + 66 + g, 2)   # its low byte: the high bits of these 4 entries
            idx = ((lo & 255) | ((hi & 3) << 8), ((lo >> 8) & 255) | ((hi & 12) << 6),
                   ((lo >> 16) & 255) | ((hi & 48) << 4), (lo >> 24) | ((hi & 192) << 2))
            sc = (_odd(scales, 2 * g), _odd(scales, 2 * g + 1))
            isum += dot_grid(GRID_IQ2_S, idx, read_le(w, bo + 34 + 4 * g, 4), sc, q, b * 256 + 32 * g)
        acc += d[b] * F16[read_le(w, bo, 2)] * np.float32(0.125) * np.float32(isum)
    return acc


@njit(inline="always")
def dot_iq3_xxs(w, o, q, d, s, nb):
    """IQ3_XXS (98 bytes): fp16 d, 64 grid index bytes (4 values each), then per 32 values a
    uint32 of four 7-bit sign indices and the 4-bit scale (bits 28-31)."""
    acc = np.float32(0)
    for b in range(nb):
        bo = o + b * 98
        isum = np.int32(0)
        for g in range(8):
            v = read_le(w, bo + 2 + 8 * g, 8)
            aux = read_le(w, bo + 66 + 4 * g, 4)
            sc = 2 * (aux >> 28) + 1
            isum += dot_grid(GRID_IQ3_XXS, _bytes4(v, 0) + _bytes4(v, 1), _ksigns4(aux), (sc,), q, b * 256 + 32 * g)
        acc += d[b] * F16[read_le(w, bo, 2)] * np.float32(0.25) * np.float32(isum)
    return acc


@njit(inline="always")
def dot_iq3_s(w, o, q, d, s, nb):
    """IQ3_S (110 bytes): fp16 d, 64 low index bytes (4 values each), 8 bytes of the indices'
    high bits (one a bit), 32 sign bytes, 4 bytes of 4-bit scales, one per 32 values."""
    acc = np.float32(0)
    for b in range(nb):
        bo = o + b * 110
        high = read_le(w, bo + 66, 8)
        scales = read_le(w, bo + 106, 4)
        isum = np.int32(0)
        for g in range(8):
            v = read_le(w, bo + 2 + 8 * g, 8)
            h = (high >> (8 * g)) << 8
            idx = ((v & 255) | (h & 256), ((v >> 8) & 255) | ((h >> 1) & 256),
                   ((v >> 16) & 255) | ((h >> 2) & 256), ((v >> 24) & 255) | ((h >> 3) & 256),
                   ((v >> 32) & 255) | ((h >> 4) & 256), ((v >> 40) & 255) | ((h >> 5) & 256),
                   ((v >> 48) & 255) | ((h >> 6) & 256), ((v >> 56) & 255) | ((h >> 7) & 256))
            isum += dot_grid(GRID_IQ3_S, idx, read_le(w, bo + 74 + 4 * g, 4), (_odd(scales, g),), q, b * 256 + 32 * g)
        acc += d[b] * F16[read_le(w, bo, 2)] * np.float32(isum)
    return acc


DOTS = {
    "IQ2_XXS": ("q8_K", dot_iq2_xxs),
    "IQ2_XS": ("q8_K", dot_iq2_xs),
    "IQ2_S": ("q8_K", dot_iq2_s),
    "IQ3_XXS": ("q8_K", dot_iq3_xxs),
    "IQ3_S": ("q8_K", dot_iq3_s),
}
