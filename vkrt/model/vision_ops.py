"""What both vision towers record: a linear layer with its bias, and self-attention where every
patch attends every patch of its image (no mask), as flash attention -- at a head size padded to
a multiple of 16 where that lets it run on cooperative matrices (the towers' heads of 72)."""

from __future__ import annotations

import numpy as np

from ..memory import Tensor
from ..ops.copy import copy
from ..ops.elementwise import add
from ..ops.flash_attn import FlashAttn, fa_cm_tile
from ..ops.flash_work import FlashWork
from ..ops.matmul import matmul

PADDED = ("q", "k", "v", "out")   # the padded heads' buffers (run names "padded q", ...)


def linear(seq, w: dict[str, Tensor], name: str, src: Tensor, dst: Tensor, work: FlashWork) -> None:
    """Record dst = w[name.weight] · src + w[name.bias], then a barrier."""
    matmul(seq, w[name + ".weight"], src, dst, work=work)
    seq.barrier()
    add(seq, dst, w[name + ".bias"], dst)
    seq.barrier()


def padded_head(device, head: int, n: int) -> int:
    """The head size a tower's attention over n patches runs at: `head`, or head rounded up to 16
    where flash attention then takes its cooperative-matrix kernel (zero columns add nothing to
    q·k, and the output's first `head` columns are attention's)."""
    up = -(-head // 16) * 16
    t, p = device.tuning, device.profile
    if up == head or not t.fa_coopmat or n < t.fa_cm_min_q or fa_cm_tile(up, up, p.shared_memory,
                                                                          p.subgroup_size) is None:
        return head
    return up


def add_padded(run, head: int, n_head: int, n: int) -> None:
    """The zeroed buffers of attention at padded_head's size, where it pads (EncoderRun.new)."""
    size = padded_head(run.device, head, n)
    if size != head:
        for name in PADDED:
            run.new(f"padded {name}", (size, n_head, n), zeroed=True)


def _heads(t: Tensor, head: int) -> Tensor:
    """The first `head` columns of each of t's padded heads."""
    return t.view((head, t.ne[1], t.ne[2]), nb=t.nb[:3])


def full_attention(seq, device, q: Tensor, k: Tensor, v: Tensor, out: Tensor, work: FlashWork, label: str,
                   buffers: dict[str, Tensor]) -> None:
    """Record out = softmax(q k^T / sqrt(D)) v, each head apart: q, k, v and out (D, H, n) F32 views
    (any strides), then a barrier. Through the padded heads of `buffers` where it has them
    (add_padded): q, k and v copied in, the output copied out."""
    D = q.ne[0]
    padded = [buffers.get(f"padded {name}") for name in PADDED]
    if padded[0] is not None:
        for src, dst in zip((q, k, v), padded):
            copy(seq, src, _heads(dst, D))
        seq.barrier()
        q, k, v, result = padded
    else:
        result = out
    FlashAttn(device, q.permute(0, 2, 1, 3), k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3), result, None,
              scale=1.0 / float(np.sqrt(D)), work=work, label=label).record(seq)
    seq.barrier()
    if result is not out:
        copy(seq, _heads(result, D), out)
        seq.barrier()
