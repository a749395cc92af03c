"""The plain ops a forward pass is written in (transformer.py, attention_block.py, ...): each
records its kernels, unfused, with `record(seq)`. The fusion pass (fuse.py) rewrites runs of them
into fused kernels; every rewrite gives the same bits. Ops the pass never touches are `Call`s.
`part` is the index of the forward pass's part an op belongs to (set by Graph)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..memory import Tensor
from ..ops.add_id import add_id
from ..ops.attention import Attention
from ..ops.elementwise import activation, add
from ..ops.flash_attn import FlashAttn
from ..ops.hadamard import hadamard
from ..ops.matmul import matmul
from ..ops.moe import moe_combine, moe_route
from ..ops.mul_mat_id import mul_mat_id
from ..ops.norm import rms_norm
from ..ops.norm_rope import norm_rope
from ..ops.rope import rope
from ..ops.set_rows import set_rows


class Node:
    part: int = -1
    segment: int = 0   # the command sequence it is recorded into (parts are cut into sequences)

    def record(self, seq) -> None:
        raise TypeError(f"{type(self).__name__} records nothing")


@dataclass(eq=False)
class Call(Node):
    """An op the fusion pass leaves alone: fn(seq) records it."""

    name: str
    fn: Callable

    def record(self, seq) -> None:
        self.fn(seq)


@dataclass(eq=False)
class Residual(Node):
    """x[:, first:] += o[:, first:]: a block's output joins the residual stream."""

    x: Tensor
    o: Tensor
    first: int = 0

    def record(self, seq) -> None:
        T = self.x.ne[1]
        x = self.x.slice(1, self.first, T)
        add(seq, x, self.o.slice(1, self.first, T), x)


@dataclass(eq=False)
class Norm(Node):
    """dst[:, first:] = rms_norm(src[:, first:]) * weight."""

    src: Tensor
    dst: Tensor
    weight: Tensor | None
    eps: float
    first: int = 0

    def cols(self, t: Tensor) -> Tensor:
        return t if self.first == 0 else t.slice(1, self.first, t.ne[1])

    def record(self, seq) -> None:
        rms_norm(seq, self.cols(self.src), self.cols(self.dst), self.eps, self.weight)


@dataclass(eq=False)
class MatMul(Node):
    """y = w·x (matmul's kernel_columns: the kernel picked as for that many columns; work: where a
    GEMM cut along K keeps its partial tiles)."""

    w: Tensor
    x: Tensor
    y: Tensor
    kernel_columns: int | None = None
    work: object = None

    def record(self, seq) -> None:
        matmul(seq, self.w, self.x, self.y, kernel_columns=self.kernel_columns, work=self.work)


@dataclass(eq=False)
class Glu(Node):
    """h = act(g) * u."""

    act: str
    g: Tensor
    u: Tensor
    h: Tensor

    def record(self, seq) -> None:
        activation(seq, self.act, self.g, self.h, up=self.u)


@dataclass(eq=False)
class Route(Node):
    """A MoE block's routing of the router's logits into chosen expert ids and weights (moe_route's
    arguments)."""

    logits: Tensor
    ids: Tensor
    weights: Tensor
    n_used: int
    normalize: bool
    chosen_softmax: bool = False
    sigmoid_bias: Tensor | None = None

    def gating(self) -> dict:
        return dict(chosen_softmax=self.chosen_softmax, sigmoid_bias=self.sigmoid_bias)

    def record(self, seq) -> None:
        moe_route(seq, self.logits, self.ids, self.weights, self.n_used, self.normalize, **self.gating())


@dataclass
class RouteCount:
    """The ids whose routes a MoE block's route table holds from an earlier GEMM of the block (its
    gate, up and down share one counting pass); None: none."""

    held: Tensor | None = None


@dataclass(eq=False)
class MulMatId(Node):
    """y = w[sid]·x for the experts' slots `sid` (their own ids, or staging slots), + bias[:, ids]
    (gpt-oss): in the mat-vec where sid are the experts' own ids, by add_id after it where not."""

    w: Tensor
    x: Tensor
    sid: Tensor
    y: Tensor
    routes: object
    count: RouteCount
    ids: Tensor
    bias: Tensor | None = None

    @property
    def own_bias(self) -> bool:
        """The bias is added in the mat-vec (or there is none)."""
        return self.bias is None or self.sid is self.ids

    def record(self, seq) -> None:
        counted = self.count.held is self.sid
        if self.own_bias:
            filled = mul_mat_id(seq, self.w, self.x, self.sid, self.y, self.routes, bias=self.bias,
                                routes_counted=counted)
        else:
            filled = mul_mat_id(seq, self.w, self.x, self.sid, self.y, self.routes, routes_counted=counted)
            add_id(seq, self.y, self.bias, self.ids, self.y)
        self.count.held = self.sid if filled else None


@dataclass(eq=False)
class MoeCombine(Node):
    """out[:, t] = sum_j weights[j, t] * experts_out[:, j, t] (+ sigmoid(shared_gate[t]) * shared[:, t])."""

    experts_out: Tensor
    weights: Tensor
    out: Tensor
    shared: Tensor | None = None
    shared_gate: Tensor | None = None

    def record(self, seq) -> None:
        moe_combine(seq, self.experts_out, self.weights, self.out, self.shared, self.shared_gate)


