"""Elementwise kernels on contiguous f32 / 32-bit ranges: fill and add."""

from __future__ import annotations

from ..errors import VkrtError
from ..pipeline import PushConstants, kernel

FILL_PUSH = PushConstants(("n", "u32"), ("value", "u32"))
ADD_PUSH = PushConstants(("n", "u32"),)


def _need(rng, n: int, what: str) -> None:
    if rng.size < 4 * n:
        raise VkrtError(f"{what}: range of {rng.size} bytes holds fewer than {n} 32-bit elements")


def fill(seq, dst, n: int, value: int) -> None:
    """Record dst[i] = value (a 32-bit pattern) for i < n."""
    _need(dst, n, "fill")
    k = kernel(seq.device, "fill", push=FILL_PUSH, workgroup=(seq.device.tuning.wg_size,))
    seq.dispatch(k, [dst], push={"n": n, "value": value & 0xFFFFFFFF}, groups=k.groups_for(n))


def add(seq, a, b, out, n: int) -> None:
    """Record out[i] = a[i] + b[i] (f32) for i < n."""
    for rng, name in ((a, "a"), (b, "b"), (out, "out")):
        _need(rng, n, f"add: {name}")
    k = kernel(seq.device, "add", push=ADD_PUSH, workgroup=(seq.device.tuning.wg_size,))
    seq.dispatch(k, [a, b, out], push={"n": n}, groups=k.groups_for(n))
