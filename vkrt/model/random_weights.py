"""Random weights of every GGML type for generated models (synthetic.py): floats, quantised
blocks, and -- fast, for full-size models -- random valid blocks with their scales set so the
values have a wanted spread. Deterministic for a numpy Generator."""

from __future__ import annotations

import numpy as np
import gguf
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as Q

from ..errors import VkrtError

# byte offsets of the f16 scale fields in one block of each K-quant (the rest may be any bytes)
_K_SCALES = {Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}
_LEGACY = (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0)
# the mean of the unsigned quants of the K-quants with a min (Q2_K 0..3, Q4_K 0..15, Q5_K 0..31)
_K_MEAN_Q = {Q.Q2_K: 1.5, Q.Q4_K: 7.5, Q.Q5_K: 15.5}

def _centre_mins(qtype: Q, raw: np.ndarray) -> None:
    """Make each sub-block's 6-bit (Q2_K: 4-bit) min equal to its scale, in place."""
    if qtype in (Q.Q4_K, Q.Q5_K):
        raw[:, 8:12] = raw[:, 4:8]             # mins 0-3 and the top bits of mins 4-7
        low = raw[:, 12:16] & 0x0F             # low nibbles of scales 4-7 ...
        raw[:, 12:16] = low | (low << 4)       # ... are those of mins 4-7 too
    elif qtype == Q.Q2_K:
        low = raw[:, :16] & 0x0F
        raw[:, :16] = low | (low << 4)


def _unit_rms(qtype: Q, raw: np.ndarray, at_one) -> float:
    """The root mean square of the values of raw's first 64 blocks once `at_one` (in place) has
    set their scale to 1: what a wanted spread divides to give the scale."""
    sample = raw[:64].copy()
    at_one(sample)
    return float(np.sqrt(np.mean(gguf.quants.dequantize(sample, qtype).astype(np.float64) ** 2)))


