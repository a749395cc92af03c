"""Mixture-of-experts glue: routing (softmax, top-k, optional renormalisation, or gpt-oss's
softmax of the chosen experts' logits, or glm4moe's sigmoid gating with a selection bias) and the weighted combination of the experts' outputs
(with qwen2moe's gated shared expert)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import OutOfRange
from ..memory import I32, Tensor
from ..pipeline import PushConstants, kernel
from .binding import bind_tensor, f32_binding
from .grid import ceil_div, grid, groups_for
from .mat_vec import mat_vec_columns, mat_vec_most
from .matmul import RouteEpilogue
from .quant import chunks
from .reduce import subgroup_defines

ROUTER_PUSH = PushConstants(("n_expert", "u32"), ("n_used", "u32"), ("n_tokens", "u32"), ("l_off", "u32"),
                            ("l_col", "u32"), ("ids_off", "u32"), ("w_off", "u32"), ("mode", "u32"),
                            ("b_off", "u32"))
COMBINE_PUSH = PushConstants(("n_embd", "u32"), ("n_used", "u32"), ("n_tokens", "u32"), ("y_off", "u32"),
                             ("w_off", "u32"), ("s_off", "u32"), ("g_off", "u32"), ("o_off", "u32"),
                             ("has_shared", "u32"))
MAX_USED = 16
ROUTER_WG = 64     # the router's workgroup
ROUTER_EPT = 32    # experts one router invocation holds at most (bits of its taken mask)
ROUTE_COUNTERS = 16   # workgroup counters a router's mat-vec takes: one a run of columns


def router_layout(device, subgroups: bool | None = None, one_subgroup: bool | None = None) -> tuple[int, bool]:
    """(workgroup size, subgroup arithmetic) of the router. With subgroup arithmetic and
    `one_subgroup` (None: where subgroups are a fixed 32 or 64 lanes) the workgroup is one
    subgroup, whose reductions need no shared memory or barriers; else ROUTER_WG."""
    prof = device.profile
    if subgroups is None:
        subgroups = prof.subgroup_arithmetic
    fixed = prof.subgroup_min == prof.subgroup_max
    if one_subgroup is None:
        one_subgroup = fixed and prof.subgroup_min in (32, 64)
    if subgroups and one_subgroup:
        if not fixed:
            raise OutOfRange(f"moe_route: {prof.name} has no fixed subgroup size for a one-subgroup router")
        return prof.subgroup_min, True
    return ROUTER_WG, subgroups


def moe_route_kernel(device, n_expert: int, subgroups: bool | None = None, one_subgroup: bool | None = None):
    """The routing pipeline (softmax, top-k, renormalisation: one workgroup per token) for
    `n_expert` experts; `subgroups` None uses subgroup arithmetic where the device has it;
    `one_subgroup`: see router_layout."""
    wg, subgroups = router_layout(device, subgroups, one_subgroup)
    defines = {"WG": wg, "EPT": ceil_div(n_expert, wg)}
    if subgroups:
        defines.update(SUBGROUPS=1, NSG=max(1, wg // max(device.profile.subgroup_min, 1)), **subgroup_defines(device))
    return kernel(device, "moe_router", defines=defines, push=ROUTER_PUSH)


def _route_operands(logits: Tensor, ids: Tensor, weights: Tensor, n_used: int, normalize: bool,
                    chosen_softmax: bool, sigmoid_bias: Tensor | None, wg: int) -> tuple[list, dict]:
    """moe_route's checks; ([ids, weights, bias] bindings, its push fields but the logits')."""
    n_expert, n_tokens = logits.ne[0], logits.ne[1]
    if not 0 < n_used <= min(MAX_USED, n_expert):
        raise OutOfRange(f"moe_route: {n_used} experts per token; supported 1..{min(MAX_USED, n_expert)}")
    if n_expert > ROUTER_EPT * wg:
        raise OutOfRange(f"moe_route: {n_expert} experts; at most {ROUTER_EPT * wg} are supported")
    if ids.type is not I32 or not ids.is_contiguous() or ids.nelements < n_used * n_tokens:
        raise OutOfRange(f"moe_route: ids must be contiguous I32 [{n_used}, {n_tokens}], got {ids!r}")
    if not weights.is_contiguous() or weights.nelements < n_used * n_tokens:
        raise OutOfRange(f"moe_route: weights must be contiguous F32 [{n_used}, {n_tokens}], got {weights!r}")
    ir, io = bind_tensor(ids, "moe_route ids")
    wr, wo, _ = f32_binding(weights, "moe_route weights")
    mode = 2 if chosen_softmax else int(normalize)
    br, bo = wr, 0
    if sigmoid_bias is not None:
        if chosen_softmax or sigmoid_bias.nelements != n_expert:
            raise OutOfRange(f"moe_route: sigmoid gating takes a bias of {n_expert} experts (not with chosen_softmax), "
                             f"got {sigmoid_bias!r}")
        br, bo, _ = f32_binding(sigmoid_bias, "moe_route bias")
        mode = 4 if normalize else 3
    return [ir, wr, br], dict(n_used=n_used, ids_off=io // 4, w_off=wo, mode=mode, b_off=bo)


def moe_route(seq, logits: Tensor, ids: Tensor, weights: Tensor, n_used: int, normalize: bool, *,
              chosen_softmax: bool = False, sigmoid_bias: Tensor | None = None, subgroups: bool | None = None,
              one_subgroup: bool | None = None) -> None:
    """Record routing: logits F32 [n_expert, n_tokens] -> ids I32 and weights F32 [n_used, n_tokens]:
    the softmax probabilities of the n_used best experts, renormalised over them with `normalize`;
    with `chosen_softmax` the softmax of their logits alone (llama.cpp's SOFTMAX_WEIGHT gating,
    gpt-oss; the same values up to rounding). With `sigmoid_bias` (F32 [n_expert]; llama.cpp's
    SIGMOID gating with exp_probs_b, glm4moe): p = sigmoid(logits), the n_used best by p + bias,
    weighed by their p (with `normalize`: over max(sum, 2^-14)). `subgroups`, `one_subgroup`: see
    moe_route_kernel."""
    n_expert, n_tokens = logits.ne[0], logits.ne[1]
    wg = router_layout(seq.device, subgroups, one_subgroup)[0]
    buffers, push = _route_operands(logits, ids, weights, n_used, normalize, chosen_softmax, sigmoid_bias, wg)
    lr, lo, ls = f32_binding(logits, "moe_route logits")
    k = moe_route_kernel(seq.device, n_expert, subgroups, one_subgroup)
    seq.dispatch(k, [lr, *buffers], push=dict(n_expert=n_expert, n_tokens=n_tokens, l_off=lo, l_col=ls[0], **push),
                 groups=grid(seq.device, n_tokens), label="moe_route")


def route_epilogue(device, router: Tensor, logits: Tensor, ids: Tensor, weights: Tensor, n_used: int, normalize: bool,
                   counter: Tensor, *, chosen_softmax: bool = False, sigmoid_bias: Tensor | None = None,
                   one_subgroup: bool | None = None):
    """The RouteEpilogue that lets the router's mat-vec (`router` weights into `logits`) route its
    tokens as moe_route would, bit for bit, in its last workgroup, a run of columns at a time
    (`counter`: I32, a counter a run, holding 0, left 0); None where it cannot: more tokens than a
    mat-vec takes or runs than counters, a weight over one binding, a mat-vec workgroup that is
    not a multiple of the router's, subgroups of varying size.
    Where the router is one subgroup (router_layout; `one_subgroup` as there) the last
    workgroup's subgroups route, a token each at a time, without workgroup barriers."""
    tuning, prof = device.tuning, device.profile
    rwg, subgroups = router_layout(device, one_subgroup=one_subgroup)
    mv_wg = tuning.mv_wg
    n, cols = logits.ne[1], mat_vec_columns(tuning)
    if (n > mat_vec_most(tuning) or ceil_div(n, cols) > counter.nelements or mv_wg % rwg
            or (subgroups and prof.subgroup_min != prof.subgroup_max)
            or router.ne[1] != logits.ne[0] or len(chunks(1, device, None, router)) != 1):
        return None
    buffers, push = _route_operands(logits, ids, weights, n_used, normalize, chosen_softmax, sigmoid_bias, rwg)
    cr, co = bind_tensor(counter, "router counter")
    defines = {"RWG": rwg, "EPT": ceil_div(logits.ne[0], rwg)}
    if subgroups and rwg == prof.subgroup_min:   # a one-subgroup router: each subgroup routes its tokens
        defines.update(SUBGROUPS=1, NSG=1, ROUTE_SUBGROUP=1, ROUTE_SGS=mv_wg // rwg)
    elif subgroups:
        defines.update(SUBGROUPS=1, NSG=max(1, mv_wg // max(prof.subgroup_min, 1)))
    push["rw_off"] = push.pop("w_off")
    return RouteEpilogue(defines, (*buffers, cr), {**push, "count_off": co // 4}, counter.nelements)


def _combine_bindings(experts_out: Tensor, weights: Tensor, out: Tensor, shared: Tensor | None,
                      shared_gate: Tensor | None, op: str) -> list:
    """[(buffer, float offset)] of experts_out, weights, shared, shared_gate after moe_combine's
    checks (shared and its gate bind experts_out where there is no shared expert)."""
    n_embd, n_used, n_tokens = experts_out.ne[0], experts_out.ne[1], experts_out.ne[2]
    for t, name in ((experts_out, "experts_out"), (weights, "weights"), (out, "out")):
        if not t.is_contiguous():
            raise OutOfRange(f"{op}: {name} must be contiguous, got {t!r}")
    if out.nelements != n_embd * n_tokens or weights.nelements < n_used * n_tokens:
        raise OutOfRange(f"{op}: out {list(out.ne)} / weights {list(weights.ne)} do not fit "
                         f"experts_out {list(experts_out.ne)}")
    yr, yo, _ = f32_binding(experts_out, f"{op} experts_out")
    wr, wo, _ = f32_binding(weights, f"{op} weights")
    if shared is None:
        return [(yr, yo), (wr, wo), (yr, 0), (yr, 0)]
    if shared.nelements != n_embd * n_tokens or shared_gate is None or shared_gate.nelements < n_tokens:
        raise OutOfRange(f"{op}: the shared expert needs shared [n_embd, n_tokens] and a gate per token")
    sr, so, _ = f32_binding(shared, f"{op} shared")
    gr, go, _ = f32_binding(shared_gate, f"{op} shared_gate")
    return [(yr, yo), (wr, wo), (sr, so), (gr, go)]


@dataclass(frozen=True)
class ExpertSum:
    """A MoE block's output before its pass: out[:, t] = sum_j weights[j, t] * experts_out[:, j, t]
    (+ sigmoid(shared_gate[t]) * shared[:, t]). store() runs moe_combine into `out`; rms_norm
    takes it as its residual instead (the combine_norm fusion), adding the same sum, bit for bit,
    without the pass."""

    experts_out: Tensor
    weights: Tensor
    out: Tensor
    shared: Tensor | None = None
    shared_gate: Tensor | None = None

    def slice(self, dim: int, start: int, stop: int) -> "ExpertSum":
        """Tokens start..stop-1 (dim 1 of out: the token dimension of every part)."""
        if dim != 1:
            raise OutOfRange(f"ExpertSum slices tokens (dim 1), not dim {dim}")
        cols = (lambda t, d: None if t is None else t.slice(d, start, stop))
        return ExpertSum(cols(self.experts_out, 2), cols(self.weights, 1), cols(self.out, 1),
                         cols(self.shared, 1), cols(self.shared_gate, 1))

    def bindings(self, op: str) -> list:
        return _combine_bindings(self.experts_out, self.weights, self.out, self.shared, self.shared_gate, op)

    def store(self, seq) -> Tensor:
        moe_combine(seq, self.experts_out, self.weights, self.out, self.shared, self.shared_gate)
        return self.out


def moe_combine(seq, experts_out: Tensor, weights: Tensor, out: Tensor, shared: Tensor | None = None,
                shared_gate: Tensor | None = None) -> None:
    """Record out[:, t] = sum_j weights[j, t] * experts_out[:, j, t] (+ sigmoid(shared_gate[t]) *
    shared[:, t]). experts_out F32 [n_embd, n_used, n_tokens] contiguous; out [n_embd, n_tokens]."""
    n_embd, n_used, n_tokens = experts_out.ne[0], experts_out.ne[1], experts_out.ne[2]
    (yr, yo), (wr, wo), (sr, so), (gr, go) = _combine_bindings(experts_out, weights, out, shared, shared_gate,
                                                               "moe_combine")
    orr, oo, _ = f32_binding(out, "moe_combine out")
    k = kernel(seq.device, "moe_combine", push=COMBINE_PUSH, workgroup=(seq.device.tuning.wg_size,))
    seq.dispatch(k, [yr, wr, sr, gr, orr], push=dict(n_embd=n_embd, n_used=n_used, n_tokens=n_tokens, y_off=yo,
                                                     w_off=wo, s_off=so, g_off=go, o_off=oo,
                                                     has_shared=int(shared is not None)),
                 groups=groups_for(k, n_embd * n_tokens), label="moe_combine")
