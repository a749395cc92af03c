"""The 32-value block types' CPU dot products against gguf.quants.dequantize, and the nibble-block
intrinsics they are built on (simd_lut) on both code paths against numpy."""

import gguf
import numpy as np
import pytest
from numba import njit

from vkrt.cpu.simd_lut import has_ssse3, nibble_dots

from .dot_check import check_dot, random_rows

pytestmark = pytest.mark.op

F16_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "IQ4_NL": (0,), "MXFP4": ()}


def _random_mxfp4(rows, k, rng):
    """MXFP4 rows of random nibbles whose E8M0 exponents lie in 118..130 (scales 2^-10..2^2)."""
    w = random_rows("MXFP4", rows, k, f16_fields=(), rng=rng)
    w.reshape(rows, -1, 17)[:, :, 0] = rng.integers(118, 131, size=(rows, k // 32), dtype=np.uint8)
    return w


@pytest.mark.parametrize("type_name", list(F16_FIELDS))
def test_dot_random_blocks(type_name):
    rng = np.random.default_rng(7)
    if type_name == "MXFP4":
        w = _random_mxfp4(24, 512, rng)
    else:
        w = random_rows(type_name, 24, 512, f16_fields=F16_FIELDS[type_name], rng=rng)
    check_dot(type_name, w, rng=rng)


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4"])
def test_dot_quantized_weights(type_name):
    w = np.random.default_rng(1).standard_normal((8, 256)).astype(np.float32)
    w[:, ::7] *= 4   # blocks with a wide range, so every nibble and fifth bit occurs
    check_dot(type_name, gguf.quants.quantize(w, gguf.GGMLQuantizationType[type_name]))


def _nibble_kernel(x86):
    dot_nibbles, dot_nibbles5, dot_lut_nibbles = nibble_dots(x86)

    @njit
    def run(w, bits, lut, x, out):
        for i in range(out.shape[0]):
            wo = 16 * i + 1   # unaligned
            out[i, 0] = dot_nibbles(w, wo, x, 32 * i)
            out[i, 1] = dot_nibbles5(w, wo, bits[i], x, 32 * i)
            out[i, 2] = dot_lut_nibbles(w, wo, lut, x, 32 * i)

    return run


@pytest.mark.parametrize("x86", [False, pytest.param(True, marks=pytest.mark.skipif(
    not has_ssse3(), reason="needs an x86 CPU with SSSE3"))], ids=["portable", "x86"])
def test_nibble_intrinsics(x86):
    rng = np.random.default_rng(3)
    blocks = 64
    w = rng.integers(0, 256, size=16 * blocks + 1, dtype=np.uint8)
    w[1:17] = 0xFF                                      # block 0: every nibble 15
    bits = rng.integers(0, 1 << 32, size=blocks, dtype=np.uint64).astype(np.uint32)
    bits[:2] = (0xFFFFFFFF, 0)
    lut = rng.integers(-127, 128, size=16).astype(np.int8)
    lut[[0, 15]] = (-127, 127)
    x = rng.integers(-127, 128, size=32 * blocks).astype(np.int8)
    x[:32] = 127                                        # block 0 at the extreme of every sum
    x[32:64] = -127
    out = np.empty((blocks, 3), np.int64)
    _nibble_kernel(x86)(w, bits, lut, x, out)
    qs = w[1:].reshape(blocks, 16)
    n = np.concatenate([qs & 15, qs >> 4], axis=1).astype(np.int64)
    h = (bits[:, None] >> np.arange(32, dtype=np.uint32)) & 1
    xb = x.reshape(blocks, 32).astype(np.int64)
    np.testing.assert_array_equal(out[:, 0], (n * xb).sum(1))
    np.testing.assert_array_equal(out[:, 1], ((n + 16 * h) * xb).sum(1))
    np.testing.assert_array_equal(out[:, 2], (lut[n].astype(np.int64) * xb).sum(1))
