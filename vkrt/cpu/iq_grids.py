"""The grid i-quants' lookup tables for the CPU dot products, built at import from gguf-py's own
tables (gguf.quants), so they match its dequantize exactly.

A grid entry is one packed integer holding its values as bytes, value j in byte j (little
endian): uint64 for the 8-value grids of IQ2_*, uint32 for the 4-value grids of IQ3_*. KSIGNS
maps the 7 stored sign bits of 8 values to the 8 sign bits (the eighth makes the parity even).

The SIGNED_ tables hold every entry of an IQ2 grid under every 7-bit sign index, the bytes int8
with the signs applied, at (sign index << bits of a grid index) | grid index: for IQ2_XS that is
the stored uint16 itself. They spare the dot products the sign decoding (256 and 512 KiB; they
measured faster than signing through KSIGNS)."""

from __future__ import annotations

import numpy as np
from gguf import quants


def _packed_grid(cls) -> np.ndarray:
    """cls's grid [entries, width] as one unsigned integer of `width` bytes per entry."""
    cls.init_grid()
    values = np.asarray(cls.grid, dtype=np.float32).reshape(cls.grid_shape)
    as_bytes = values.astype(np.uint8)
    if not np.array_equal(as_bytes.astype(np.float32), values):
        raise ValueError(f"{cls.__name__}: grid values are not bytes")
    width = cls.grid_shape[1]
    return np.ascontiguousarray(as_bytes).view(np.dtype(f"<u{width}")).reshape(-1)


GRID_IQ2_XXS = _packed_grid(quants.IQ2_XXS)   # uint64 [256]
GRID_IQ2_XS = _packed_grid(quants.IQ2_XS)     # uint64 [512]
GRID_IQ2_S = _packed_grid(quants.IQ2_S)       # uint64 [1024]
GRID_IQ3_XXS = _packed_grid(quants.IQ3_XXS)   # uint32 [256]
GRID_IQ3_S = _packed_grid(quants.IQ3_S)       # uint32 [512]

KSIGNS = np.frombuffer(quants.IQ2_XXS.ksigns, dtype=np.uint8).copy()   # [128]


def _signed_grid(grid: np.ndarray) -> np.ndarray:
    """uint64 [128 * entries]: entry i of the 8-value grid under sign index s at s * entries + i."""
    values = grid.view(np.uint8).reshape(-1, 8).astype(np.int16)
    negate = ((KSIGNS[:, None] >> np.arange(8)) & 1).astype(bool)           # [128, 8]
    signed = np.where(negate[:, None, :], -values[None], values[None]).astype(np.int8)
    return np.ascontiguousarray(signed).view(np.uint64).reshape(-1)


SIGNED_IQ2_XXS = _signed_grid(GRID_IQ2_XXS)   # uint64 [128 * 256]
SIGNED_IQ2_XS = _signed_grid(GRID_IQ2_XS)     # uint64 [128 * 512]
