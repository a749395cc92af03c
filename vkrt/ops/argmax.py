"""Greedy sampling on the GPU: the index of a row's largest logit, written where the next step
reads its token and where the host reads it back (4 bytes instead of the whole row)."""

from __future__ import annotations

from ..errors import UnsupportedShape
from ..memory import F32, I32, Tensor
from ..pipeline import PushConstants, kernel
from .binding import bind_tensor
from .grid import ceil_div

ARGMAX_PUSH = PushConstants(*((n, "u32") for n in ("n", "x_off", "chunk", "n_parts", "t0_off", "t1_off")))
MAX_PARTS = 128   # partial workgroups of the first pass (and the size of its scratch, in pairs of words)


def argmax_parts(n: int, wg: int) -> int:
    """Partial workgroups for n logits: a few elements an invocation, at most MAX_PARTS."""
    return max(1, min(MAX_PARTS, ceil_div(n, wg * 8)))


def argmax(seq, x: Tensor, part: Tensor, out: Tensor, out2: Tensor | None = None) -> None:
    """Record out[0] (and out2[0]) = argmax of the F32 vector x (first index on ties; NaN never
    wins). part: I32 scratch of at least 2 * MAX_PARTS words."""
    dev = seq.device
    if x.type != F32 or x.nb[0] != 4 or x.nelements != x.ne[0]:
        raise UnsupportedShape(f"argmax needs a contiguous F32 vector, got {x!r}")
    for t, what in ((out, "out"), (out2, "out2")):
        if t is not None and (t.type != I32 or t.offset % 4):
            raise UnsupportedShape(f"argmax {what} must be a 4-byte aligned I32 tensor, got {t!r}")
    if part.type != I32 or part.nbytes < 8 * MAX_PARTS or part.offset % 8:
        raise UnsupportedShape(f"argmax scratch must be an 8-byte aligned I32 tensor of >= {2 * MAX_PARTS} words, "
                               f"got {part!r}")
    wg = 1 << (dev.tuning.reduce_wg.bit_length() - 1)
    n = x.ne[0]
    parts = argmax_parts(n, wg)
    chunk = ceil_div(n, parts)
    xr, xo = bind_tensor(x, "argmax x", dev)
    pr, po = bind_tensor(part, "argmax part", dev, min_align=8)
    orr, oo = bind_tensor(out, "argmax out", dev)
    o2r, o2o = bind_tensor(out2 if out2 is not None else out, "argmax out2", dev)
    if po:
        raise UnsupportedShape(f"argmax scratch {part!r} must start on a storage-buffer offset alignment")
    k1 = kernel(dev, "argmax", push=ARGMAX_PUSH, defines={"WG": wg, "PARTIAL": 1})
    seq.dispatch(k1, [xr, pr], push={"n": n, "x_off": xo // 4, "chunk": chunk, "n_parts": parts, "t0_off": 0,
                                     "t1_off": 0}, groups=(parts, 1, 1), label="argmax partial")
    k2 = kernel(dev, "argmax", push=ARGMAX_PUSH, defines={"WG": wg})
    seq.dispatch(k2, [pr, orr, o2r], push={"n": n, "x_off": 0, "chunk": chunk, "n_parts": parts, "t0_off": oo // 4,
                                           "t1_off": o2o // 4}, groups=(1, 1, 1), label="argmax")
