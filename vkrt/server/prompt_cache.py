"""Where a prompt resumes from: the idle slot holding the longest usable prefix of it, or the
prompt cache in host RAM (--cache-ram, as llama-server's).

When a slot is taken for a prompt that keeps less than half of the tokens it holds (another
session takes it), those tokens' KV cells and, for a model with a recurrent state, the states the
slot holds (its checkpoints and the live state) are copied to host memory, keyed by the tokens.
A prompt whose longest usable prefix lies there is read from that point on in the least recently
used idle slot, once the cells and the state at that point are copied back. A recurrent state
resumes only where one was saved, so a prefix is usable up to the longest saved state inside it.
Entries go least recently used first to stay within the limit; an entry whose tokens a newer
one extends is folded into it (its states are the newer one's too)."""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass, field

import numpy as np

from ..engine.kv_transfer import KVBlock, read_checkpoint, read_kv, read_state, write_kv, write_state
from ..units import fmt_bytes

log = logging.getLogger("vkrt.server")

KEEP_SHARE = 0.5    # a slot taken keeping less than this share of its tokens is saved first
MAX_STATES = 8      # recurrent states an entry keeps (the longest; tens of MB each on a 35B)
# a saved prefix is resumed only when it holds this many tokens more than the slot's own: a copy
# of a few tokens' KV costs a transfer and a wait, reading them again a sliver of a step
RESUME_MIN_GAIN = 32


@dataclass(eq=False)
class SavedPrefix:
    """A slot's tokens with their KV rows (positions [0, len(tokens))) and, for a recurrent
    model, its states by the tokens they absorbed (per stage holding DeltaNet layers)."""

    tokens: np.ndarray   # int32
    kv: KVBlock
    states: dict[int, list[np.ndarray]] = field(default_factory=dict)
    used: int = 0   # the cache's clock at its last use

    def __post_init__(self):
        self.tokens = np.asarray(self.tokens, np.int32).reshape(-1)

    @property
    def nbytes(self) -> int:
        return self.tokens.nbytes + self.kv.nbytes + sum(a.nbytes for s in self.states.values() for a in s)

    def usable(self, prompt: np.ndarray, recurrent: bool) -> int:
        """Tokens of `prompt` (int32) a resume from here holds (at least one prompt token is read,
        for its logits; a recurrent state resumes at a saved one)."""
        n = min(shared(self.tokens, prompt), prompt.size - 1)
        return max((k for k in self.states if k <= n), default=0) if recurrent else n


def shared(a: np.ndarray, b: np.ndarray) -> int:
    """The length of the common prefix of two token arrays."""
    m = min(a.size, b.size)
    differ = np.flatnonzero(a[:m] != b[:m])
    return int(differ[0]) if differ.size else m


def capture(engine, slot_id: int, tokens: list[int], checkpoints) -> SavedPrefix | None:
    """A host copy of what sequence `slot_id` holds of `tokens` (the slot's tokens; `checkpoints`
    its SlotCheckpoints); None when nothing of it can be resumed (a recurrent model without a
    state inside it)."""
    n = min(len(tokens), engine.sequence_length(slot_id))
    states = {}
    if engine.recurrent:
        for c in checkpoints.saved:
            if 0 < c.length <= n:
                states[c.length] = read_checkpoint(engine, c)
        if 0 < n == engine.state.length[slot_id]:
            states[n] = read_state(engine, slot_id)
        if not states:
            return None
        n = max(states)
    if n <= 0:
        return None
    return SavedPrefix(list(tokens[:n]), read_kv(engine, slot_id, n), states)


def restore(engine, slot_id: int, entry: SavedPrefix, n: int) -> None:
    """Make the empty sequence `slot_id` hold entry's first n tokens (for a recurrent model n
    must be one of its states)."""
    write_kv(engine, slot_id, entry.kv, n)
    if engine.recurrent:
        write_state(engine, slot_id, entry.states[n], n)


