"""GGML tensor types, described once: block size, bytes per block, numpy dtype for plain types."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from ..errors import GGMLTypeError


@dataclass(frozen=True)
class GGMLType:
    name: str
    id: int
    block_size: int       # elements per block (1 for plain types)
    type_size: int        # bytes per block
    dtype: np.dtype | None  # numpy dtype of one element for plain types, None for block-quantised
    glsl: str | None = None  # shaders/ include that reads this type in generic kernels; None: no kernels

    @property
    def quantized(self) -> bool:
        return self.block_size > 1

    def row_bytes(self, n: int) -> int:
        """Bytes of `n` consecutive elements along dim 0 (n a multiple of the block size)."""
        if n % self.block_size:
            raise GGMLTypeError(f"{self.name}: {n} elements is not a multiple of the block size {self.block_size}")
        return n // self.block_size * self.type_size

    def __repr__(self) -> str:
        return self.name


_DTYPES = {"F32": np.float32, "F16": np.float16, "I8": np.int8, "I16": np.int16, "I32": np.int32,
           "I64": np.int64, "F64": np.float64, "BF16": np.uint16}
# the weight types vkrt's kernels read (dequantise, matmul): name -> include defining the block layout
_GLSL = {name: f"quant/{name.lower()}.glsl" for name in
         ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
          "IQ4_NL", "IQ4_XS", "IQ3_XXS", "IQ3_S", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M", "MXFP4",
          "TQ1_0", "TQ2_0")}

TYPES: dict[str, GGMLType] = {}
for _q in GGMLQuantizationType:
    if _q in GGML_QUANT_SIZES:
        _b, _s = GGML_QUANT_SIZES[_q]
        _dt = _DTYPES.get(_q.name)
        TYPES[_q.name] = GGMLType(_q.name, int(_q.value), _b, _s, np.dtype(_dt) if _dt is not None else None,
                                  _GLSL.get(_q.name))

BY_ID: dict[int, GGMLType] = {t.id: t for t in TYPES.values()}

F32, F16, BF16, I32 = TYPES["F32"], TYPES["F16"], TYPES["BF16"], TYPES["I32"]


def ggml_type(t: "GGMLType | str | int | GGMLQuantizationType") -> GGMLType:
    """Look a type up by GGMLType, name ('F16', 'q4_k'), numeric id, or gguf enum member."""
    if isinstance(t, GGMLType):
        return t
    if isinstance(t, GGMLQuantizationType):
        return BY_ID[int(t.value)]
    if isinstance(t, (int, np.integer)):
        if int(t) not in BY_ID:
            raise GGMLTypeError(f"unknown GGML type id {int(t)}")
        return BY_ID[int(t)]
    key = str(t).upper()
    if key not in TYPES:
        raise GGMLTypeError(f"unknown GGML type {t!r}")
    return TYPES[key]
