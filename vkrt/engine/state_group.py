"""The recurrent state of a layer split: each stage's RecurrentState holds its own DeltaNet
layers; this drives them as one (one length per sequence, checkpoints taken and restored on
every stage together, so a checkpoint's index is the same in each stage's pool)."""

from __future__ import annotations

from ..errors import VkrtError
from ..units import fmt_bytes
from .recurrent_state import Checkpoint, RecurrentState


class StateGroup:
    """RecurrentState's interface over the `states` of several stages (not an owner: each stage
    closes its own)."""

    def __init__(self, states: list[RecurrentState]):
        self.states = states
        self.n_slots = states[0].n_slots
        self.length = states[0].length
        self.snapshot_length = states[0].snapshot_length
        for st in states[1:]:
            st.length = self.length   # one count of absorbed tokens for every stage
            st.snapshot_length = self.snapshot_length   # and of each snapshot's

    @property
    def layers(self) -> list[int]:
        return [il for st in self.states for il in st.layers]

    @property
    def nbytes(self) -> int:
        return sum(st.nbytes for st in self.states)

    def describe(self) -> str:
        return (f"{len(self.layers)} DeltaNet layers x {self.n_slots} sequences on {len(self.states)} devices, "
                f"{fmt_bytes(self.nbytes)}")

    def check_slot(self, slot: int) -> None:
        self.states[0].check_slot(slot)

    def clear(self, slots) -> None:
        slots = list(slots)
        for st in self.states:
            st.clear(slots)

    def save(self, slot: int) -> Checkpoint | None:
        saved = [st.save(slot) for st in self.states]
        if any(c is None for c in saved):
            for st, c in zip(self.states, saved):
                if c is not None:
                    st.release(c)
            return None
        if len({c.index for c in saved}) != 1:
            raise VkrtError(f"the stages' recurrent-state checkpoints went out of step ({[c.index for c in saved]})")
        return saved[0]

    def restore(self, slot: int, ckpt: Checkpoint) -> None:
        for st in self.states:
            st.restore(slot, ckpt)

    def release(self, ckpt: Checkpoint) -> None:
        for st in self.states:
            st.release(ckpt)

    def snapshot(self, slot: int) -> None:
        for st in self.states:
            st.snapshot(slot)

    def rewind(self, slot: int) -> int:
        return [st.rewind(slot) for st in self.states][0]

    def drop_kept(self) -> None:
        for st in self.states:
            st.drop_kept()

    def note_step(self, slots, n: int, n_tokens: int) -> None:
        for st in self.states:
            st.note_step(slots, n, n_tokens)

    def catch_up_span(self, slot: int, length: int) -> tuple[int, int] | None:
        spans = {st.catch_up_span(slot, length) for st in self.states}
        return spans.pop() if len(spans) == 1 else None
