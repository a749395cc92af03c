"""Mixture-of-experts matmul: y[:, i, t] = W[ids[i, t]] · x[:, i % x_slots, t].

W is a stack of expert matrices (K, M, n_expert); every token t routes to n_used experts. Up to
mat_vec_tokens() (tuning.mv_id_max_n) tokens, one mat-vec workgroup column per (token, slot)
pair. More tokens first build a route table (a counting pass: per expert, the pairs that chose
it), then run the tiled GEMM over (row tiles, token tiles, experts), where tiles past an
expert's count exit at once.
A per-expert bias (gpt-oss) is added in the mat-vec's store, or by add_id after the GEMM.
"""

from __future__ import annotations

from ..errors import UnsupportedShape
from ..memory import F32, I32, MemoryKind, Tensor, allocate
from ..owned import Owned
from ..pipeline import PushConstants, kernel
from .add_id import add_id
from .binding import bind_words
from .grid import ceil_div, groups_for
from .mat_vec import mat_vec_kernel, wide_ok
from .matmul import NormOutput, gate_up_pair, gemm_kernel, gemm_tuning, norm_output_fits, vec4_ok
from .quant import check_layout, chunks, kernel_type

COUNT_PUSH = PushConstants(("n_tokens", "u32"), ("n_used", "u32"), ("ids_off", "u32"), ("ids_tok", "u32"),
                           ("n_expert", "u32"), ("cap", "u32"))


class RouteTable(Owned):
    """Device scratch for the counting pass: n_expert counters, then max_tokens entries per expert.
    Allocate once per (n_expert, max_tokens) and reuse across calls and replays; it serves stacks
    of up to n_expert experts (a call lays it out for its own count)."""

    def __init__(self, device, n_expert: int, max_tokens: int):
        super().__init__(f"route table {n_expert} experts x {max_tokens} tokens")
        self.n_expert, self.max_tokens = n_expert, max_tokens
        self.alloc = allocate(device, 4 * n_expert * (1 + max_tokens), MemoryKind.DEVICE, label=self.label)

    def counts(self):
        return self.alloc.range(0, 4 * self.n_expert)

    def whole(self):
        return self.alloc.range()

    def _release(self) -> None:
        self.alloc.close()


def _check(w: Tensor, x: Tensor, ids: Tensor, y: Tensor | None):
    """(K, M, n_expert, n_used, n_tokens) of the operands, or UnsupportedShape naming the bad one;
    y None: no per-slot output (mul_mat_id_sum checks its own)."""
    k, m, n_expert = w.ne[0], w.ne[1], w.ne[2]
    if w.ne[3] != 1:
        raise UnsupportedShape(f"mul_mat_id weight {w!r} must be 3-D (K, M, n_expert)")
    if ids.type != I32 or ids.ne[2] != 1 or ids.ne[3] != 1 or ids.nb[0] != 4 or ids.offset % 4 or ids.nb[1] % 4:
        raise UnsupportedShape(f"mul_mat_id ids must be a 4-byte aligned I32 (n_used, n_tokens) tensor, got {ids!r}")
    n_used, n_tokens = ids.ne[0], ids.ne[1]
    if x.ne[2] != n_tokens or x.ne[1] not in (1, n_used) or x.ne[3] != 1:
        raise UnsupportedShape(f"mul_mat_id x must be (K, 1 or n_used = {n_used}, n_tokens = {n_tokens}), got {x!r}")
    if y is not None and y.ne[1:] != (n_used, n_tokens, 1):
        raise UnsupportedShape(f"mul_mat_id y must be (M = {m}, n_used = {n_used}, n_tokens = {n_tokens}), got {y!r}")
    for t, what, size in ((x, "x", k), (y, "y", m)):
        if t is not None and (t.type.name != "F32" or t.ne[0] != size or t.nb[0] != 4 or t.offset % 4
                              or any(s % 4 for s in t.nb)):
            raise UnsupportedShape(f"mul_mat_id {what} must be F32 with ne[0] = {size} and 4-byte aligned rows, "
                                   f"got {t!r}")
    return k, m, n_expert, n_used, n_tokens


