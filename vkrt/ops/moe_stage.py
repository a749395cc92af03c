"""Staging the chosen experts of a decode step: a plan says where each (token, slot) pair reads
its expert from and which experts must be copied over the link, then one copy per expert stack
moves just those into device slots. mul_mat_id then reads the slots with the remapped ids.

With a per-layer cache (`cache_slots` > 0, its state in a device buffer: see
shaders/moe_stage_plan.comp) the copies land in least-recently-used cache slots and later steps
that choose the same experts read them without touching the link; beyond the cache, copies go to
staging slots from `stage_base` on. The cache lives entirely on the GPU: no host round trip.
"""

from __future__ import annotations

import numpy as np

from ..errors import UnsupportedShape
from ..memory import I32, Tensor
from ..pipeline import PushConstants, kernel
from .binding import bind_tensor, bind_words
from .grid import ceil_div, grid
from .quant import chunks

PLAN_PUSH = PushConstants(("n_used", "u32"), ("n_tokens", "u32"), ("ids_off", "u32"), ("ids_tok", "u32"),
                          ("remap_off", "u32"), ("n_expert", "u32"), ("plan_off", "u32"), ("state_off", "u32"),
                          ("stage_base", "u32"))
COPY_PUSH = PushConstants(("units", "u32"), ("src_off", "u32"), ("src_expert", "u32"), ("e0", "u32"),
                          ("e1", "u32"), ("dst_off", "u32"), ("dst_slot", "u32"), ("plan_off", "u32"))
PLAN_WG = 64
STATE_HEAD = 3   # clock, hits, misses
COPY_WG, COPY_UNROLL = 256, 4


def plan_words(n_expert: int) -> int:
    """uint32 words a plan for `n_expert` experts takes."""
    return 1 + 2 * n_expert


def cache_state_words(n_expert: int, cache_slots: int) -> int:
    """int32 words of one layer's cache state (initialise with initial_cache_state)."""
    return STATE_HEAD + n_expert + 2 * cache_slots


def initial_cache_state(n_expert: int, cache_slots: int) -> np.ndarray:
    """An empty cache: clock and counters 0, no expert in any slot."""
    state = np.zeros(cache_state_words(n_expert, cache_slots), np.int32)
    state[STATE_HEAD:STATE_HEAD + n_expert + cache_slots] = -1
    return state


def cache_counts(state: np.ndarray) -> tuple[int, int]:
    """(hits, misses) counted so far in one layer's cache state."""
    return int(state[1]), int(state[2])


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


def moe_stage_plan(seq, ids: Tensor, remap: Tensor, plan: Tensor, n_expert: int, *, state: Tensor | None = None,
                   cache_slots: int = 0, stage_base: int = 0) -> None:
    """Record the plan: ids I32 (n_used, n_tokens) -> remap I32 (n_used, n_tokens) contiguous
    and plan (plan_words(n_expert) words). With `cache_slots`, `state` (I32, cache_state_words)
    is the layer's cache; it must start initialised (initial_cache_state)."""
    n_used, n_tokens = ids.ne[0], ids.ne[1]
    if ids.type is not I32 or ids.nb[0] != 4 or ids.offset % 4 or ids.nb[1] % 4:
        raise UnsupportedShape(f"moe_stage_plan: ids must be 4-byte aligned I32 (n_used, n_tokens), got {ids!r}")
    if remap.type is not I32 or not remap.is_contiguous() or remap.nelements < n_used * n_tokens:
        raise UnsupportedShape(f"moe_stage_plan: remap must be contiguous I32 ({n_used}, {n_tokens}), got {remap!r}")
    if plan.nbytes < 4 * plan_words(n_expert):
        raise UnsupportedShape(f"moe_stage_plan: the plan needs {plan_words(n_expert)} words, got {plan!r}")
    if cache_slots and (state is None or state.type is not I32
                        or state.nelements < cache_state_words(n_expert, cache_slots)):
        raise UnsupportedShape(f"moe_stage_plan: a cache of {cache_slots} slots needs an I32 state of "
                               f"{cache_state_words(n_expert, cache_slots)} words, got {state!r}")
    ir, io = bind_tensor(ids, "moe_stage_plan ids")
    rr, ro = bind_tensor(remap, "moe_stage_plan remap")
    pr, po = bind_tensor(plan, "moe_stage_plan plan")
    sr, so = bind_tensor(state, "moe_stage_plan state") if state is not None else (pr, po)
    k = kernel(seq.device, "moe_stage_plan", push=PLAN_PUSH, workgroup=(PLAN_WG,),
               defines={"WG": PLAN_WG, "N_EXPERT": n_expert, "CACHE_SLOTS": cache_slots})
    seq.dispatch(k, [ir, rr, pr, sr], groups=(1, 1, 1), label="moe_stage_plan",
                 push=dict(n_used=n_used, n_tokens=n_tokens, ids_off=io // 4, ids_tok=ids.nb[1] // 4,
                           remap_off=ro // 4, n_expert=n_expert, plan_off=po // 4, state_off=so // 4,
                           stage_base=stage_base))


def moe_stage_copy(seq, stack: Tensor, slots: Tensor, plan: Tensor, max_copies: int, *,
                   max_binding: int | None = None) -> None:
    """Record the copies a plan lists from `stack` (K, M, n_expert) into `slots` (K, M, n) of
    the same type, whose slots are spaced slots.nb[2] bytes; at most `max_copies` are planned."""
    unit = stage_unit(stack)
    per_expert = stack.nb[1] * stack.ne[1]
    if not unit:
        raise UnsupportedShape(f"moe_stage_copy: {stack!r} has no contiguous, 4-byte aligned experts")
    if (slots.type != stack.type or slots.ne[:2] != stack.ne[:2] or slots.nb[:2] != stack.nb[:2]
            or slots.nb[2] < per_expert or slots.nb[2] % unit or slots.offset % unit):
        raise UnsupportedShape(f"moe_stage_copy: slots {slots!r} must hold {stack.type.name} ({stack.ne[0]}, "
                               f"{stack.ne[1]}) experts like {stack!r}, {unit}-byte aligned")
    dr, do = bind_tensor(slots, "moe_stage_copy slots", min_align=16)
    pr, po = bind_tensor(plan, "moe_stage_copy plan")
    units = per_expert // unit
    per_group = COPY_WG * COPY_UNROLL
    k = kernel(seq.device, "moe_stage_copy", push=COPY_PUSH, workgroup=(COPY_WG,),
               defines={"WG": COPY_WG, "UNROLL": COPY_UNROLL, **({"VEC4": 1} if unit == 16 else {})})
    for e0, e1 in chunks(2, seq.device, max_binding, stack):
        sr, so = bind_words(stack.slice(2, e0, e1), "moe_stage_copy stack", seq.device, max_binding)
        seq.dispatch(k, [sr, dr, pr], label="moe_stage_copy",
                     groups=grid(seq.device, ceil_div(units, per_group), max_copies),
                     push=dict(units=units, src_off=so // unit, src_expert=per_expert // unit, e0=e0, e1=e1,
                               dst_off=do // unit, dst_slot=slots.nb[2] // unit, plan_off=po // 4))
