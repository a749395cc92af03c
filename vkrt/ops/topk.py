"""The top-N candidates of a row of logits on the GPU, sorted (value descending, then index): what
a top-k sampler needs, read back in N pairs instead of the whole row."""

from __future__ import annotations

from ..errors import UnsupportedShape
from ..memory import F32, I32, Tensor
from ..pipeline import PushConstants, kernel
from .binding import bind_tensor
from .grid import ceil_div

TOPK_PUSH = PushConstants(*((n, "u32") for n in ("n", "x_off", "x_row", "o_off", "o_row")))
CHUNK = 2048   # entries a workgroup sorts in shared memory (16 KiB of pairs)


def passes(n: int, k: int) -> list[int]:
    """Workgroups of each pass for n logits and k candidates: chunks of CHUNK, each keeping k,
    until one workgroup is left."""
    if not 1 <= k <= CHUNK:
        raise UnsupportedShape(f"top-k candidates: k must be in 1..{CHUNK}, got {k}")
    out = [max(1, ceil_div(n, CHUNK))]
    while out[-1] > 1:
        out.append(ceil_div(out[-1] * k, CHUNK))
    return out


def scratch_words(n: int, k: int, rows: int = 1) -> int:
    """I32 words each of the two scratch tensors needs for `rows` rows of n logits, k candidates."""
    return 2 * k * passes(n, k)[0] * rows


def top_candidates(seq, x: Tensor, k: int, scratch: tuple[Tensor, Tensor], out: Tensor) -> None:
    """Record out[r] = the k best (value bits, index) pairs of row r of the F32 logits x (n,) or
    (n, rows), best first (ties: the lower index; NaN counts as -inf; index 0xFFFFFFFF pads a
    row shorter than k). scratch: two I32 tensors of scratch_words(n, k, rows) words; out: I32 of
    2 * k * rows words."""
    dev = seq.device
    n, rows = x.ne[0], x.ne[1]
    if x.type != F32 or x.nb[0] != 4 or x.nelements != n * rows or x.nb[1] % 4 or (rows > 1 and x.nb[1] < 4 * n):
        raise UnsupportedShape(f"top-k candidates need F32 logits (n,) or (n, rows) with contiguous rows, got {x!r}")
    if rows > dev.profile.max_workgroup_count[1]:
        raise UnsupportedShape(f"top-k candidates: {rows} rows exceed the device's {dev.profile.max_workgroup_count[1]}")
    words = scratch_words(n, k, rows)
    for t, what, need in ((scratch[0], "scratch", words), (scratch[1], "scratch", words), (out, "out", 2 * k * rows)):
        if t.type != I32 or t.nelements < need or t.offset % 8:
            raise UnsupportedShape(f"top-k candidates {what} must be an 8-byte aligned I32 tensor of >= {need} "
                                   f"words, got {t!r}")
    wg = min(256, dev.profile.max_workgroup_invocations)
    groups = passes(n, k)
    src, src_off = bind_tensor(x, "top_candidates x", dev)
    count, row_in = n, x.nb[1] // 4 if rows > 1 else n
    for level, g in enumerate(groups):
        last = level == len(groups) - 1
        dst_t = out if last else scratch[level % 2]
        dst, dst_off = bind_tensor(dst_t, "top_candidates dst", dev, min_align=8)
        row_out = k if last else g * k
        defines = {"WG": wg, "CH": CHUNK, "N": k, **({"FIRST": 1} if level == 0 else {})}
        kern = kernel(dev, "topk", defines=defines, push=TOPK_PUSH)
        seq.dispatch(kern, [src, dst], push={"n": count, "x_off": src_off // (4 if level == 0 else 8), "x_row": row_in,
                                             "o_off": dst_off // 8, "o_row": row_out},
                     groups=(g, rows, 1), label="top-k candidates")
        src, src_off, count, row_in = dst, dst_off, g * k, row_out
