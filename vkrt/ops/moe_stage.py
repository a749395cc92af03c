"""Staging the selected experts of a decode step: a plan (the distinct experts the tokens chose,
and each (token, slot) pair's index into that list), then per expert stack a copy of just those
experts into consecutive device slots. mul_mat_id then reads the slots with the remapped ids.

Used for experts kept in host memory: one wide, many-loads-in-flight copy per stack moves the
bytes over the link faster than the mat-vec's own reads, and gate, up and down copy at once.
"""

from __future__ import annotations

from ..errors import UnsupportedShape
from ..memory import I32, Tensor
from ..pipeline import PushConstants, kernel
from .binding import bind_tensor
from .matmul import fold
from .quant import bind_words, chunks

PLAN_PUSH = PushConstants(("n_used", "u32"), ("n_tokens", "u32"), ("ids_off", "u32"), ("ids_tok", "u32"),
                          ("remap_off", "u32"), ("n_expert", "u32"), ("plan_off", "u32"))
COPY_PUSH = PushConstants(("units", "u32"), ("src_off", "u32"), ("src_expert", "u32"), ("e0", "u32"),
                          ("e1", "u32"), ("dst_off", "u32"), ("dst_slot", "u32"), ("plan_off", "u32"))
PLAN_WG = 64
COPY_WG, COPY_UNROLL = 256, 4


def plan_words(n_expert: int) -> int:
    """uint32 words a plan for `n_expert` experts takes."""
    return 1 + n_expert


def stage_unit(stack: Tensor) -> int:
    """Bytes the copy moves per load for `stack` (16 or 4), or 0 when the stack cannot be staged
    (experts not contiguous, or not 4-byte aligned)."""
    per_expert = stack.nb[1] * stack.ne[1]
    if stack.ne[3] != 1 or stack.nb[2] != per_expert:
        return 0
    for unit in (16, 4):
        if stack.offset % unit == 0 and per_expert % unit == 0:
            return unit
    return 0


def moe_stage_plan(seq, ids: Tensor, remap: Tensor, plan: Tensor, n_expert: int) -> None:
    """Record the plan: ids I32 (n_used, n_tokens) -> remap I32 (n_used, n_tokens) contiguous
    and plan (at least plan_words(n_expert) uint32 words)."""
    n_used, n_tokens = ids.ne[0], ids.ne[1]
    if ids.type is not I32 or ids.nb[0] != 4 or ids.offset % 4 or ids.nb[1] % 4:
        raise UnsupportedShape(f"moe_stage_plan: ids must be 4-byte aligned I32 (n_used, n_tokens), got {ids!r}")
    if remap.type is not I32 or not remap.is_contiguous() or remap.nelements < n_used * n_tokens:
        raise UnsupportedShape(f"moe_stage_plan: remap must be contiguous I32 ({n_used}, {n_tokens}), got {remap!r}")
    if plan.nbytes < 4 * plan_words(n_expert):
        raise UnsupportedShape(f"moe_stage_plan: the plan needs {plan_words(n_expert)} words, got {plan!r}")
    ir, io = bind_tensor(ids)
    rr, ro = bind_tensor(remap)
    pr, po = bind_tensor(plan)
    k = kernel(seq.device, "moe_stage_plan", defines={"WG": PLAN_WG, "N_EXPERT": n_expert}, push=PLAN_PUSH,
               workgroup=(PLAN_WG,))
    seq.dispatch(k, [ir, rr, pr], groups=(1, 1, 1), label="moe_stage_plan",
                 push=dict(n_used=n_used, n_tokens=n_tokens, ids_off=io // 4, ids_tok=ids.nb[1] // 4,
                           remap_off=ro // 4, n_expert=n_expert, plan_off=po // 4))


def moe_stage_copy(seq, stack: Tensor, slots: Tensor, plan: Tensor, *, max_binding: int | None = None) -> None:
    """Record the copy of the planned experts of `stack` (K, M, n_expert) into `slots` (K, M,
    n_slots) of the same type, contiguous; n_slots must cover every plan this step can make."""
    unit = stage_unit(stack)
    per_expert = stack.nb[1] * stack.ne[1]
    if not unit:
        raise UnsupportedShape(f"moe_stage_copy: {stack!r} has no contiguous, 4-byte aligned experts")
    if slots.type != stack.type or slots.ne[:2] != stack.ne[:2] or not slots.is_contiguous() or slots.offset % unit:
        raise UnsupportedShape(f"moe_stage_copy: slots {slots!r} must be a contiguous {stack.type.name} "
                               f"({stack.ne[0]}, {stack.ne[1]}, n) tensor aligned to {unit} bytes")
    dr, do = bind_tensor(slots, min_align=16)
    pr, po = bind_tensor(plan)
    units = per_expert // unit
    per_group = COPY_WG * COPY_UNROLL
    k = kernel(seq.device, "moe_stage_copy", push=COPY_PUSH, workgroup=(COPY_WG,),
               defines={"WG": COPY_WG, "UNROLL": COPY_UNROLL, **({"VEC4": 1} if unit == 16 else {})})
    for e0, e1 in chunks(2, seq.device, max_binding, stack):
        sr, so = bind_words(stack.slice(2, e0, e1), seq.device, max_binding)
        seq.dispatch(k, [sr, dr, pr], label=f"stage {stack.name or 'experts'}",
                     groups=(*fold(-(-units // per_group), seq.device), slots.ne[2]),
                     push=dict(units=units, src_off=so // unit, src_expert=per_expert // unit, e0=e0, e1=e1,
                               dst_off=do // unit, dst_slot=per_expert // unit, plan_off=po // 4))