def mat_vec_tokens(tuning) -> int:
    """The most tokens mul_mat_id (and its fused passes) runs as mat-vecs rather than the GEMM,
    wherever the stack lies (the bits do not depend on the experts' placement)."""
    return max(tuning.mv_max_n, tuning.mv_id_max_n)


def mul_mat_id(seq, w: Tensor, x: Tensor, ids: Tensor, y: Tensor, routes: RouteTable | None = None, *,
               tuning=None, max_binding: int | None = None, act: str = "silu", up_weight: Tensor | None = None, bias: Tensor | None = None, up_bias: Tensor | None = None,
               routes_counted: bool = False) -> bool:
    """Record the expert matmul. w: (K, M, n_expert) of a supported type; x: F32 (K, 1 or n_used,
    n_tokens); ids: I32 (n_used, n_tokens) expert indices, distinct per token; y: F32 (M, n_used,
    n_tokens). More than mat_vec_tokens() tokens need `routes` (RouteTable(device, n_expert, >=
    n_tokens)); as many run as mat-vecs. An expert stack larger than one binding runs in expert ranges. With `up_weight`
    (an up stack laid out like w; mat-vec sizes only), y = act(w·x) * (up_weight·x) in one pass.
    `bias` F32 (M, n_expert): y[:, i, t] += bias[:, ids[i, t]] (ggml's add_id; the ids must be the
    experts' own, not staging slots); with up_weight, `up_bias` is up_weight's, both added before
    the activation. `routes_counted`: `routes` already holds these ids' routes (an earlier call
    recorded before this one, over the same ids and tokens, with nothing between that refills
    it), so the counting pass is not recorded again. Returns whether `routes` holds the ids'
    routes after the call (the GEMM ran; the mat-vec sizes never fill it)."""
    device = seq.device
    tune = tuning or device.tuning
    typ = kernel_type(w.type, f"mul_mat_id weight {w.name or ''}".rstrip())
    check_layout(w, "mul_mat_id weight")
    k, m, n_expert, n_used, n_tokens = _check(w, x, ids, y)
    xr, xo = bind_words(x, "mul_mat_id x", device)
    yr, yo = bind_words(y, "mul_mat_id y", device)
    ir, io = bind_words(ids, "mul_mat_id ids", device)
    xo, yo = xo // 4, yo // 4
    x_slot, x_tok, y_slot, y_tok = x.nb[1] // 4, x.nb[2] // 4, y.nb[1] // 4, y.nb[2] // 4
    mv_max = mat_vec_tokens(tune)
    common = {"K": k, "x_off": xo, "x_col": x_tok, "y_off": yo, "y_col": y_tok, "w_row": w.nb[1],
              "w_expert": w.nb[2], "n_used": n_used, "x_slot": x_slot, "x_slots": x.ne[1], "y_slot": y_slot}
    xvec4 = vec4_ok(x, xo, x_slot, x_tok)
    biases = [b for b in (bias, up_bias) if b is not None]
    if (up_bias is not None) != (up_weight is not None and bias is not None):
        raise UnsupportedShape("mul_mat_id: up_bias goes with up_weight and a bias")
    for b in biases:
        if b.type != F32 or not b.is_contiguous() or b.ne[:3] != (m, n_expert, 1) or b.offset % 4:
            raise UnsupportedShape(f"mul_mat_id: a bias must be contiguous F32 ({m}, {n_expert}), got {b!r}")
    bound = [bind_words(b, "mul_mat_id bias", device) for b in biases]
    extra = [r for r, _ in bound]
    if bias is not None:
        common["b_off"] = bound[0][1] // 4
        if up_bias is not None:
            common["b2_off"] = bound[1][1] // 4
    if up_weight is not None:
        pair = gate_up_pair(w, up_weight, device, act) if n_tokens <= mv_max else None
        if pair is None:
            raise UnsupportedShape(f"mul_mat_id: {w!r} and {up_weight!r} cannot be read in one pass (at most "
                                   f"{mv_max} tokens, same type and layout, one binding for both)")
        mv = mat_vec_kernel(device, typ, 1, tune, k=k, m=m, layers=n_tokens * n_used, xvec4=xvec4, entry="mul_mv_id",
                            gate_up=act, bias=bias is not None,
                            wide=wide_ok(typ, pair[1], pair[2], w.nb[1], w.nb[2]))
        push = {**common, "M": m, "w_off": pair[1], "w2_off": pair[2], "e0": 0, "e1": n_expert,
                "ids_off": io // 4, "ids_tok": ids.nb[1] // 4}
        seq.dispatch(mv.kernel, [pair[0], xr, yr, ir, *extra], push=push,
                     groups=mv.groups(m, device, n_tokens * n_used), label="mul_mv_id gate/up")
        return False
    pieces = chunks(2, device, max_binding, w)
    if n_tokens <= mv_max:
        pieces_bound = [(e0, e1, *bind_words(w.slice(2, e0, e1), "mul_mat_id w", device, max_binding)) for e0, e1 in pieces]
        mv = mat_vec_kernel(device, typ, 1, tune, k=k, m=m, layers=n_tokens * n_used, xvec4=xvec4,
                            entry="mul_mv_id", bias=bias is not None,
                            wide=wide_ok(typ, w.nb[1], w.nb[2], *(b[3] for b in pieces_bound)))
        for e0, e1, wr, wo in pieces_bound:
            push = {**common, "M": m, "w_off": wo, "e0": e0, "e1": e1, "ids_off": io // 4, "ids_tok": ids.nb[1] // 4}
            seq.dispatch(mv.kernel, [wr, xr, yr, ir, *extra], push=push,
                         groups=mv.groups(m, device, n_tokens * n_used))
        return False
    if routes is None or routes.n_expert < n_expert or routes.max_tokens < n_tokens:   # a wider table serves
        raise UnsupportedShape(f"mul_mat_id of {n_tokens} tokens needs RouteTable(device, >= {n_expert}, >= {n_tokens}), "
                         f"got {routes!r}")
    if not routes_counted:
        count = kernel(device, "mmid_count", push=COUNT_PUSH, workgroup=(device.tuning.wg_size,))
        seq.fill(routes.counts(), 0)
        seq.dispatch(count, [ir, routes.whole()], groups=groups_for(count, n_tokens * n_used),
                     push={"n_tokens": n_tokens, "n_used": n_used, "ids_off": io // 4, "ids_tok": ids.nb[1] // 4,
                           "n_expert": n_expert, "cap": n_tokens})
    gt = gemm_tuning(tune, n_tokens * n_used / n_expert, spread=True)
    kern = gemm_kernel(device, typ, gt, xvec4=xvec4, mul_mat_id=True)
    for e0, e1 in pieces:
        wr, wo = bind_words(w.slice(2, e0, e1), "mul_mat_id w", device, max_binding)
        gemm = {n: v for n, v in common.items() if n not in ("b_off", "b2_off")}   # add_id adds the bias after
        push = {**gemm, "M": m, "N": n_tokens, "w_off": wo, "e0": e0, "n_expert": n_expert}
        seq.dispatch(kern, [wr, xr, yr, routes.whole()], push=push,
                     groups=(ceil_div(m, gt.mm_bm), ceil_div(n_tokens, gt.mm_bn), e1 - e0))
    if bias is not None:
        add_id(seq, y, bias, ids, y)
    return True


def summed_down_fits(device, w: Tensor, n_tokens: int, n_used: int, tuning=None) -> bool:
    """Whether mul_mat_id_sum takes this expert stack for n_tokens tokens of n_used slots: mat-vec
    sizes, the stack in one binding, a workgroup that takes a token's slots at once
    (norm_output_fits)."""
    tune = tuning or device.tuning
    if n_tokens > mat_vec_tokens(tune) or len(chunks(2, device, None, w)) != 1:
        return False
    typ = kernel_type(w.type, f"mul_mat_id weight {w.name or ''}".rstrip())
    return norm_output_fits(device, w.ne[1], n_used, typ, w.ne[0], tune)


def mul_mat_id_sum(seq, w: Tensor, x: Tensor, ids: Tensor, weights: Tensor, stream: Tensor, norm: NormOutput, *,
                   tuning=None) -> bool:
    """Record stream[:, t] += sum_j weights[j, t] * (w[ids[j, t]] · x[:, j, t]) and then
    norm.out = rms_norm(stream) * norm.weight: the expert down projection, moe_combine, the
    residual add and the next RMS norm in one pass, bit for bit the same as those kernels apart
    (mat-vec sizes; the stack in one binding; a workgroup that takes a token's slots at once:
    norm_output_fits). Returns False, recording nothing, where it does not apply (the caller runs
    mul_mat_id, moe_combine and the add and norm)."""
    device = seq.device
    tune = tuning or device.tuning
    typ = kernel_type(w.type, f"mul_mat_id weight {w.name or ''}".rstrip())
    check_layout(w, "mul_mat_id weight")
    k, m, n_expert, n_used, n_tokens = _check(w, x, ids, None)
    if not summed_down_fits(device, w, n_tokens, n_used, tune):
        return False
    for t, what in ((weights, "weights"), (stream, "stream")):
        if t.type != F32 or not t.is_contiguous() or t.offset % 4:
            raise UnsupportedShape(f"mul_mat_id_sum {what} must be a contiguous, 4-byte aligned F32 tensor, got {t!r}")
    if stream.nelements != m * n_tokens or weights.nelements < n_used * n_tokens:
        raise UnsupportedShape(f"mul_mat_id_sum: stream {list(stream.ne)} / weights {list(weights.ne)} do not fit "
                               f"{m} rows x {n_tokens} tokens of {n_used} slots")
    if norm.weight.type != F32 or norm.weight.nelements != m or norm.out.ne[:2] != (m, n_tokens) \
            or norm.out.type != F32 or norm.out.nb[0] != 4:
        raise UnsupportedShape(f"mul_mat_id_sum: the norm needs an F32 weight of {m} and an F32 out of {m} x "
                               f"{n_tokens}, got {norm.weight!r} / {norm.out!r}")
    xr, xo = bind_words(x, "mul_mat_id_sum x", device)
    yr, yo = bind_words(stream, "mul_mat_id_sum stream", device)
    ir, io = bind_words(ids, "mul_mat_id_sum ids", device)
    wtr, wto = bind_words(weights, "mul_mat_id_sum weights", device)
    wr, wo = bind_words(w, "mul_mat_id_sum w", device)
    (cr, co), (nwr, nwo), (nor, noo) = (bind_words(t, f"mul_mat_id_sum norm {what}", device) for t, what in
                                        ((norm.counter, "counter"), (norm.weight, "weight"), (norm.out, "out")))
    x_slot, x_tok = x.nb[1] // 4, x.nb[2] // 4
    push = {"K": k, "M": m, "w_off": wo, "w_row": w.nb[1], "x_off": xo // 4, "x_col": x_tok, "y_off": yo // 4,
            "y_col": m, "w_expert": w.nb[2], "e0": 0, "e1": n_expert, "n_used": n_used, "ids_off": io // 4,
            "ids_tok": ids.nb[1] // 4, "x_slot": x_slot, "x_slots": x.ne[1], "y_slot": 0, "wt_off": wto // 4,
            "count_off": co // 4, "n_w_off": nwo // 4, "n_o_off": noo // 4, "n_o_col": norm.out.nb[1] // 4,
            "n_eps": float(norm.eps)}
    mv = mat_vec_kernel(device, typ, 1, tune, k=k, m=m, layers=n_tokens, xvec4=vec4_ok(x, xo // 4, x_slot, x_tok),
                        entry="mul_mv_id_sum", slots=n_used, wide=wide_ok(typ, wo, w.nb[1], w.nb[2]))
    seq.dispatch(mv.kernel, [wr, xr, yr, ir, wtr, cr, nwr, nor], push=push, groups=mv.groups(m, device, n_tokens),
                 label="mul_mat_id_sum")
    return True
