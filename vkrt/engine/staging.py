"""Expert staging and caching for decode (docs/ARCHITECTURE.md §4 and §5, the data path of a
decode step): for steps of at most tuning.mv_max_n tokens, the
experts the tokens chose in a host-resident MoE layer are copied into device slots first (one
copy per expert stack, all at once) and the mat-vecs read those.

With an expert cache (`cache_bytes`), each such layer owns `cache_slots` slots per stack kept
on the GPU with least-recently-used replacement (shaders/moe_stage_plan.comp): a chosen expert
already there is not copied again. Without one, which stacks are staged is decided by weight
type (tuning.moe_read_in_place lists the types the mat-vecs read in place); settings.moe_stage
(VKRT_MOE_STAGE) True stages every stack, False none (and no cache).
"""

from __future__ import annotations

import logging

import numpy as np

from ..commands import CommandSequence, read_tensor, write_tensor
from ..errors import OutOfDeviceMemory, VulkanError
from ..memory import I32, Buffer, MemoryKind, Tensor
from ..model.transformer import EXPERT_TENSORS, StagedExperts
from ..ops.binding import binding_limit
from ..ops.moe_stage import cache_counts, cache_state_words, initial_cache_state, stage_unit
from ..owned import Owned
from ..units import fmt_bytes
from .prefetch import host_moe_layers

log = logging.getLogger("vkrt")

ALIGN = 256


def staged_layers(model, layers=None) -> list[int]:
    """MoE layers (of `layers`) whose three expert stacks are all host-resident and can be staged."""
    w = model.weights
    return [il for il in host_moe_layers(model, layers) if all(stage_unit(w[f"blk.{il}.{n}"]) for n in EXPERT_TENSORS)]


def expert_bytes(model) -> int:
    """Bytes one cached expert takes (gate + up + down of the largest host-resident layer)."""
    return sum(_strides(model, staged_layers(model)))


