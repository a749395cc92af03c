"""The grid i-quants' CPU dot products against gguf.quants.dequantize."""

import gguf
import numpy as np
import pytest
from numba import njit

from vkrt.cpu import iq_grids
from vkrt.cpu.simd_iq import dot_grid, dot_signed_grid

from .dot_check import check_dot, random_rows

pytestmark = pytest.mark.op

TYPES = ["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S"]

# type -> (our packed grid, bits of a stored grid index, bits of a stored sign field): random
# bytes make valid blocks when every index value has an entry
INDEX_BITS = {
    "IQ2_XXS": (iq_grids.GRID_IQ2_XXS, 8, 7),
    "IQ2_XS": (iq_grids.GRID_IQ2_XS, 9, 7),
    "IQ2_S": (iq_grids.GRID_IQ2_S, 10, 8),
    "IQ3_XXS": (iq_grids.GRID_IQ3_XXS, 8, 7),
    "IQ3_S": (iq_grids.GRID_IQ3_S, 9, 8),
}


@pytest.mark.parametrize("type_name", TYPES)
def test_dot_random_blocks(type_name):
    check_dot(type_name, random_rows(type_name, 16, 512))


@pytest.mark.parametrize("type_name", TYPES)
def test_every_stored_index_has_a_grid_entry(type_name):
    grid, index_bits, sign_bits = INDEX_BITS[type_name]
    cls = getattr(gguf.quants, type_name)
    assert grid.size == cls.grid_shape[0] == 1 << index_bits
    assert sign_bits == 8 or iq_grids.KSIGNS.size == 1 << sign_bits


@pytest.mark.parametrize("type_name", TYPES)
def test_grid_matches_gguf(type_name):
    grid = INDEX_BITS[type_name][0]
    cls = getattr(gguf.quants, type_name)
    cls.init_grid()
    unpacked = grid.view(np.uint8).reshape(cls.grid_shape).astype(np.float32)
    np.testing.assert_array_equal(unpacked, np.asarray(cls.grid).reshape(cls.grid_shape))


@pytest.mark.parametrize("type_name,signed", [("IQ2_XXS", iq_grids.SIGNED_IQ2_XXS),
                                              ("IQ2_XS", iq_grids.SIGNED_IQ2_XS)])
def test_signed_grid_is_grid_times_signs(type_name, signed):
    grid, index_bits, sign_bits = INDEX_BITS[type_name]
    assert signed.size == 1 << (index_bits + sign_bits)
    values = grid.view(np.uint8).reshape(-1, 8).astype(np.int64)
    rng = np.random.default_rng(5)
    for code in rng.integers(0, signed.size, 64):
        negate = (int(iq_grids.KSIGNS[code >> index_bits]) >> np.arange(8)) & 1
        entry = values[code & ((1 << index_bits) - 1)]
        expect = np.where(negate, -entry, entry)
        assert np.array_equal(signed[code:code + 1].view(np.int8), expect)


def test_ksigns_have_even_parity():
    ks = iq_grids.KSIGNS.astype(np.int64)
    assert np.array_equal(ks & 127, np.arange(128))
    assert all(int(v).bit_count() % 2 == 0 for v in ks)


@njit
def _unsigned_dots(g8, g4, x):
    return (dot_grid(g8, (3, 200, 17, 255), np.uint32(0xA5F0_0FF1), (31, 1), x, 5),
            dot_grid(g4, (0, 7, 100, 255, 1, 2, 3, 4), np.uint32(0x8000_0001), (29,), x, 0))


@njit
def _signed_dots(g8, g4, x):
    return (dot_signed_grid(g8, (3, 40000, 17, 65535), (31, 1), x, 5),
            dot_signed_grid(g4, (0, 7, 100, 255, 1, 2, 3, 4), (29,), x, 0))


def _grid_dot(grid, idx, signs, scales, x, xo):
    v = grid[list(idx)].view(np.int8).astype(np.int64)
    v = np.where((signs >> np.arange(32)) & 1, -v, v) * np.repeat(scales, 32 // len(scales))
    return int(v @ x[xo:xo + 32].astype(np.int64))


def test_grid_dots_against_numpy():
    x = np.random.default_rng(3).integers(-127, 128, 64).astype(np.int8)
    g8, g4 = iq_grids.GRID_IQ2_XXS, iq_grids.GRID_IQ3_XXS
    assert _unsigned_dots(g8, g4, x) == (_grid_dot(g8, (3, 200, 17, 255), 0xA5F0_0FF1, (31, 1), x, 5),
                                         _grid_dot(g4, (0, 7, 100, 255, 1, 2, 3, 4), 0x8000_0001, (29,), x, 0))
    s8 = iq_grids.SIGNED_IQ2_XS
    s4 = s8[40000:40128].view(np.uint32)   # 4-byte entries with both signs
    assert (s4.view(np.int8) < 0).any() and (s4.view(np.int8) > 0).any()
    assert _signed_dots(s8, s4, x) == (_grid_dot(s8, (3, 40000, 17, 65535), 0, (31, 1), x, 5),
                                       _grid_dot(s4, (0, 7, 100, 255, 1, 2, 3, 4), 0, (29,), x, 0))
