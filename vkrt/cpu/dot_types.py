"""Which GGUF weight types the CPU expert kernels take: type name -> (activation family, dot)."""

from __future__ import annotations

from . import dots_iq, dots_k, dots_legacy

DOTS = {**dots_legacy.DOTS, **dots_k.DOTS, **dots_iq.DOTS}


def cpu_types() -> tuple[str, ...]:
    """The weight types the CPU expert kernels compute, in GGML's order."""
    return tuple(DOTS)
