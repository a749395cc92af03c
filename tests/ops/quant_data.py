"""Random weight blocks for every kernel type, and numpy references, shared by the quant tests."""

from __future__ import annotations

import dataclasses

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from vkrt.commands import write_tensor
from vkrt.memory import Tensor, ggml_type
from vkrt.model.random_weights import IQ_TYPES, TQ_TYPES, random_scaled_blocks, set_block_scales

LEGACY = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
# byte offsets of the fp16 scales inside one K-quant block
K_SCALES = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
# the IQ quants and MXFP4, the ternary TQ types (vkrt.model.synthetic knows where each keeps its scale)
IQ = tuple(q.name for q in IQ_TYPES)
TQ = tuple(q.name for q in TQ_TYPES)
ALL = ("F32", "F16", "BF16", *LEGACY, *K_SCALES, *IQ, *TQ)


def finite_f16(rng, n: int) -> np.ndarray:
    """n random fp16 bit patterns, never Inf or NaN (subnormals and signed zeros included)."""
    bits = rng.integers(0, 1 << 16, n, dtype=np.uint16)
    bad = (bits & 0x7C00) == 0x7C00
    bits[bad] &= np.uint16(0xBFFF)  # clear the top exponent bit
    return bits


def random_blocks(name: str, rows: int, k: int, rng, scale: float | None = None) -> np.ndarray:
    """Raw data of a (rows, k) weight of type `name` as uint8 of shape (rows, row_bytes).

    scale=None: every bit pattern the format allows (F16/K-quant scales: any finite fp16, BF16:
    any 16 bits, NaN included) for bit-exact tests; a number: values of about that size, for
    matmul tests. Legacy quants come from gguf.quants.quantize, K-quants, IQ quants, MXFP4 and
    the TQ types from random bytes with valid scales (MXFP4 with scale=None: any exponent byte).
    """
    t = ggml_type(name)
    normal = rng.standard_normal((rows, k)).astype(np.float32) * np.float32(scale or 1.0)
    if name == "F32":
        return normal.view(np.uint8)
    if name == "F16":
        bits = finite_f16(rng, rows * k).reshape(rows, k) if scale is None else normal.astype(np.float16)
        return bits.view(np.uint8)
    if name == "BF16":
        if scale is None:
            return rng.integers(0, 1 << 16, (rows, k), dtype=np.uint16).view(np.uint8)
        return (normal.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    if name in LEGACY:
        return quantize(normal, GGMLQuantizationType[name])
    if name in IQ + TQ:
        return random_scaled(name, rows, k, rng, scale)
    nblk = k // t.block_size
    raw = rng.integers(0, 256, (rows, nblk, t.type_size), dtype=np.uint8)
    for off in K_SCALES[name]:
        if scale is None:
            d = finite_f16(rng, rows * nblk)
        else:
            d = (rng.uniform(-1, 1, rows * nblk) * scale).astype(np.float16).view(np.uint16)
        raw[:, :, off:off + 2] = d.reshape(rows, nblk, 1).view(np.uint8)
    return raw.reshape(rows, nblk * t.type_size)


def random_scaled(name: str, rows: int, k: int, rng, scale: float | None) -> np.ndarray:
    """Random bytes with valid scales: any finite fp16 d (MXFP4: any exponent byte) with
    scale=None; else a d that gives the blocks' values a root mean square of about `scale`."""
    qtype = GGMLQuantizationType[name]
    if scale is not None:
        return random_scaled_blocks(rng, qtype, rows, k, scale)
    t = ggml_type(name)
    n = rows * k // t.block_size
    raw = rng.integers(0, 256, (n, t.type_size), dtype=np.uint8)
    if name == "MXFP4":
        scales = rng.integers(0, 256, n, dtype=np.uint8)
        scales[:2] = (0, 1)   # the subnormal scales (2^-128, 2^-127): a device that flushes them fails
    else:
        scales = finite_f16(rng, n)
    set_block_scales(qtype, raw, scales)
    return raw.reshape(rows, -1)


def reference(name: str, raw: np.ndarray) -> np.ndarray:
    """gguf.quants.dequantize of raw blocks (rows, row_bytes) -> float32 (rows, k). MXFP4's
    largest scales overflow to infinity, as on the GPU."""
    with np.errstate(over="ignore"):
        return dequantize(raw, GGMLQuantizationType[name])


def weight_tensor(device, name: str, raw: np.ndarray, ne: tuple[int, ...]) -> Tensor:
    """A device tensor of type `name` and sizes `ne` holding raw blocks (rows, row_bytes)."""
    t = ggml_type(name)
    w = Tensor.empty(device, t, ne, name=f"{name} weight")
    write_tensor(w, raw if t.quantized else raw.view(t.dtype))
    return w


def flushed_elements(name: str, raw: np.ndarray, device) -> np.ndarray | None:
    """Where a device that may flush fp32 subnormals and cannot be asked not to (no
    shaderDenormPreserveFloat32: the H200 flushes, lavapipe keeps them) may give zeros instead
    of gguf's values: every element of an MXFP4 block whose scale 2^(e-128) is subnormal (e < 2),
    as a (rows, k) mask of raw's rows; None where every element must have gguf's bits."""
    if name != "MXFP4" or device.profile.denorm_preserve_fp32:
        return None
    t = ggml_type(name)
    return np.repeat(raw.reshape(-1, t.type_size)[:, 0] < 2, t.block_size).reshape(raw.shape[0], -1)


def assert_same_bits(got: np.ndarray, ref: np.ndarray, flushed: np.ndarray | None = None) -> None:
    """got has ref's bits; where `flushed` is set, ref's bits or a zero of either sign."""
    got, ref = got.reshape(ref.shape), np.ascontiguousarray(ref)
    diff = got.view(np.uint32) != ref.view(np.uint32)
    if flushed is not None:
        flushed = flushed.reshape(ref.shape)
        diff = np.where(flushed, diff & (got != 0), diff)
    if diff.any():
        i = tuple(np.argwhere(diff)[0])
        raise AssertionError(f"{diff.sum()} of {diff.size} elements differ; first at {i}: got {got[i]!r} "
                             f"({got.view(np.uint32)[i]:#010x}), gguf {ref[i]!r} ({ref.view(np.uint32)[i]:#010x})"
                             + (" (a subnormal block: want gguf's bits or 0)" if flushed is not None and flushed[i] else ""))


# normalised error of a GEMM on cooperative matrices: both operands rounded to fp16 (a relative
# error up to 2^-11 each, about 1.6e-7 on random data), the sums in fp32
FP16_OPERANDS = 2e-6


def gemm_limit(threshold: float, tuning) -> float:
    """The error a product may have under `tuning`: its fp32 threshold, or the fp16 operands'
    where the GEMM runs on cooperative matrices (the mat-vec stays fp32 either way)."""
    return max(threshold, FP16_OPERANDS) if tuning.mm_coopmat else threshold


def fp32_tile(tuning, **fields):
    """`tuning` with the fp32 GEMM and these tile fields: the tests of its tile rules (the GEMM on
    cooperative matrices, the NVIDIA default, has tiles of its own and its own tests)."""
    return dataclasses.replace(tuning, mm_coopmat=False, **fields)


def wide_tile_pair(tuning, big_bn: int, **fields):
    """(narrow, wide): the fp32 GEMM at 32 x 32 tiles (4 x 4 a thread) with no wide tile, and the
    same with a wide tile 64 rows by `big_bn` tokens (mm_big_*); `fields`: more changes to both."""
    narrow = fp32_tile(tuning, mm_bm=32, mm_bn=32, mm_bk=16, mm_tm=4, mm_tn=4, mm_big_bm=0, mm_big_bn=0, **fields)
    return narrow, dataclasses.replace(narrow, mm_big_bm=64, mm_big_bn=big_bn)


def nmse(got: np.ndarray, ref: np.ndarray) -> float:
    """Normalised mean squared error of got against a float64 reference."""
    ref = np.asarray(ref, np.float64)
    return float(np.sum((np.asarray(got, np.float64) - ref) ** 2) / max(np.sum(ref ** 2), 1e-300))