@dataclass(eq=False)
class QKRope(Node):
    """Attention's q/k norm (per head, where the model has one) and RoPE, rotated queries into qr,
    and K's and V's stores into their cache cells. q3, k3, v3: [head_dim, heads, tokens].
    k_rot / v_rot: the Walsh-Hadamard runs a quantised cache's K (with the queries) and V are
    rotated in before they are stored (ops/hadamard.py; 0: none); v3 is rotated in place."""

    q3: Tensor
    k3: Tensor
    v3: Tensor
    qr: Tensor
    kr: Tensor
    k_cache: Tensor
    v_cache: Tensor
    cells: Tensor
    pos: Tensor
    q_norm: Tensor | None
    k_norm: Tensor | None
    eps: float
    rope_args: dict
    q_temp: dict = field(default_factory=dict)   # mistral3's attention temperature (rope's attn_temp)
    k_rot: int = 0
    v_rot: int = 0

    def record(self, seq) -> None:
        q3 = self.q3
        if self.q_norm is not None:
            rms_norm(seq, q3, self.qr, self.eps, self.q_norm)
            rms_norm(seq, self.k3, self.k3, self.eps, self.k_norm)
            q3 = self.qr
        rope(seq, q3, self.pos, self.qr, **self.rope_args, **self.q_temp)
        rope(seq, self.k3, self.pos, self.kr, **self.rope_args)
        if self.k_rot:
            hadamard(seq, self.qr, self.k_rot)
            hadamard(seq, self.kr, self.k_rot)
        if self.v_rot:
            hadamard(seq, self.v3, self.v_rot)
        set_rows(seq, self.kr, self.cells, self.k_cache)
        set_rows(seq, self.v3, self.cells, self.v_cache)


@dataclass(eq=False)
class NormRope(Node):
    """A QKRope as norm_rope kernels: K's norm, RoPE and cache store in one dispatch, the queries'
    in another or riding in K's (`with_q`), V's store riding in K's (`store_v`) or apart; a
    quantised cache's rotation and quantisation inside the stores."""

    op: QKRope
    with_q: bool
    store_v: bool

    def record(self, seq) -> None:
        o = self.op
        args = dict(eps=o.eps, **o.rope_args)
        with_q = (o.q3, o.qr, o.q_norm) if self.with_q else None
        if with_q is None:
            norm_rope(seq, o.q3, o.pos, o.qr, weight=o.q_norm, k_rot=o.k_rot, **args, **o.q_temp)
        store_v = (o.v3, o.v_cache) if self.store_v else None
        norm_rope(seq, o.k3, o.pos, o.k_cache, weight=o.k_norm, rows=o.cells, store_v=store_v, with_q=with_q,
                  k_rot=o.k_rot, v_rot=o.v_rot if store_v else 0, **args)
        if store_v is None:
            if o.v_rot:
                hadamard(seq, o.v3, o.v_rot)
            set_rows(seq, o.v3, o.cells, o.v_cache)


@dataclass(eq=False)
class Attend(Node):
    """Attention of the rotated queries over the cache's first cells: flash attention (`flash`,
    its work buffers and mask_opt sharing from `scratch`) or QK^T, softmax, PV (scratch.scores).
    `split_plan`: the split count flash attention takes (a group of a pipelined step: the
    whole step's). Both are built when recorded (in layer order: mask_opt's sharing follows it)."""

    q: Tensor
    k: Tensor
    v: Tensor
    out: Tensor
    mask: Tensor | None
    scale: float
    sinks: Tensor | None
    flash: bool
    scratch: object
    label: str
    mask_opt: bool | None = None
    # (queries, output, mask) of the step whose KV split flash attention takes (None: this one's)
    plan: tuple | None = None
    v_rot: int = 0   # the output rotated back in runs of v_rot (the cache's V is rotated: QKRope)
    mask_zero: Tensor | None = None   # the step input flagging the mask all zero on its live cells

    def build(self, device, prologue=None):
        """The attention op, built now (with `prologue`, an FANormRope, where it takes it)."""
        s = self.scratch
        args = (device, self.q, self.k, self.v, self.out, self.mask)
        if not self.flash:
            return Attention(*args, scale=self.scale, scores=s.scores, sinks=self.sinks, label=self.label)
        split_k = None
        if self.plan is not None:   # the split that step takes (decided, not recorded)
            q, out, mask = self.plan
            split_k = FlashAttn(device, q, self.k, self.v, out, mask, scale=self.scale, sinks=self.sinks,
                                kv_used=s.kv_used, mask_opt=False, label=f"{self.label} (split plan)").n_split
        op = FlashAttn(*args, scale=self.scale, label=self.label, kv_used=s.kv_used,
                       share_mask_opt=s.mask_opt_owner.get(id(self.mask)), sinks=self.sinks,
                       mask_opt=self.mask_opt, split_k=split_k, work=s.work, prologue=prologue, out_rot=self.v_rot,
                       mask_zero=self.mask_zero)
        s.mask_opt_owner.setdefault(id(self.mask), op)
        return op

    def record(self, seq) -> None:
        self.build(seq.device).record(seq)
        if self.v_rot and not self.flash:   # flash attention rotates its output back itself
            hadamard(seq, self.out, self.v_rot)
