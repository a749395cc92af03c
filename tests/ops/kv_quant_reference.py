"""Numpy references of the quantised KV cache types: gguf.quants where it quantises (Q8_0, Q4_0,
Q4_1, Q5_0, Q5_1), and ggml's quantize_row_iq4_nl_ref (no importance weights, ntry 7) in float32
step by step, which gguf lacks."""

from __future__ import annotations

import numpy as np
from gguf.quants import dequantize, quantize

from vkrt.memory import ggml_type

KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)
QUANT_KV = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL"]


def _best_index(x: np.float32) -> int:
    v = KVALUES_IQ4NL
    if x <= v[0]:
        return 0
    if x >= v[15]:
        return 15
    ml, mu = 0, 15
    while mu - ml > 1:
        mav = (ml + mu) // 2
        if x < v[mav]:
            mu = mav
        else:
            ml = mav
    return mu - 1 if x - v[mu - 1] < v[mu] - x else mu


def _iq4nl_block(x: np.ndarray) -> bytes:
    f = np.float32
    amax, mx = f(0), f(0)
    for xj in x:
        if abs(xj) > amax:
            amax, mx = abs(xj), xj
    if amax < f(1e-15):
        d = f(0)
    else:
        def sums(id_):
            sqx, sq2 = f(0), f(0)
            for xj in x:
                q = KVALUES_IQ4NL[_best_index(f(id_ * xj))]
                wq = f(f(xj * xj) * q)
                sqx = f(sqx + f(wq * xj))
                sq2 = f(sq2 + f(wq * q))
            return sqx, sq2
        d = f(-mx / KVALUES_IQ4NL[0])
        sqx, sq2 = sums(f(f(1) / d))
        d = f(sqx / sq2)
        best = f(d * sqx)
        for itry in range(-7, 8):
            sqx, sq2 = sums(f(f(itry + KVALUES_IQ4NL[0]) / mx))
            if sq2 > 0 and f(sqx * sqx) > f(best * sq2):
                d = f(sqx / sq2)
                best = f(d * sqx)
    id_ = f(f(1) / d) if d != 0 else f(0)
    q = np.array([_best_index(f(id_ * xj)) for xj in x], np.uint8)
    return np.float16(d).tobytes() + (q[:16] | (q[16:] << 4)).astype(np.uint8).tobytes()


def quantize_rows(rows: np.ndarray, type_name: str) -> np.ndarray:
    """rows f32 [..., n] (n a multiple of 32) as the type's blocks, uint8 [..., row bytes]."""
    rows = np.ascontiguousarray(rows, np.float32)
    if type_name != "IQ4_NL":
        from gguf import GGMLQuantizationType
        return quantize(rows, GGMLQuantizationType[type_name])
    flat = rows.reshape(-1, 32)
    out = b"".join(_iq4nl_block(b) for b in flat)
    return np.frombuffer(out, np.uint8).reshape(*rows.shape[:-1], rows.shape[-1] // 32 * 18)


def dequantize_rows(data: np.ndarray, type_name: str) -> np.ndarray:
    """uint8 [..., row bytes] of the type's blocks as f32 [..., n]."""
    from gguf import GGMLQuantizationType
    return dequantize(np.ascontiguousarray(data), GGMLQuantizationType[type_name]).astype(np.float32)


def row_bytes(type_name: str, n: int) -> int:
    return ggml_type(type_name).row_bytes(n)
