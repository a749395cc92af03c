"""Expert staging for decode: for steps of at most tuning.mv_max_n tokens, the experts the
tokens chose in a host-resident MoE layer are copied into device slots first (one copy per
expert stack, all at once) and the mat-vecs read those. Which stacks are staged: by weight type
from the tuning table (moe_read_in_place lists the types read in place); VKRT_MOE_STAGE=1
stages every stack, 0 none."""

from __future__ import annotations

import logging
import os

from ..errors import ConfigError, OutOfDeviceMemory, VulkanError
from ..memory import Buffer, MemoryKind, Tensor
from ..model.transformer import EXPERT_TENSORS
from ..ops.moe_stage import stage_unit
from ..owned import Owned
from ..units import fmt_bytes

log = logging.getLogger("vkrt")

ALIGN = 256


def staging_requested() -> bool | None:
    """VKRT_MOE_STAGE: True (stage every host expert stack), False (none), None (by type)."""
    text = os.environ.get("VKRT_MOE_STAGE", "").strip()
    if not text:
        return None
    if text not in ("0", "1"):
        raise ConfigError(f"VKRT_MOE_STAGE={text!r}: use 1 to stage decode experts in VRAM, 0 to read them in place")
    return text == "1"


class ExpertStaging(Owned):
    """Device slots for the experts one decode step selects in host-resident MoE layers: per
    expert role (gate, up, down) one buffer of `n_slots` experts of the largest such layer.
    `enabled`: True stages every stack, False none, None by type (tuning.moe_read_in_place).
    `layers` lists the layers with at least one staged stack."""

    def __init__(self, model, max_tokens: int, enabled: bool | None = None):
        super().__init__("expert staging")
        dev, cfg, w = model.device, model.cfg, model.weights
        self.buffers: list[Buffer] = []
        self.layers: list[int] = []
        self._tensors: dict[int, tuple[Tensor | None, ...]] = {}
        if enabled is None:
            enabled = staging_requested()
        if not cfg.moe or enabled is False:
            return
        in_place = () if enabled else dev.tuning.moe_read_in_place
        host = set(model.placement.host_tensors)

        def staged(il: int, n: int) -> bool:
            t = w.get(f"blk.{il}.{n}")
            return f"blk.{il}.{n}" in host and t.type.name not in in_place and bool(stage_unit(t))

        plan = {il: [staged(il, n) for n in EXPERT_TENSORS] for il in range(cfg.n_layer)}
        plan = {il: roles for il, roles in plan.items() if any(roles)}
        if not plan:
            return
        self.n_slots = min(cfg.n_expert, cfg.n_expert_used * min(max_tokens, dev.tuning.mv_max_n))
        per_role = [max((_expert_bytes(w[f"blk.{il}.{n}"]) for il, roles in plan.items() if roles[r]), default=0)
                    for r, n in enumerate(EXPERT_TENSORS)]
        buffers: list[Buffer | None] = []
        try:
            for n, size in zip(EXPERT_TENSORS, per_role):
                buffers.append(Buffer(dev, self.n_slots * size, MemoryKind.DEVICE,
                                      label=f"staged {n.split('.')[0]} ({self.n_slots} experts)") if size else None)
        except (OutOfDeviceMemory, VulkanError) as exc:
            log.warning("expert staging: %s of slots could not be allocated (%s); decode reads host memory",
                        fmt_bytes(self.n_slots * sum(per_role)), exc)
            self.buffers = [b for b in buffers if b is not None]
            self._free()
            return
        self.buffers = [b for b in buffers if b is not None]
        self.layers = sorted(plan)
        for il, roles in plan.items():
            self._tensors[il] = tuple(
                Tensor.on(buf.range(), src.type, (src.ne[0], src.ne[1], self.n_slots), name=f"staged {src.name}")
                if on else None
                for buf, src, on in ((b, w[f"blk.{il}.{n}"], on) for b, n, on in zip(buffers, EXPERT_TENSORS, roles))
            )
        log.info("expert staging: %d host-resident MoE layers, %d slots (%s)", len(plan), self.n_slots,
                 fmt_bytes(self.nbytes))

    @property
    def nbytes(self) -> int:
        return sum(b.size for b in self.buffers)

    def tensors(self) -> dict[int, tuple[Tensor | None, ...]]:
        """layer -> (gate, up, down) slot tensors (K, M, n_slots); None for a stack read in place."""
        return dict(self._tensors)

    def _free(self) -> None:
        for b in self.buffers:
            b.close()
        self.buffers.clear()

    def _release(self) -> None:
        self._tensors.clear()
        self.layers = []
        self._free()


def _expert_bytes(t: Tensor) -> int:
    return -(-(t.nb[1] * t.ne[1]) // ALIGN) * ALIGN
