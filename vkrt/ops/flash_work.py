"""The memory flash attention records over besides its operands (FlashAttn, flash_attn.py):
the mask_opt pre-pass's block classes of a mask, and split-K's partial O, (M, L) pairs and
per-tile counts of the splits done. The split-K GEMM (matmul.py) keeps its partial tiles in one
too, a device service."""

from __future__ import annotations

import numpy as np

from ..commands import upload
from ..memory import BufferRange, allocate
from ..owned import Owned


class FlashWork(Owned):
    """Buffers by key, each grown (never shrunk) to the most bytes a recording asked for: flash
    attention's mask_opt blocks and split-K partials, a GEMM's split-K partial tiles.

    An engine stage's Scratch owns one, shared by every layer and every recorded step of that
    stage: its steps run one at a time and, within a step, the sequence's barriers order the
    layers. A buffer outgrown stays until close(), as graphs recorded before still read it.
    Buffers asked for `zeroed` (the done counts) are zero when allocated; the kernel leaves them
    zero (the last split of a tile resets its count)."""

    def __init__(self, device, label: str = "flash attention work"):
        super().__init__(label)
        self.device = device
        self._current: dict = {}
        self._outgrown: list = []

    def range(self, key, nbytes: int, *, zeroed: bool = False) -> BufferRange:
        """The first `nbytes` of the buffer under `key` (any hashable)."""
        a = self._current.get(key)
        if a is None or a.size < nbytes:
            name = key if isinstance(key, str) else key[0]
            new = allocate(self.device, nbytes, label=f"{self.label}: {name}")
            try:
                if zeroed:
                    upload(self.device, new.range(), np.zeros(nbytes // 4, np.uint32))
            except BaseException:
                new.close()
                raise
            if a is not None:
                self._outgrown.append(a)
            self._current[key] = a = new
        return a.range(0, nbytes)

    def _release(self) -> None:
        for a in (*self._current.values(), *self._outgrown):
            a.close()
        self._current.clear()
        self._outgrown.clear()
