"""The fusion pass: `fuse(nodes, device, enabled, counter)` rewrites runs of the plain ops a forward
pass is written in (nodes.py) into fused kernels, each giving the same bits as the ops it
replaces (docs/ARCHITECTURE.md §4). Which fusions run is one debug setting, VKRT_FUSE (`all`,
`none`, or names; `enabled`); the model code never mentions a fusion.

A fused op takes the place (and the part) of one op of its run: the anchor below. Runs are
matched left to right, longest rule first, on adjacent ops that pass each other's tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import ConfigError
from ..memory import Tensor
from ..ops.fa_norm_rope import fa_norm_rope
from ..ops.mat_vec import mat_vec_most
from ..ops.matmul import NormOutput, gate_up_pair, matmul, norm_input
from ..ops.moe import ExpertSum, route_epilogue
from ..ops.mul_mat_id import mat_vec_tokens, mul_mat_id, mul_mat_id_sum, summed_down_fits
from ..ops.norm import rms_norm
from ..ops.kv_quant import is_quantised, plain_cache
from ..ops.norm_rope import can_store_v
from .nodes import Attend, Glu, MatMul, MoeCombine, MulMatId, Node, Norm, NormRope, QKRope, Residual, Route

# name: (what it fuses, the fusions it builds on)
FUSIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "add_norm": ("a block's output added into the residual stream inside the next RMS norm", ()),
    "combine_norm": ("a MoE block's weighted sum of its experts added inside the next RMS norm (no moe_combine "
                     "pass)", ("add_norm",)),
    "resid_norm": ("decode: the experts' down projection sums its slots into the residual stream and its last "
                   "workgroup does the next RMS norm", ()),
    "norm_rope": ("q/k norm, RoPE and K's cache store as one norm_rope kernel a tensor (a quantised cache's "
                  "rotation and quantisation in the store)", ()),
    "qk_rope": ("the queries' norm_rope in K's dispatch", ("norm_rope",)),
    "kv_store": ("V's cache store in K's norm_rope dispatch", ("norm_rope",)),
    "fa_rope": ("decode, one token: norm_rope's work in flash attention's prologue", ("norm_rope",)),
    "gate_up": ("decode: a gated FFN's gate and up projections and the activation in one mat-vec pass", ()),
    "route": ("decode: the routing (softmax, top-k) in the last workgroup of the router's mat-vec", ()),
    "norm_route": ("decode: the residual add and RMS norm before a MoE block in its router's mat-vec",
                   ("route",)),
    "stacked": ("decode: projections of one input whose weights and outputs lie back to back (attention's q, "
                "k and v; a DeltaNet block's qkv and gate, its alpha and beta) as one mat-vec", ()),
}
ALL = frozenset(FUSIONS)


def enabled(items: tuple[str, ...], source: str = "VKRT_FUSE") -> frozenset[str]:
    """The fusions VKRT_FUSE's items turn on: `all` (also no items), `none`, names (each brings the
    fusions it builds on), or `-name`s (all but those, and but what builds on them)."""
    names = set()
    drop = set()
    for item in items:
        name = item.lstrip("-")
        if name in ("all", "none") and not item.startswith("-"):
            names |= ALL if name == "all" else set()
            continue
        if name not in FUSIONS:
            raise ConfigError(f"{source}: {item!r} is not a fusion; expected all, none, or names from "
                              f"{', '.join(FUSIONS)} (a leading '-' leaves one out of all)")
        (drop if item.startswith("-") else names).add(name)
    if not items or (drop and not names):
        names = set(ALL)
    for name in list(names):
        names |= set(FUSIONS[name][1])
    while True:   # what builds on a dropped fusion goes with it
        gone = {n for n in names - drop if any(req in drop or req not in names for req in FUSIONS[n][1])}
        if not gone:
            break
        drop |= gone
    return frozenset(names - drop)


# -- the fused ops ----------------------------------------------------------------------------------

@dataclass(eq=False)
class AddNorm(Node):
    """Residual + Norm in one rms_norm: the block output (or, with `combine`, the MoE block's
    unsummed experts) added into x as the norm reads it."""

    res: Residual
    norm: Norm
    combine: MoeCombine | None = None

    def record(self, seq) -> None:
        r, n, c = self.res, self.norm, self.combine
        T, first = r.x.ne[1], r.first
        pending = r.o if c is None else ExpertSum(c.experts_out, c.weights, c.out, c.shared, c.shared_gate)
        pending = pending.slice(1, first, T)
        x = r.x.slice(1, first, T)
        rms_norm(seq, x, n.dst.slice(1, first, T), n.eps, n.weight, residual=pending, sum_out=x)


@dataclass(eq=False)
class RoutedMatMul(Node):
    """The router's MatMul routing its tokens in its last workgroup (`epilogue`), after the
    residual add and norm in its prologue where `norm_in` says."""

    mm: MatMul
    epilogue: object
    norm_in: object = None

    def record(self, seq) -> None:
        matmul(seq, self.mm.w, self.mm.x, self.mm.y, route=self.epilogue, norm_in=self.norm_in)


@dataclass(eq=False)
class GateUp(Node):
    """Glu(gate·x, up·x) in one mat-vec pass (dense or the experts')."""

    gate: MatMul | MulMatId
    up: MatMul | MulMatId
    glu: Glu

    def record(self, seq) -> None:
        g, u, act = self.gate, self.up, self.glu.act
        if isinstance(g, MatMul):
            matmul(seq, g.w, g.x, self.glu.h, up_weight=u.w, act=act)
        else:
            up_bias = u.bias if g.bias is not None else None
            mul_mat_id(seq, g.w, g.x, g.sid, self.glu.h, g.routes, up_weight=u.w, act=act, bias=g.bias,
                       up_bias=up_bias)


@dataclass(eq=False)
class SummedDown(Node):
    """The experts' down projection, their weighted sum, the residual add and the next norm in one
    mat-vec dispatch (`counter` counts its workgroups)."""

    down: MulMatId
    combine: MoeCombine
    res: Residual
    norm: Norm
    counter: Tensor

    def record(self, seq) -> None:
        d, n = self.down, self.norm
        done = mul_mat_id_sum(seq, d.w, d.x, d.sid, self.combine.weights, self.res.x,
                              NormOutput(n.weight, n.eps, n.dst, self.counter))
        assert done, "summed_down_fits said it would"


@dataclass(eq=False)
class AttendRoped(Node):
    """Attention doing the rope op's work in its prologue; the rope op recorded first where the
    attention turns the prologue down."""

    rope: QKRope | NormRope
    attend: Attend
    prologue: object

    def record(self, seq) -> None:
        op = self.attend.build(seq.device, self.prologue)
        if op.prologue is None:
            self.rope.record(seq)
        op.record(seq)


# -- the rules --------------------------------------------------------------------------------------

class _Pass:
    def __init__(self, device, on: frozenset[str], counter: Tensor | None):
        self.device, self.on, self.counter = device, on, counter
        self.tuning = device.tuning

    def run(self, nodes: list[Node]) -> list[Node]:
        out, i = [], 0
        rules = (self.summed_down, self.combine_norm, self.norm_route, self.route, self.add_norm, self.attend_roped,
                 self.norm_rope, self.gate_up, self.stacked)
        while i < len(nodes):
            for rule in rules:
                hit = rule(nodes, i)
                if hit is not None:
                    used, node, anchor = hit
                    node.part, node.segment = nodes[i + anchor].part, nodes[i + anchor].segment
                    out.append(node)
                    i += used
                    break
            else:
                out.append(nodes[i])
                i += 1
        return out

    @staticmethod
    def _window(nodes, i, *kinds) -> list | None:
        run = nodes[i:i + len(kinds)]
        if len(run) != len(kinds) or any(n.segment != run[0].segment for n in run):   # never across a cut
            return None
        return run if all(isinstance(n, k) for n, k in zip(run, kinds)) else None

    @staticmethod
    def _joins(res: Residual, norm: Norm) -> bool:
        return norm.src is res.x and norm.first == res.first

    def summed_down(self, nodes, i):
        run = self._window(nodes, i, MulMatId, MoeCombine, Residual, Norm)
        if run is None or "resid_norm" not in self.on or self.counter is None:
            return None
        d, c, r, n = run
        if (c.experts_out is not d.y or c.shared is not None or r.o is not c.out or not self._joins(r, n)
                or d.bias is not None or n.weight is None
                or not summed_down_fits(self.device, d.w, d.sid.ne[1], d.sid.ne[0])):
            return None
        return 4, SummedDown(d, c, r, n, self.counter), 0

    def combine_norm(self, nodes, i):
        run = self._window(nodes, i, MoeCombine, Residual, Norm)
        if run is None or not {"combine_norm", "add_norm"} <= self.on:
            return None
        c, r, n = run
        if r.o is not c.out or not self._joins(r, n):
            return None
        return 3, AddNorm(r, n, combine=c), 2

    def _epilogue(self, mm: MatMul, route: Route):
        if "route" not in self.on or route.logits is not mm.y or self.counter is None:
            return None
        return route_epilogue(self.device, mm.w, mm.y, route.ids, route.weights, route.n_used, route.normalize,
                              self.counter, **route.gating())

    def norm_route(self, nodes, i):
        run = self._window(nodes, i, Residual, Norm, MatMul, Route)
        if run is None or "norm_route" not in self.on:
            return None
        r, n, mm, route = run
        if not self._joins(r, n) or r.first or mm.x is not n.dst:
            return None
        # one token only: every workgroup of the router's mat-vec redoes the norm of each column.
        # H100, Qwen3.5-35B-A3B shape in VRAM, a 2-token verify step 5.95 ms fused, 5.58 ms with
        # the norm's own dispatch (one token: 4.77 / 4.71 ms, bench/speculative.py)
        if n.dst.nelements != n.dst.ne[0]:
            return None
        epilogue = self._epilogue(mm, route)
        norm_in = epilogue and norm_input(self.device, r.x, r.o, n.weight, n.eps, n.dst)
        if norm_in is None:
            return None
        return 4, RoutedMatMul(mm, epilogue, norm_in), 2

    def route(self, nodes, i):
        run = self._window(nodes, i, MatMul, Route)
        epilogue = run and self._epilogue(*run)
        return None if epilogue is None else (2, RoutedMatMul(run[0], epilogue), 0)

    def add_norm(self, nodes, i):
        run = self._window(nodes, i, Residual, Norm)
        if run is None or "add_norm" not in self.on or not self._joins(*run):
            return None
        return 2, AddNorm(*run), 1

    def _rope(self, op: QKRope):
        """The rope op as the norm_rope fusions have it."""
        if "norm_rope" not in self.on or not (plain_cache(op.k_cache) or is_quantised(op.k_cache)):
            return op
        return NormRope(op, with_q="qk_rope" in self.on and not op.q_temp,
                        store_v="kv_store" in self.on and can_store_v(op.k3, op.k_cache, op.v3, op.v_cache))

    def attend_roped(self, nodes, i):
        run = self._window(nodes, i, QKRope, Attend)
        if run is None or "fa_rope" not in self.on:
            return None
        op, attend = run
        if not attend.flash or op.q3.ne[2] != 1 or op.q_temp:
            return None
        prologue = fa_norm_rope(self.device, op.q3, op.k3, op.v3, op.pos, op.cells, op.k_cache, op.v_cache,
                                q_weight=op.q_norm, k_weight=op.k_norm, eps=op.eps, rope_args=op.rope_args,
                                k_rot=op.k_rot, v_rot=op.v_rot)
        return None if prologue is None else (2, AttendRoped(self._rope(op), attend, prologue), 1)

    def norm_rope(self, nodes, i):
        op = nodes[i]
        if not isinstance(op, QKRope) or "norm_rope" not in self.on:
            return None
        return 1, self._rope(op), 0

    def gate_up(self, nodes, i):
        if "gate_up" not in self.on:
            return None
        run = self._window(nodes, i, MatMul, MatMul, Glu) or self._window(nodes, i, MulMatId, MulMatId, Glu)
        if run is None:
            return None
        g, u, glu = run
        if g.x is not u.x or glu.g is not g.y or glu.u is not u.y:
            return None
        if isinstance(g, MatMul):
            fits = g.kernel_columns is None and g.x.ne[1] <= mat_vec_most(self.tuning)   # in runs, as plain ones
        else:
            fits = g.sid is u.sid and g.own_bias and g.sid.ne[1] <= mat_vec_tokens(self.tuning)
        if not fits or gate_up_pair(g.w, u.w, self.device, glu.act) is None:
            return None
        return 3, GateUp(g, u, glu), 0

    def stacked(self, nodes, i):
        first = nodes[i]
        if "stacked" not in self.on or not isinstance(first, MatMul) or first.kernel_columns is not None \
                or first.x.ne[1] > mat_vec_most(self.tuning):   # the mat-vec: a row's sum whatever the rows
            return None
        w, y, used = first.w, first.y, 1
        while self._window(nodes, i, *(MatMul,) * (used + 1)) is not None:   # as many as stack
            b = nodes[i + used]
            w2, y2 = stacked_tensor(w, b.w, 1), stacked_tensor(y, b.y, 0)
            if b.x is not first.x or b.kernel_columns is not None or w2 is None or y2 is None:
                break
            w, y, used = w2, y2, used + 1
        return None if used == 1 else (used, MatMul(w, first.x, y), 0)


def stacked_tensor(a: Tensor, b: Tensor, dim: int) -> Tensor | None:
    """The 2-D tensor of a then b along `dim` (a weight's rows: 1; an output's: 0), where b starts
    where a's next element along dim would (same buffer, type, sizes and strides otherwise: an
    output of one column has no column stride to match); else None."""
    other = 1 - dim
    one_column = dim == 0 and a.ne[1] == b.ne[1] == 1   # its column stride says nothing
    if (a.buffer is not b.buffer or a.type is not b.type or a.ne[other] != b.ne[other] or a.ne[2:] != (1, 1)
            or b.ne[2:] != (1, 1) or a.nb[0] != b.nb[0] or (a.nb[1] != b.nb[1] and not one_column)
            or b.offset != a.offset + a.ne[dim] * a.nb[dim]):
        return None
    ne = list(a.ne[:2])
    ne[dim] += b.ne[dim]
    nb1 = a.nb[0] * ne[0] if one_column else a.nb[1]
    return replace(a, ne=(*ne, 1, 1), nb=(a.nb[0], nb1, nb1 * ne[1], nb1 * ne[1]), ndim=2,
                   name=f"{a.name}+{b.name}", owner=None)


def fuse(nodes: list[Node], device, on: frozenset[str], counter: Tensor | None) -> list[Node]:
    """`nodes` with the fusions `on` applied (on `device`'s kernels and tuning); `counter`: an I32
    holding 0 between dispatches that the fused kernels counting their workgroups use (None:
    none of those)."""
    return _Pass(device, on, counter).run(nodes)
