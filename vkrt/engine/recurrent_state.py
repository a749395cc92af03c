"""The recurrent-state cache of Gated DeltaNet layers, next to the KV cache: per layer and
sequence slot, the conv window (the last ssm.conv_kernel - 1 inputs) and the delta-rule
matrices (fp32). Slots are cleared for a new sequence and can be saved to / restored from
checkpoints in host memory (a recurrent state cannot be rewound, so prompt-prefix reuse resumes
from the longest checkpoint inside the shared prefix)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..commands import CommandSequence, run_once, write_tensor
from ..errors import VkrtError
from ..memory import F32, I32, Buffer, MemoryKind, Tensor
from ..model.config import ModelConfig
from ..ops.gdn_catch_up import catch_up_windows
from ..owned import Owned
from ..units import fmt_bytes


# tokens a step's DeltaNet inputs are kept for (its ssm_conv input and output, alpha and beta,
# and the gate z written beside the input, layer by layer): a speculative step of at most this
# many can be taken back to any of its tokens by running the delta rule again over the kept
# columns (catch_up), not the model. An engine told its speculative steps' size (verify_tokens:
# a server's slots x (drafts + 1)) keeps that many, up to KEEP_MAX (about 2.5 MB a column on
# Qwen3.5-35B-A3B's 30 DeltaNet layers)
KEEP_COLUMNS = 16
KEEP_MAX = 64


def kept_floats(cfg: ModelConfig) -> int:
    """Floats a DeltaNet layer keeps of a step's column: the attn_qkv and attn_gate projections
    (one region, as one matmul writes them), ssm_conv's output, alpha and beta (one region)."""
    return 2 * cfg.ssm_conv_dim + cfg.ssm_v_heads * cfg.ssm_head_dim + 2 * cfg.ssm_v_heads


def keep_columns(n_ubatch: int, verify_tokens: int = 0) -> int:
    """The columns a state keeps for an engine of micro-batch n_ubatch whose speculative steps
    take up to verify_tokens tokens (0: not said): at least KEEP_COLUMNS, at most KEEP_MAX."""
    return min(n_ubatch, max(KEEP_COLUMNS, min(verify_tokens, KEEP_MAX)))


@dataclass
class Checkpoint:
    """A saved state: `index` in the host pool, `length` = tokens the state had absorbed."""

    index: int
    length: int


