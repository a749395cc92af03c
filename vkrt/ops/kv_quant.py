"""The quantised KV cache types (shaders/kv_quant.glsl): which GGML types a KV cache may hold,
the defines that select one in a kernel, and the layout checks of a quantised cache."""

from __future__ import annotations

from ..errors import GGMLTypeError
from ..memory import F16, F32, GGMLType, Tensor, ggml_type

# type -> its KVQ_* constant in kv_quant.glsl
KV_QUANT = {"Q8_0": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 4, "Q5_1": 5, "IQ4_NL": 6}
KV_TYPES = ("F32", "F16", *KV_QUANT)


def kv_type(name) -> GGMLType:
    """The GGMLType of a KV cache type name (f16, q8_0, ...), or a GGMLTypeError naming the choices."""
    try:
        t = ggml_type(name)
    except GGMLTypeError:
        t = None
    if t is None or t.name not in KV_TYPES:
        raise GGMLTypeError(f"KV cache type {name!r} is not supported; choose one of "
                            f"{', '.join(n.lower() for n in KV_TYPES)}")
    return t


def is_quantised(t: Tensor) -> bool:
    """Whether `t` holds blocks of a quantised KV type."""
    return t.type.name in KV_QUANT


def plain_cache(t: Tensor) -> bool:
    """F32 or F16 with contiguous rows: what the fused norm/RoPE stores write."""
    return t.type in (F32, F16) and t.nb[0] == t.type.type_size


def kvq_defines(t: Tensor) -> dict[str, int]:
    """KVQ_TYPE: the kv_quant.glsl constant of t's type (t quantised)."""
    return {"KVQ_TYPE": KV_QUANT[t.type.name]}


def kvq_words(*caches: Tensor) -> int:
    """KVQ_WORDS: the words a store of one block of these quantised caches' types covers (a block
    from the middle of a word to the end of its last)."""
    return max((c.type.type_size + 2 + 3) // 4 for c in caches)


def check_rows(t: Tensor, what: str) -> None:
    """A quantised cache's rows are whole blocks, contiguous, at even byte strides."""
    if t.ne[0] % t.type.block_size or t.nb[0] != t.type.type_size or any(nb % 2 for nb in t.nb[1:]):
        raise GGMLTypeError(f"{what}: a {t.type.name} cache needs rows of whole {t.type.block_size}-element "
                            f"blocks; head size {t.ne[0]} does not divide into them")
