"""Attention without flash (`-fa 0`, and the comparison for flash attention): three kernels,

    scores = Q K^T (attn_qk), P = masked softmax(scores) in place (soft_max: scale, softcap,
    ALiBi, attention sinks), out = P V (attn_pv); attn_qk_vec and attn_pv_vec for fewer than 16
    queries

with the same shapes and semantics as FlashAttn (vkrt/ops/attn_shapes.py, flash_attn.py). The
scores buffer holds n_kv x n_q x n_head x batch f32.
"""

from __future__ import annotations

from ..memory import F16, F32, Tensor
from ..pipeline import PushConstants, kernel
from ..errors import UnsupportedShape
from .attn_shapes import MAX_HEAD, attn_shape, element_strides
from .binding import bind_tensor
from .grid import ceil_div
from .softmax import soft_max

QK_PUSH = PushConstants(*((n, "u32") for n in ("N", "KV", "hsk", "n_head", "gqa", "q_off", "q_nb1", "q_nb2", "q_nb3",
                                               "k_off", "k_nb1", "k_nb2", "k_nb3")))
PV_PUSH = PushConstants(*((n, "u32") for n in ("N", "KV", "hsv", "n_head", "gqa", "v_off", "v_nb1", "v_nb2", "v_nb3",
                                               "o_off")))
TILE = 16  # queries x keys (attn_qk) or queries x dims (attn_pv) per workgroup
QK_VEC_KEYS = 32  # keys a workgroup of attn_qk_vec (fewer queries than a tile)
PV_VEC_DIMS = 32  # dims a workgroup of attn_pv_vec


class Attention:
    """QK^T, masked softmax and PV over fixed tensors. record(seq) adds the three dispatches.
    sinks: F32, one attention sink a query head (gpt-oss), or None.
    The scores live in `scores`, a contiguous F32 tensor of at least n_kv*n_q*n_head*batch
    elements the caller owns (the engine's Scratch.scores, shared by every layer)."""

    def __init__(self, device, q: Tensor, k: Tensor, v: Tensor, out: Tensor, mask: Tensor | None = None, *,
                 scores: Tensor, scale: float, softcap: float = 0.0, max_bias: float = 0.0,
                 sinks: Tensor | None = None, label: str = "attention"):
        self.label = label
        self.device = device
        self.shape = s = attn_shape(q, k, v, out, mask)
        self.mask, self.scale, self.softcap, self.max_bias, self.sinks = mask, scale, softcap, max_bias, sinks
        ne = (s.n_kv, s.n_q, s.n_head, s.batch)
        if scores.type is not F32 or not scores.is_contiguous() or scores.nelements < s.n_kv * s.n_q * s.n_head * s.batch:
            raise UnsupportedShape(f"{label}: scores {scores!r} must be contiguous F32 with at least "
                                   f"{s.n_kv * s.n_q * s.n_head * s.batch} elements")
        self.scores = scores.slice(0, 0, s.n_kv * s.n_q * s.n_head * s.batch).view(ne)
        self._build(q, k, v, out)

    def _build(self, q, k, v, out) -> None:
        dev, s = self.device, self.shape
        self._q, q_off = bind_tensor(q, f"{self.label} q", dev)
        self._k, k_off = bind_tensor(k, f"{self.label} k", dev)
        self._v, v_off = bind_tensor(v, f"{self.label} v", dev)
        self._out, o_off = bind_tensor(out, f"{self.label} out", dev)
        self._s, _ = bind_tensor(self.scores, f"{self.label} scores", dev)
        q_nb, k_nb, v_nb = element_strides(q), element_strides(k), element_strides(v)
        # fewer queries than a tile (decode, verify): attn_qk_vec / attn_pv_vec. attn_qk's tiles
        # would leave most query rows empty; attn_pv walks a deep cache 16 keys at a time in 8
        # workgroups a head (head 128), where attn_pv_vec spreads a query's keys over 32 lanes
        self._vec = s.n_q < TILE
        self._qk = kernel(dev, "attn_qk_vec" if self._vec else "attn_qk", push=QK_PUSH,
                          defines=dict(K_F16=int(k.type == F16), **(dict(MAX_HEAD=MAX_HEAD) if self._vec else {})))
        self._qk_push = dict(N=s.n_q, KV=s.n_kv, hsk=s.hsk, n_head=s.n_head, gqa=s.gqa, q_off=q_off // 4,
                             q_nb1=q_nb[0], q_nb2=q_nb[1], q_nb3=q_nb[2], k_off=k_off // k.type.type_size,
                             k_nb1=k_nb[0], k_nb2=k_nb[1], k_nb3=k_nb[2])
        self._pv = kernel(dev, "attn_pv_vec" if self._vec else "attn_pv", push=PV_PUSH,
                          defines=dict(V_F16=int(v.type == F16)))
        self._pv_push = dict(N=s.n_q, KV=s.n_kv, hsv=s.hsv, n_head=s.n_head, gqa=s.gqa,
                             v_off=v_off // v.type.type_size, v_nb1=v_nb[0], v_nb2=v_nb[1], v_nb3=v_nb[2],
                             o_off=o_off // 4)

    def record(self, seq) -> None:
        s = self.shape
        heads = s.n_head * s.batch
        qk_groups = ((s.n_q, ceil_div(s.n_kv, QK_VEC_KEYS), heads) if self._vec else
                     (ceil_div(s.n_q, TILE), ceil_div(s.n_kv, TILE), heads))
        seq.dispatch(self._qk, [self._q, self._k, self._s], push=self._qk_push, groups=qk_groups,
                     label=f"{self.label} QK^T")
        soft_max(seq, self.scores, self.scores, self.mask, scale=self.scale, softcap=self.softcap,
                 max_bias=self.max_bias, sinks=self.sinks)
        groups = ((s.n_q, ceil_div(s.hsv, PV_VEC_DIMS), heads) if self._vec else
                  (ceil_div(s.n_q, TILE), ceil_div(s.hsv, TILE), heads))
        seq.dispatch(self._pv, [self._s, self._v, self._out], push=self._pv_push, groups=groups,
                     label=f"{self.label} PV")