class ExpertStaging(Owned):
    """Device slots for the experts decode steps choose in host-resident MoE layers: per stack
    (gate, up, down) one buffer holding each layer's `cache_slots` cache slots, then `n_stage`
    staging slots shared by all layers (then, with `zero_slot`, one zeroed slot the pairs the
    CPU computes read: every stack staged); plus the per-layer cache state. `layers` lists the
    layers with at least one staged stack (empty: decode reads host memory in place). `device`
    and `layers`: a stage of a layer split (default: the model's device, every layer)."""

    def __init__(self, model, max_tokens: int, enabled: bool | None = None, cache_bytes: int = 0, device=None,
                 layers=None, zero_slot: bool = False):
        super().__init__("expert staging")
        dev, cfg, w = device or model.device, model.cfg, model.weights
        self._by_role: list[Buffer | None] = []   # gate, up, down (None: that stack is read in place)
        self.layers: list[int] = []
        self.cache_slots = self.n_stage = 0
        self.state: Tensor | None = None
        self._views: dict[int, StagedExperts] = {}
        self.view_base: dict[int, int] = {}   # layer -> the slot of the whole buffer its view starts at
        self.zero_slot: int | None = None
        if enabled is None:
            enabled = dev.settings.moe_stage
        candidates = staged_layers(model, layers)
        if not cfg.moe or enabled is False or not candidates:
            return
        n_slots = min(cfg.n_expert, cfg.n_expert_used * min(max_tokens, dev.tuning.mv_max_n))
        strides = _strides(model, candidates)
        L = len(candidates)
        limit = binding_limit(dev) - ALIGN
        cache = min(cfg.n_expert, cache_bytes // (L * sum(strides)),
                    min((limit // s - n_slots) // L for s in strides))
        if cache > 0 or zero_slot:
            cache = max(cache, 0)
            roles = [(True, True, True)] * L
        else:
            cache = 0
            in_place = () if enabled else dev.tuning.moe_read_in_place
            roles = [tuple(w[f"blk.{il}.{n}"].type.name not in in_place for n in EXPERT_TENSORS) for il in candidates]
        plan = {il: r for il, r in zip(candidates, roles) if any(r)}
        if not plan:
            return
        extra = 1 if zero_slot else 0
        for attempt in (cache, 0) if cache else (0,):
            n_stage = (0 if attempt >= n_slots and not zero_slot else n_slots) + extra
            sizes = [(L * attempt + n_stage) * s if any(r[i] for r in plan.values()) else 0
                     for i, s in enumerate(strides)]
            try:
                self._allocate(dev, sizes, attempt, n_stage)
                break
            except (OutOfDeviceMemory, VulkanError) as exc:
                self._free()
                log.warning("expert staging: %s of slots could not be allocated (%s)%s", fmt_bytes(sum(sizes)), exc,
                            "; trying without the expert cache" if attempt else "; decode reads host memory")
        else:
            return
        self.cache_slots, self.n_stage = attempt, n_stage - extra
        self.zero_slot = L * attempt + n_stage - 1 if zero_slot else None   # in the whole buffer
        if zero_slot:
            self._zero(dev, strides)
        words = cache_state_words(cfg.n_expert, attempt)
        if attempt:
            self.state = Tensor.empty(dev, I32, (words, L), name="expert cache")   # a row per layer
            write_tensor(self.state, np.tile(initial_cache_state(cfg.n_expert, attempt), L))
        for j, il in enumerate(candidates):
            if il not in plan:
                continue
            stacks = []
            for buf, n, s, on in zip(self._by_role, EXPERT_TENSORS, strides, plan[il]):
                src = w[f"blk.{il}.{n}"]
                if not on:
                    stacks.append(None)
                    continue
                n_view = (L - j) * attempt + n_stage
                t = Tensor.on(buf.range(j * attempt * s, n_view * s), src.type, (src.ne[0], src.ne[1], 1))
                stacks.append(t.view((src.ne[0], src.ne[1], n_view), (t.nb[0], t.nb[1], s), name=f"staged {src.name}"))
            state = self.state.slice(1, j, j + 1) if attempt else None
            self._views[il] = StagedExperts(tuple(stacks), n_slots, attempt, (L - j) * attempt, state)
            self.view_base[il] = j * attempt
        self.layers = sorted(plan)
        what = f"{attempt} cached experts per layer + " if attempt else ""
        log.info("expert staging: %d host-resident MoE layers, %s%d staging slots (%s)", len(plan), what, n_stage,
                 fmt_bytes(self.nbytes))

    def _zero(self, dev, strides) -> None:
        """Fill the zero slot of every stack with zeros (a block of zero bytes is 0 in every type)."""
        seq = CommandSequence(dev, label="zero expert slot")
        try:
            with seq.record():
                for buf, stride in zip(self._by_role, strides):
                    seq.fill(buf.range(self.zero_slot * stride, stride), 0)
            seq.run()
        finally:
            seq.close()

    def _allocate(self, dev, sizes, cache, n_stage) -> None:
        for n, size in zip(EXPERT_TENSORS, sizes):
            self._by_role.append(Buffer(dev, size, MemoryKind.DEVICE, label=f"staged {n.split('.')[0]} ({cache} "
                                        f"cached per layer, {n_stage} staging)") if size else None)

    @property
    def nbytes(self) -> int:
        return sum(b.size for b in self._by_role if b is not None)

    def hit_counts(self) -> tuple[int, int] | None:
        """(hits, misses) of the experts decode steps chose (None: no cache)."""
        if self.state is None:
            return None
        hits, misses = np.sum([cache_counts(layer) for layer in read_tensor(self.state)], axis=0)
        return int(hits), int(misses)

    def hit_rate(self) -> float | None:
        """Share of the experts decode steps chose that were already cached (None: no cache)."""
        counts = self.hit_counts()
        if counts is None:
            return None
        hits, misses = counts
        return float(hits / (hits + misses)) if hits + misses else 0.0

    def tensors(self) -> dict[int, StagedExperts]:
        """layer -> where its decode steps stage (and cache) experts."""
        return dict(self._views)

    def _free(self) -> None:
        for b in self._by_role:
            if b is not None:
                b.close()
        self._by_role.clear()

    def _release(self) -> None:
        self._views.clear()
        self.layers = []
        if self.state is not None:
            self.state.close()
        self._free()


def _strides(model, layers) -> list[int]:
    """Per stack, the bytes of one expert slot: the largest expert of `layers`, aligned."""
    w = model.weights
    return [max((-(-(w[f"blk.{il}.{n}"].nb[1] * w[f"blk.{il}.{n}"].ne[1]) // ALIGN) * ALIGN for il in layers),
                default=0) for n in EXPERT_TENSORS]