def _random_blocks(rng, qtype: Q, rows: int, cols: int, std: float | None = None) -> np.ndarray:
    """Random valid K-quant blocks. The K-quants with a min (value = d * sc * q - dmin * m) get
    m = sc and dmin = d * (mean q), so the values centre on zero as a trained model's do: random
    mins gave every weight a mean about as large as its spread, a row summed its inputs' common
    part, and the activations of a deep model outgrew fp16. std: the values' root mean square
    (scales spread over a factor of 3); None: any small d."""
    block, size = GGML_QUANT_SIZES[qtype]
    n_blocks = rows * cols // block
    raw = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    _centre_mins(qtype, raw)
    d_at, dmin_at = (_K_SCALES[qtype] + (None,))[:2]

    def set_scales(blocks, d):
        d = np.asarray(d, np.float16)
        blocks[:, d_at:d_at + 2] = d.view(np.uint8).reshape(-1, 2)
        if dmin_at is not None:
            dmin = (d.astype(np.float32) * _K_MEAN_Q[qtype]).astype(np.float16)
            blocks[:, dmin_at:dmin_at + 2] = dmin.view(np.uint8).reshape(-1, 2)

    if std is None:
        set_scales(raw, rng.random(n_blocks) * 2e-4 + 5e-5)
    else:
        unit = _unit_rms(qtype, raw, lambda sample: set_scales(sample, np.ones(len(sample))))
        set_scales(raw, rng.uniform(0.5, 1.5, n_blocks) * std / unit)
    return raw.reshape(rows, cols // block * size)


def check_row(qtype: Q, shape: tuple[int, ...]) -> None:
    if shape[-1] % GGML_QUANT_SIZES[qtype][0]:
        raise VkrtError(f"{qtype.name} weights need rows of a multiple of {GGML_QUANT_SIZES[qtype][0]} values; "
                        f"a row here has {shape[-1]}")


def random_weight(rng, qtype: Q, shape: tuple[int, ...], std: float, random_blocks: bool = False):
    """(data, raw_dtype) of one weight; shape in numpy order (rows..., cols)."""
    check_row(qtype, shape)
    cols = shape[-1]
    rows = int(np.prod(shape[:-1]))
    if qtype == Q.F32:
        return (rng.standard_normal(shape) * std).astype(np.float32), None
    if qtype == Q.F16:
        return (rng.standard_normal(shape) * std).astype(np.float16), None
    if random_blocks and qtype in _LEGACY_SCALES:
        return _random_legacy(rng, qtype, rows, cols, std).reshape(*shape[:-1], -1), qtype
    if qtype in _LEGACY or qtype == Q.BF16:
        x = (rng.standard_normal((rows, cols)) * std).astype(np.float32)
        return gguf.quants.quantize(x, qtype).reshape(*shape[:-1], -1), qtype
    if qtype in _K_SCALES:
        return _random_blocks(rng, qtype, rows, cols, std).reshape(*shape[:-1], -1), qtype
    if qtype in IQ_TYPES + TQ_TYPES:
        return random_scaled_blocks(rng, qtype, rows, cols, std).reshape(*shape[:-1], -1), qtype
    raise VkrtError(f"synthetic models cannot hold {qtype.name} weights")


# the IQ quants and MXFP4, and the ternary TQ types: random bytes are valid blocks once their one
# scale is set. It is an fp16 d at byte 0 or _D_AT, but for IQ1_M (its d is the top nibbles of
# the four 16-bit scale words at byte 48) and MXFP4 (an e8m0 exponent byte at byte 0)
IQ_TYPES = (Q.IQ4_NL, Q.IQ4_XS, Q.IQ3_XXS, Q.IQ3_S, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ1_S, Q.IQ1_M, Q.MXFP4)
TQ_TYPES = (Q.TQ1_0, Q.TQ2_0)
_D_AT = {Q.TQ1_0: 52, Q.TQ2_0: 64}
_IQ1_M_SCALES = 48


def set_block_scales(qtype: Q, blocks: np.ndarray, d: np.ndarray) -> None:
    """Write one scale a block of an IQ_TYPES or TQ_TYPES type into blocks (n_blocks, type_size)
    in place: fp16 bit patterns (uint16), or for MXFP4 e8m0 exponent bytes (uint8)."""
    if qtype == Q.MXFP4:
        blocks[:, 0] = d
    elif qtype == Q.IQ1_M:
        words = blocks[:, _IQ1_M_SCALES:_IQ1_M_SCALES + 8].copy().view("<u2")
        for i in range(4):
            words[:, i] = (words[:, i] & 0x0FFF) | (((d >> (4 * i)) & 0xF) << 12)
        blocks[:, _IQ1_M_SCALES:_IQ1_M_SCALES + 8] = words.view(np.uint8)
    else:
        at = _D_AT.get(qtype, 0)
        blocks[:, at:at + 2] = np.asarray(d, np.uint16).reshape(-1, 1).view(np.uint8)


def random_scaled_blocks(rng, qtype: Q, rows: int, cols: int, std: float) -> np.ndarray:
    """Random valid blocks of an IQ_TYPES or TQ_TYPES type whose values have a root mean square
    of about `std` (scales spread over a factor of 3, random signs; MXFP4: powers of two)."""
    block, size = GGML_QUANT_SIZES[qtype]
    n = rows * cols // block
    raw = rng.integers(0, 256, (n, size), dtype=np.uint8)
    unit = _unit_rms(qtype, raw, lambda sample: set_block_scales(   # d = 1 (MXFP4: e = 128)
        qtype, sample, np.full(len(sample), 128 if qtype == Q.MXFP4 else 0x3C00)))
    if qtype == Q.MXFP4:
        e = 128 + np.round(np.log2(std / unit)) + rng.integers(-1, 2, n)
        set_block_scales(qtype, raw, np.clip(e, 0, 254).astype(np.uint8))
    else:
        d = rng.uniform(0.5, 1.5, n) * rng.choice([-1.0, 1.0], n) * std / unit
        set_block_scales(qtype, raw, d.astype(np.float16).view(np.uint16))
    return raw.reshape(rows, -1)


# legacy block types: (offset of the f16 scale, offset of the f16 min or None, typical |q - zero|)
_LEGACY_SCALES = {Q.Q4_0: (0, None, 4.6), Q.Q4_1: (0, 2, 4.6), Q.Q5_0: (0, None, 9.2), Q.Q5_1: (0, 2, 9.2),
                  Q.Q8_0: (0, None, 74.0)}


def _random_legacy(rng, qtype: Q, rows: int, cols: int, std: float) -> np.ndarray:
    """Random valid blocks whose values have roughly standard deviation `std` (fast for big models)."""
    block, size = GGML_QUANT_SIZES[qtype]
    n_blocks = rows * cols // block
    raw = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    d_off, m_off, spread = _LEGACY_SCALES[qtype]
    raw[:, d_off:d_off + 2] = np.full(n_blocks, std / spread, np.float16).view(np.uint8).reshape(n_blocks, 2)
    if m_off is not None:
        raw[:, m_off:m_off + 2] = np.full(n_blocks, -std * 1.5, np.float16).view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(rows, cols // block * size)