class RecurrentState(Owned):
    """Conv and delta-rule state of every DeltaNet layer (of `layers`) for `n_slots` sequences,
    plus a pool of `n_checkpoints` checkpoints in host memory. Layer il's views: conv[il] F32 (C, K-1, n_slots),
    ssm[il] F32 (D, D, Hv, n_slots) (element (j, i, h, slot) = S_h[i][j] of the slot)."""

    def __init__(self, device, cfg: ModelConfig, n_slots: int, n_checkpoints: int = 0, layers=None,
                 keep_columns: int = KEEP_COLUMNS):
        super().__init__(f"recurrent state {n_slots} sequences")
        self.device = device
        self.n_slots = n_slots
        C, K, D, Hv = cfg.ssm_conv_dim, cfg.ssm_conv_kernel, cfg.ssm_head_dim, cfg.ssm_v_heads
        self._conv_bytes, self._ssm_bytes = 4 * C * (K - 1), 4 * D * D * Hv
        self._c, self._hv, self._d, self._taps = C, Hv, D, K - 1
        self._kept_floats = kept_floats(cfg)
        self.keep_columns = keep_columns
        self._kept: dict[int, tuple[int, int, int]] = {}   # slot -> (first position, tokens, first column)
        # `layers`: the DeltaNet layers to hold (a stage of a layer split; None: all)
        self.layers = [il for il in cfg.linear_layers if layers is None or il in layers]
        self.slot_bytes = len(self.layers) * (self._conv_bytes + self._ssm_bytes)
        self._layer_bytes = n_slots * (self._conv_bytes + self._ssm_bytes)   # a layer's region, all slots
        self.length = np.zeros(n_slots, np.int64)   # tokens each slot's state has absorbed
        self.conv: dict[int, Tensor] = {}
        self.ssm: dict[int, Tensor] = {}
        self._store = self._pool = self._snapshots = self._keep = self._spans = None
        self._catch_up_seqs: dict[int, CommandSequence] = {}   # a slot's, for any span (catch_up)
        self._snapshot_seqs: dict[tuple[int, bool], CommandSequence] = {}   # (slot, to snapshot): recorded once
        self._free: list[int] = list(range(n_checkpoints))
        self.snapshot_length = np.full(n_slots, -1, np.int64)   # tokens each slot's snapshot holds (-1: none)
        try:
            self._store = Tensor.empty(device, F32, (max(1, self.slot_bytes * n_slots // 4),), name="recurrent state")
            for n, il in enumerate(self.layers):
                base = n * self._layer_bytes
                self.conv[il] = self._store.view((C, K - 1, n_slots), offset=base, name=f"conv_state.{il}")
                self.ssm[il] = self._store.view((D, D, Hv, n_slots), offset=base + n_slots * self._conv_bytes,
                                                name=f"ssm_state.{il}")
            if keep_columns:
                self._keep = Tensor.empty(device, F32, (max(1, len(self.layers) * keep_columns * self._kept_floats),),
                                          name="DeltaNet step inputs")
                # a slot's catch-up span (slot, first kept column, tokens), written before each run
                self._spans = Tensor.empty(device, I32, (3 * n_slots,), name="DeltaNet catch-up spans",
                                           kind=MemoryKind.HOST)
                write_tensor(self._spans, np.stack([np.arange(n_slots), np.zeros(n_slots), np.ones(n_slots)], 1))
            if n_checkpoints:
                self._pool = Buffer(device, self.slot_bytes * n_checkpoints, MemoryKind.HOST,
                                    label=f"{n_checkpoints} recurrent-state checkpoints")
            self.clear(range(n_slots))
        except BaseException:
            self.close()
            raise

    @property
    def nbytes(self) -> int:
        return self.slot_bytes * self.n_slots + (self._keep.nbytes if self._keep is not None else 0)

    def kept_views(self, il: int, n: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor] | None:
        """Where layer il's DeltaNet writes a step's n columns of its ssm_conv input, the gate z,
        ssm_conv's output, alpha and beta (each [rows, n]; ssm_conv's input rows followed by z's,
        alpha's by beta's) so that a later catch_up can read them; None where a step of n tokens
        keeps none (the scratch's are used)."""
        if not self._keeps(n) or il not in self.conv:
            return None
        return self._layer_views(il, n)

    def _keeps(self, n_tokens: int) -> bool:
        """Whether a step of n_tokens keeps its inputs: at most keep_columns, and below the chunked
        form's (whose bits are not the rule's a token at a time)."""
        return self._keep is not None and n_tokens <= self.keep_columns and \
            n_tokens < self.device.tuning.gdn_chunk_min_tokens

    def _layer_views(self, il: int, n: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """(ssm_conv's input, z, ssm_conv's output, alpha, beta) of the first n kept columns."""
        C, Z, Hv, kc = self._c, self._hv * self._d, self._hv, self.keep_columns
        base = self.layers.index(il) * kc * self._kept_floats * 4
        qkvz = self._keep.view((C + Z, n), offset=base)
        conv = self._keep.view((C, n), offset=base + 4 * kc * (C + Z))
        ab = self._keep.view((2 * Hv, n), offset=base + 4 * kc * (2 * C + Z))
        return qkvz.slice(0, 0, C), qkvz.slice(0, C, C + Z), conv, ab.slice(0, 0, Hv), ab.slice(0, Hv, 2 * Hv)

    def drop_kept(self) -> None:
        """A step is being recorded or run: whatever it writes, no earlier step's inputs are kept."""
        self._kept = {}

    def note_step(self, slots, n: int, n_tokens: int) -> None:
        """A step of n tokens each of `slots` (n_tokens in all, the sequences' columns in turn) is
        about to advance their states: it overwrote the kept inputs (kept_views) with its own."""
        if not self._keeps(n_tokens):
            self._kept = {}
            return
        self._kept = {int(s): (int(self.length[s]), n, g * n) for g, s in enumerate(slots)}

    def catch_up_span(self, slot: int, length: int) -> tuple[int, int] | None:
        """(first kept column, tokens) that take `slot`'s snapshot to `length` tokens, where the
        last step started at the snapshot and kept its inputs (None: it cannot)."""
        kept, snap = self._kept.get(slot), int(self.snapshot_length[slot])
        if kept is None or snap < 0 or kept[0] != snap or not snap < length <= snap + kept[1]:
            return None
        return kept[2], length - snap

    def catch_up(self, slot: int, length: int, record_rule) -> None:
        """Bring `slot` from its snapshot to `length` tokens over the last step's kept inputs
        (catch_up_span must allow it): each layer's conv window from the snapshot's taps and the
        kept ssm_conv inputs, then the delta rule again over the kept columns from the snapshot's
        state into the slot's, record_rule(seq, il, conv, alpha, beta, state, slots, out,
        span=True, state_in=snapshot) recording it for layer il (the model's weights; out: a dead
        region to write, the slot's kept inputs, so it catches up once a step). The state then
        holds the bits a step of exactly those tokens would have left, with no rewinding copy.
        Recorded once a slot, its span (first column, tokens) read on the device from a buffer
        written before each run; queued, not waited for."""
        col, count = self.catch_up_span(slot, length)
        seq = self._catch_up_seqs.get(slot)
        if seq is None:
            seq = self._catch_up_seqs[slot] = CommandSequence(self.device, label=f"DeltaNet catch-up {slot}")
            with seq.record():
                self._record_catch_up(seq, slot, record_rule)
                seq.barrier()
        else:
            seq.wait()   # its last run has read the span it was given
        self._spans.range().write(np.array([slot, col, count], np.int32), 12 * slot)
        seq.submit()
        self.length[slot] = length
        del self._kept[slot]   # its kept inputs are overwritten now

    def _record_catch_up(self, seq, slot: int, record_rule) -> None:
        C, taps, kc, n_layers, D = self._c, self._taps, self.keep_columns, len(self.layers), self._d
        span = self._spans.view((3,), offset=12 * slot)
        # every layer's conv window from the snapshot's taps and the kept ssm_conv inputs (a layer's
        # conv, then its ssm: the store has a region a layer, a snapshot a slot's layers in turn)
        windows = self._store.view((C, taps, n_layers), nb=(4, 4 * C, self._layer_bytes), offset=slot * self._conv_bytes)
        snapped = self._snapshots.view((C, taps, n_layers), nb=(4, 4 * C, self._conv_bytes + self._ssm_bytes),
                                       offset=slot * self.slot_bytes)
        kept_in = self._keep.view((C, kc, n_layers), nb=(4, 4 * (C + self._hv * self._d), 4 * kc * self._kept_floats))
        catch_up_windows(seq, windows, snapped, kept_in, span)
        for n, il in enumerate(self.layers):   # (their outputs, dead, where the windows read: a barrier between)
            qkv_in, _, conv, alpha, beta = self._layer_views(il, kc)
            ssm = self.ssm[il]
            snapped_ssm = self._snapshots.view((D, D, self._hv), nb=ssm.nb[:3], offset=slot * self.slot_bytes
                                               + n * (self._conv_bytes + self._ssm_bytes) + self._conv_bytes)
            # the dead output over the slot's own kept inputs (read by the windows above; no other
            # slot's catch-up reads those columns)
            record_rule(seq, il, conv, alpha, beta, ssm, span, qkv_in.slice(0, 0, self._hv * D), span=True,
                        state_in=snapped_ssm)

    def describe(self) -> str:
        return f"{len(self.layers)} DeltaNet layers x {self.n_slots} sequences, {fmt_bytes(self.nbytes)}"

    def _regions(self, slot: int):
        """(byte offset in the store, bytes) of a slot's pieces, layer by layer."""
        for n in range(len(self.layers)):
            base = n * self._layer_bytes
            yield base + slot * self._conv_bytes, self._conv_bytes
            yield base + self.n_slots * self._conv_bytes + slot * self._ssm_bytes, self._ssm_bytes

    def check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.n_slots:
            raise VkrtError(f"sequence {slot} has no recurrent state: this engine holds {self.n_slots} "
                            f"sequence(s) (raise the parallel sequence count, e.g. -np)")

    def clear(self, slots) -> None:
        """Zero the state of `slots` (a new sequence starts from zeros)."""
        slots = list(slots)
        for s in slots:
            self.check_slot(s)
        store = self._store.range()

        def record(seq):
            for s in slots:
                for off, size in self._regions(s):
                    seq.fill(store.sub(off, size), 0)
        if slots:
            run_once(self.device, record, "clear recurrent state")
        self.length[slots] = 0
        self.snapshot_length[slots] = -1

    def save(self, slot: int) -> Checkpoint | None:
        """Copy `slot`'s state into a free checkpoint (None when the pool is exhausted)."""
        self.check_slot(slot)
        if not self._free:
            return None
        index = self._free.pop(0)
        self._copy(slot, index, to_pool=True)
        return Checkpoint(index, int(self.length[slot]))

    def restore(self, slot: int, ckpt: Checkpoint) -> None:
        """Put a checkpoint's state into `slot` (the checkpoint stays valid)."""
        self.check_slot(slot)
        self._copy(slot, ckpt.index, to_pool=False)
        self.length[slot] = ckpt.length
        self.snapshot_length[slot] = -1

    def release(self, ckpt: Checkpoint) -> None:
        if ckpt.index not in self._free:
            self._free.append(ckpt.index)

    def read(self, slot: int) -> np.ndarray:
        """A host copy of `slot`'s state (uint8, laid out as a checkpoint's)."""
        self.check_slot(slot)
        with Buffer(self.device, max(4, self.slot_bytes), MemoryKind.READBACK, label="recurrent state read") as buf:
            run_once(self.device, lambda seq: self._record_copy(seq, slot, 0, True, buf.range()), "read recurrent state")
            return buf.read(np.uint8, self.slot_bytes)

    def read_checkpoint(self, ckpt: Checkpoint) -> np.ndarray:
        """A host copy of a checkpoint's state (as read() lays it out)."""
        return self._pool.read(np.uint8, self.slot_bytes, ckpt.index * self.slot_bytes)

    def write(self, slot: int, data: np.ndarray, length: int) -> None:
        """Put a state read() gave into `slot`, as having absorbed `length` tokens."""
        self.check_slot(slot)
        data = np.ascontiguousarray(data, np.uint8).reshape(-1)
        if data.size != self.slot_bytes:
            raise VkrtError(f"a recurrent state of {data.size} bytes does not fit this model's "
                            f"{self.slot_bytes} a sequence")
        with Buffer(self.device, max(4, self.slot_bytes), MemoryKind.HOST, label="recurrent state write") as buf:
            buf.write(data)
            run_once(self.device, lambda seq: self._record_copy(seq, slot, 0, False, buf.range()), "write recurrent state")
        self.length[slot] = length
        self.snapshot_length[slot] = -1

    def snapshot(self, slot: int) -> None:
        """Copy `slot`'s state to its snapshot in VRAM (one a slot, made on first use): where a
        speculative step that may be partly rejected rewinds to."""
        self.check_slot(slot)
        if self._snapshots is None:
            self._snapshots = Tensor.empty(self.device, F32, (max(1, self.slot_bytes * self.n_slots // 4),),
                                           name="recurrent-state snapshots")
        self._snapshot_copy(slot, to_snapshot=True)
        self.snapshot_length[slot] = self.length[slot]

    def rewind(self, slot: int) -> int:
        """Put `slot`'s snapshot back; returns the tokens it holds."""
        self.check_slot(slot)
        if self.snapshot_length[slot] < 0:
            raise VkrtError(f"sequence {slot} has no recurrent-state snapshot to rewind to")
        self._snapshot_copy(slot, to_snapshot=False)
        self.length[slot] = self.snapshot_length[slot]
        return int(self.length[slot])

    def _snapshot_copy(self, slot: int, to_snapshot: bool) -> None:
        """Copy a slot's state to or from its snapshot: a sequence recorded once a slot and
        direction, replayed (speculative decoding takes one or two a step). It is queued, not
        waited for: its closing barrier orders it before whatever the compute queue runs next
        (the verify step that writes the state), so the host does not wait a round trip."""
        key = (slot, to_snapshot)
        seq = self._snapshot_seqs.get(key)
        if seq is None:
            seq = self._snapshot_seqs[key] = CommandSequence(
                self.device, label=f"{'snapshot' if to_snapshot else 'rewind'} recurrent state {slot}")
            with seq.record():
                self._record_copy(seq, slot, slot, to_snapshot, self._snapshots.range())
                seq.barrier()
        seq.submit()

    def _record_copy(self, seq, slot: int, index: int, to_pool: bool, pool) -> None:
        """Copy a slot's state to or from place `index` of `pool` (a BufferRange of states)."""
        store = self._store.range()
        at = index * self.slot_bytes
        for off, size in self._regions(slot):
            live, saved = store.sub(off, size), pool.sub(at, size)
            seq.copy(live, saved) if to_pool else seq.copy(saved, live)
            at += size

    def _copy(self, slot: int, index: int, to_pool: bool) -> None:
        run_once(self.device, lambda seq: self._record_copy(seq, slot, index, to_pool, self._pool.range()),
                 "save recurrent state" if to_pool else "restore recurrent state")

    def _release(self) -> None:
        for seq in (*self._snapshot_seqs.values(), *self._catch_up_seqs.values()):
            seq.close()
        self._snapshot_seqs.clear()
        self._catch_up_seqs.clear()
        for t in (self._keep, self._spans):
            if t is not None:
                t.close()
        if self._snapshots is not None:
            self._snapshots.close()
        if self._pool is not None:
            self._pool.close()
        if self._store is not None:
            self._store.close()
