"""The super-block types' CPU dot products against gguf.quants.dequantize, and the simd_k
intrinsics under them against numpy on every code path this host runs."""

import numpy as np
import pytest
from numba import njit
from numba.core.errors import TypingError

from vkrt.cpu.simd_k import PATHS, acc_sum, acc_zero, host_path, scaled_dots

from .dot_check import check_dot, random_rows

pytestmark = pytest.mark.op

# byte offsets of each type's fp16 fields in its block (gguf-py's quants.py layouts)
F16_FIELDS = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "IQ4_XS": (0,)}

RUNNABLE_PATHS = PATHS[PATHS.index(host_path()):]   # an AVX2 host runs the SSSE3 and portable code too

# (lo_shift, lo_bits, hi_shift, hi_bits) as the k-quants take them: Q4_K, Q5_K, Q2_K, Q3_K, Q6_K
FIELDS = [(4, 4, 0, 0), (0, 4, 7, 1), (6, 2, 0, 0), (2, 2, 5, 1), (4, 4, 6, 2)]


@pytest.mark.parametrize("type_name", sorted(F16_FIELDS))
def test_dot_random_blocks(type_name):
    check_dot(type_name, random_rows(type_name, 16, 512, F16_FIELDS[type_name]))


def _kernels(path):
    dots = scaled_dots(path)
    mac_fields, mac_lut_nibbles = dots.mac_fields, dots.mac_lut_nibbles

    @njit
    def fields(w, fields_, x, scales):
        a = acc_zero()
        for k in range(fields_.shape[0]):
            ls, lb, hs, hb = fields_[k]
            a = mac_fields(a, w, 32 * k, ls, lb, 32 * k + 7, hs, hb, x, 32 * k, scales[k, 0], scales[k, 1])
        return acc_sum(a)

    @njit
    def lut_nibbles(w, lut, x, scales):
        a = acc_zero()
        for k in range(scales.size):
            a = mac_lut_nibbles(a, w, 16 * k, lut, x, 32 * k, scales[k])
        return acc_sum(a)

    return fields, lut_nibbles


def _fields_reference(w, fields_, x, scales):
    total = 0
    for k, (ls, lb, hs, hb) in enumerate(fields_):
        lo = (w[32 * k:32 * k + 32].astype(np.int64) >> ls) & ((1 << lb) - 1)
        hi = (w[32 * k + 7:32 * k + 39].astype(np.int64) >> hs) & ((1 << hb) - 1)
        v = (lo | (hi << lb)) * x[32 * k:32 * k + 32]
        total += scales[k, 0] * v[:16].sum() + scales[k, 1] * v[16:].sum()
    return total


@pytest.mark.parametrize("path", RUNNABLE_PATHS)
def test_mac_fields_paths(path):
    rng = np.random.default_rng(3)
    fields, _ = _kernels(path)
    fields_ = np.array(FIELDS, np.int64)
    n = len(FIELDS) * 32 + 8
    for w, x in [(rng.integers(0, 256, n, dtype=np.uint8), rng.integers(-127, 128, n).astype(np.int8)),
                 (np.full(n, 255, np.uint8), np.full(n, 127, np.int8)),      # the largest pair sums
                 (np.full(n, 255, np.uint8), np.full(n, -127, np.int8))]:
        scales = rng.integers(-128, 128, (len(FIELDS), 2)).astype(np.int32)
        assert fields(w, fields_, x, scales) == _fields_reference(w, fields_, x.astype(np.int64), scales)


@pytest.mark.parametrize("path", RUNNABLE_PATHS)
def test_mac_lut_nibbles_paths(path):
    rng = np.random.default_rng(4)
    _, lut_nibbles = _kernels(path)
    lut = rng.integers(-127, 128, 16).astype(np.int8)
    lut[[0, 15]] = -127, 127
    blocks = 6
    for w, x in [(rng.integers(0, 256, 16 * blocks, dtype=np.uint8), rng.integers(-127, 128, 32 * blocks).astype(np.int8)),
                 (np.full(16 * blocks, 0xF0, np.uint8), np.tile(np.repeat(np.int8([-127, 127]), 16), blocks))]:
        scales = rng.integers(-32, 32, blocks).astype(np.int32)
        n = np.stack([w.reshape(blocks, 16) & 15, w.reshape(blocks, 16) >> 4], 1).reshape(blocks, 32)
        ref = (scales[:, None] * lut[n].astype(np.int64) * x.reshape(blocks, 32)).sum()
        assert lut_nibbles(w, lut, x, scales) == ref


def test_scaled_dots_refuses_unknown_path():
    with pytest.raises(ValueError, match="unknown code path 'neon'"):
        scaled_dots("neon")


def test_mac_fields_names_a_wrong_argument():
    mac_fields = scaled_dots("portable").mac_fields

    @njit
    def wrong(w, x):
        return acc_sum(mac_fields(acc_zero(), w, 0, 0, 4, 0, 0, 0, x, 0, 1, 1))

    with pytest.raises(TypingError, match="mac_fields: x must be a 1-d int8 array, got array\\(float32"):
        wrong(np.zeros(32, np.uint8), np.zeros(32, np.float32))
