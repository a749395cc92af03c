"""What both vision towers record: a linear layer with its bias, and self-attention where every
patch attends every patch of its image (no mask), each head apart, with vkrt's non-flash
Attention, the queries in chunks whose scores fit vision_memory.SCORES_BYTES."""

from __future__ import annotations

import numpy as np

from ..memory import Tensor
from ..ops.attention import Attention
from ..ops.elementwise import add
from ..ops.flash_work import FlashWork
from ..ops.matmul import matmul
from .vision_memory import query_chunk


def linear(seq, w: dict[str, Tensor], name: str, src: Tensor, dst: Tensor, work: FlashWork) -> None:
    """Record dst = w[name.weight] · src + w[name.bias], then a barrier."""
    matmul(seq, w[name + ".weight"], src, dst, work=work)
    seq.barrier()
    add(seq, dst, w[name + ".bias"], dst)
    seq.barrier()


def full_attention(seq, device, q: Tensor, k: Tensor, v: Tensor, out: Tensor, scores: Tensor, label: str) -> None:
    """Record out = softmax(q k^T / sqrt(D)) v: q, k, v and out (D, H, n) F32 views (any strides),
    scores F32 of at least query_chunk(n, H) * n * H elements."""
    D, H, n = q.ne[0], q.ne[1], q.ne[2]
    keys, values = k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3)   # (D, n, H)
    chunk = query_chunk(n, H)
    for c0 in range(0, n, chunk):
        m = min(chunk, n - c0)
        Attention(device, q.slice(2, c0, c0 + m).permute(0, 2, 1, 3), keys, values, out.slice(2, c0, c0 + m),
                  scores=scores, scale=1.0 / float(np.sqrt(D)), label=label).record(seq)
        seq.barrier()
