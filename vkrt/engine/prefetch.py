"""Expert prefetch (docs/ARCHITECTURE.md §4 and §6, the data path of a prompt ubatch): for
large ubatches nearly every expert of a MoE layer is used, so the whole
expert tensors (gate, up, down) of layers kept in host memory are uploaded on the transfer queue
into a ring of device slots ahead of use. Per slot, a "ready" value of the transfer timeline
(transfer -> compute) and a "free" value of the compute timeline (compute -> transfer) order the
uploads and the layers reading them, so uploading layer i+1.. overlaps computing layer i."""

from __future__ import annotations

import logging

from ..commands import CommandSequence
from ..errors import ConfigError, OutOfDeviceMemory, VulkanError
from ..memory import Buffer, MemoryKind, Tensor
from ..model.transformer import EXPERT_TENSORS
from ..owned import Owned
from ..units import fmt_bytes

log = logging.getLogger("vkrt")

MAX_SLOTS, MIN_SLOTS = 8, 2
ALIGN = 256


def slots_requested(value: int | None, settings) -> int:
    """`value` prefetch slots, else settings.prefetch_slots (VKRT_PREFETCH_SLOTS: default 3; 0
    turns prefetch off; at most 8)."""
    if value is None:
        value = settings.prefetch_slots
    if not 0 <= value <= MAX_SLOTS:
        raise ConfigError(f"prefetch slots must be 0..{MAX_SLOTS}, got {value}")
    return value


def host_moe_layers(model, layers=None) -> list[int]:
    """MoE layers (of `layers`; None: all) whose three expert tensors are all host-resident."""
    host = set(model.placement.host_tensors)
    return [il for il in (range(model.cfg.n_layer) if layers is None else layers) if model.cfg.moe
            and all(f"blk.{il}.{n}" in host for n in EXPERT_TENSORS)]


def slot_bytes(model, layers=None) -> int:
    """Bytes of one prefetch slot: the largest host-resident layer's three expert tensors."""
    w = model.weights
    return max((sum(_aligned(w[f"blk.{il}.{n}"].nbytes) for n in EXPERT_TENSORS)
                for il in host_moe_layers(model, layers)), default=0)


class ExpertPrefetch(Owned):
    """Slots and recorded upload sequences for the host-resident expert layers of a model (of
    `layers` on `device`: a stage of a layer split; default all, on the model's device).
    `n_slots` is 0 when prefetch is off or no slots could be allocated."""

    def __init__(self, model, n_slots: int | None = None, device=None, layers=None):
        super().__init__("expert prefetch")
        self.device = dev = device or model.device
        self.layers = host_moe_layers(model, layers)
        self._slots: list[Buffer] = []
        self._uploads: dict[int, CommandSequence] = {}
        self._experts: dict[int, tuple[Tensor, Tensor, Tensor]] = {}
        want = slots_requested(n_slots, dev.settings) if self.layers else 0
        self.slot_bytes = slot_bytes(model, layers)
        for i in range(want):
            try:
                self._slots.append(Buffer(dev, self.slot_bytes, MemoryKind.DEVICE, label=f"expert prefetch slot {i}"))
            except (OutOfDeviceMemory, VulkanError) as exc:
                log.warning("expert prefetch: slot %d of %d (%s) could not be allocated: %s", i + 1, want,
                            fmt_bytes(self.slot_bytes), exc)
                break
        if 0 < len(self._slots) < MIN_SLOTS:
            log.warning("expert prefetch needs at least %d slots; running without it", MIN_SLOTS)
            self._free_slots()
        self.n_slots = len(self._slots)
        self._slot_of = {il: k % self.n_slots for k, il in enumerate(self.layers)} if self.n_slots else {}
        try:
            for il, slot in self._slot_of.items():
                self._prepare(model, il, self._slots[slot])
        except BaseException:
            self.close()
            raise
        if self.layers:
            log.info("expert prefetch: %d host-resident MoE layers, %d slots of %s", len(self.layers), self.n_slots,
                     fmt_bytes(self.slot_bytes))

    def _prepare(self, model, il: int, slot: Buffer) -> None:
        seq = CommandSequence(self.device, queue="transfer", label=f"prefetch experts of layer {il}")
        tensors = []
        off = 0
        with seq.record():
            for name in EXPERT_TENSORS:
                src = model.weights[f"blk.{il}.{name}"]
                dst = Tensor.on(slot.range(off, src.nbytes), src.type, src.ne[:3], name=f"slot {src.name}")
                seq.copy(src.range(), dst.range(), src.nbytes, label=f"upload {src.name}")
                tensors.append(dst)
                off += _aligned(src.nbytes)
        self._uploads[il] = seq
        self._experts[il] = tuple(tensors)

    @property
    def active(self) -> bool:
        return self.n_slots >= MIN_SLOTS

    def slot_of(self, il: int) -> int:
        return self._slot_of[il]

    def experts(self) -> dict[int, tuple[Tensor, Tensor, Tensor]]:
        """layer -> (gate, up, down) tensors in the layer's slot."""
        return dict(self._experts)

    def upload(self, il: int, waits) -> int:
        """Submit the upload of layer il after `waits`; returns the transfer timeline value."""
        return self._uploads[il].submit(waits, auto_wait=False)

    def _free_slots(self) -> None:
        for b in self._slots:
            b.close()
        self._slots.clear()

    def _release(self) -> None:
        for seq in self._uploads.values():
            seq.close()
        self._uploads.clear()
        self._free_slots()


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN
