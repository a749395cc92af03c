"""Checks a CPU dot product against the numpy reference: gguf.quants.dequantize of the weights
times the dequantised q8 activations."""

from __future__ import annotations

import gguf
import numpy as np
from numba import njit

from vkrt.cpu.act_quant import dequantized, quantized
from vkrt.cpu.dot_types import DOTS

_rng = np.random.default_rng(51)


def random_rows(type_name: str, rows: int, k: int, f16_fields: tuple[int, ...] = (0,), f16_scale: float = 0.01,
                rng=_rng) -> np.ndarray:
    """`rows` rows of `k` values of `type_name` as random bytes, the fp16 fields at the byte offsets
    `f16_fields` of each block set to random finite scales around `f16_scale`."""
    elems, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]
    blocks = rng.integers(0, 256, size=(rows, k // elems, size), dtype=np.uint8)
    for off in f16_fields:
        scale = (rng.uniform(0.5, 1.5, size=(rows, k // elems)) * f16_scale).astype(np.float16)
        blocks[:, :, off:off + 2] = scale.view(np.uint8).reshape(rows, k // elems, 2)
    return blocks.reshape(rows, -1)


@njit
def _rows_dot(dot, w, row_bytes, nb, q, d, s, out):
    for r in range(out.size):
        out[r] = dot(w, r * row_bytes, q, d, s, nb)


def check_dot(type_name: str, w_rows: np.ndarray, rng=_rng) -> None:
    """The CPU dot of every row of w_rows (uint8 [rows, row bytes]) with a random activation
    equals the reference to float32 rounding."""
    t = gguf.GGMLQuantizationType[type_name]
    elems, size = gguf.GGML_QUANT_SIZES[t]
    rows, row_bytes = w_rows.shape
    k = row_bytes // size * elems
    family, dot = DOTS[type_name]
    x = rng.standard_normal((1, k)).astype(np.float32)
    x[0, rng.integers(0, k, size=k // 64)] *= 8   # outliers, as real activations have
    q, d, s = quantized(x, family)
    out = np.empty(rows, np.float32)
    _rows_dot(dot, np.ascontiguousarray(w_rows).reshape(-1), row_bytes, row_bytes // size, q[0], d[0], s[0], out)
    ref_w = gguf.quants.dequantize(w_rows, t).astype(np.float64)
    ref_x = dequantized(q, d, family)[0].astype(np.float64)
    ref = ref_w @ ref_x
    bound = np.abs(ref_w) @ np.abs(ref_x)
    assert np.isfinite(out).all(), f"{type_name}: non-finite dot"
    err = np.abs(out - ref)
    worst = int(np.argmax(err / (bound + 1e-30)))
    assert (err <= 2e-6 * bound + 1e-30).all(), \
        f"{type_name}: row {worst} dot {out[worst]} vs reference {ref[worst]} (bound {bound[worst]})"