class PromptCache:
    """Saved prefixes in host memory, at most `limit` bytes (None: no limit; 0: off), and the
    choice of where each new prompt resumes (admit)."""

    def __init__(self, limit: int | None):
        self.limit = limit
        self.entries: list[SavedPrefix] = []
        self._clock = itertools.count(1)

    @property
    def enabled(self) -> bool:
        return self.limit != 0

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries)

    def find(self, prompt: list[int], recurrent: bool) -> tuple[SavedPrefix, int] | None:
        """The entry holding the longest usable prefix of `prompt`, and its length."""
        ids = np.asarray(prompt, np.int32)
        best = max(((e, e.usable(ids, recurrent)) for e in self.entries), key=lambda h: h[1], default=None)
        return best if best is not None and best[1] > 0 else None

    def add(self, entry: SavedPrefix) -> bool:
        """Keep `entry` (folding in older entries it extends), evicting the least recently used
        to make room; whether it was kept (not when it alone exceeds the limit)."""
        for old in list(self.entries):
            common = shared(old.tokens, entry.tokens)
            for k, s in old.states.items():
                if k <= common:
                    entry.states.setdefault(k, s)
            if common == old.tokens.size and all(k <= common for k in old.states):
                self.entries.remove(old)
        for k in sorted(entry.states)[:-MAX_STATES]:
            del entry.states[k]
        size = entry.nbytes
        if self.limit is not None and size > self.limit:
            log.info("prompt cache: %d tokens (%s) exceed --cache-ram %s: not kept", len(entry.tokens),
                     fmt_bytes(size), fmt_bytes(self.limit))
            return False
        if self.limit is not None:
            while self.entries and self.nbytes + size > self.limit:
                self.entries.remove(min(self.entries, key=lambda e: e.used))
        entry.used = next(self._clock)
        self.entries.append(entry)
        return True

    # -- the scheduler's side (its thread) ---------------------------------------------------------
    def save(self, engine, slot, checkpoints) -> None:
        """Copy what `slot` holds to host memory (when on and it holds any)."""
        if not self.enabled or not slot.cache:
            return
        t0 = time.perf_counter()
        try:
            entry = capture(engine, slot.id, slot.cache, checkpoints)
        except Exception as exc:   # the cache is an optimisation: a failed copy loses only the prefix
            log.warning("slot %d: saving %d tokens to the prompt cache failed: %s", slot.id, len(slot.cache), exc)
            return
        if entry is not None and self.add(entry):
            log.info("slot %d: %d tokens saved to the prompt cache in %.0f ms (%s; %d entries, %s)", slot.id,
                     len(entry.tokens), (time.perf_counter() - t0) * 1e3, fmt_bytes(entry.nbytes), len(self.entries),
                     fmt_bytes(self.nbytes))

    def admit(self, engine, job, idle: list, checkpoints: list) -> tuple[object, int]:
        """The idle slot for `job` and how many prompt tokens it holds, resumed: from the slot
        holding the longest usable prefix, or from this cache into the least recently used slot;
        a slot about to lose most of what it holds is saved here first. The slot's sequence holds
        exactly that many tokens' cells from position 0 (the caller forgets those past them)."""
        prompt = job.prompt

        def live(s) -> int:
            keep = s.reusable(prompt)
            return checkpoints[s.id].usable(keep, len(s.cache)) if engine.recurrent else keep
        if job.cache_prompt:
            slot = max(idle, key=lambda s: (live(s), -s.last_used))
            keep = live(slot)
            hit = self.find(prompt, engine.recurrent) if self.enabled else None
        else:
            slot, keep, hit = min(idle, key=lambda s: s.last_used), 0, None
        if hit is not None and hit[1] >= keep + RESUME_MIN_GAIN:
            slot = min(idle, key=lambda s: s.last_used)
            return slot, self._load(engine, slot, checkpoints[slot.id], *hit)
        if keep < KEEP_SHARE * len(slot.cache):
            self.save(engine, slot, checkpoints[slot.id])
        if engine.recurrent:   # a recurrent state resumes only where it was saved
            keep = checkpoints[slot.id].resume(engine, keep, len(slot.cache))
        return slot, keep

    def put_back(self, engine, slot, ckpts, entry: SavedPrefix, n: int) -> None:
        """Save what `slot` holds to the cache, empty it and restore entry's first n tokens into
        its sequence (slot.cache is the caller's to set; an error leaves the sequence to reset)."""
        self.save(engine, slot, ckpts)
        ckpts.drop(engine)
        engine.reset(slot.id)
        slot.cache = []
        restore(engine, slot.id, entry, n)

    def _load(self, engine, slot, ckpts, entry: SavedPrefix, n: int) -> int:
        """Give `slot` entry's first n tokens (saving what it held first); how many it holds."""
        t0 = time.perf_counter()
        try:
            self.put_back(engine, slot, ckpts, entry, n)
        except Exception as exc:
            log.warning("slot %d: resuming %d tokens from the prompt cache failed (reading the prompt whole): %s",
                        slot.id, n, exc)
            engine.reset(slot.id)
            return 0
        entry.used = next(self._clock)
        slot.cache = entry.tokens[:n].tolist()
        log.info("slot %d: resumed %d tokens from the prompt cache in %.0f ms", slot.id, n,
                 (time.perf_counter() - t0) * 1e3)
        return n
