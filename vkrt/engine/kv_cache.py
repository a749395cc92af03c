"""The KV cache: per layer K and V [head_dim, n_ctx, n_head_kv] tensors allocated once, and the
table of which sequence and position each cell holds (cells are shared by all sequences)."""

from __future__ import annotations

import numpy as np

from ..commands import run_once
from ..errors import ConfigError, VkrtError
from ..memory import F16, Tensor
from ..ops.hadamard import k_rotation, v_rotation
from ..ops.kv_quant import KV_QUANT, kv_type
from ..owned import Owned


class ContextFull(VkrtError):
    """No free KV cells are left for the tokens being added."""


class CellTable:
    """cell -> (sequence id, position); -1 marks a free cell. Sequences take the lowest free cells.
    A position is the token's index in its sequence (what masks and truncation count). Each cell
    also holds the token's rotary positions `rope` (t, y, x: Qwen's M-RoPE streams; the index for
    text, an image's 2-D grid for its rows) and `after`, the rotary position of a text token that
    follows it (index + 1 for text; past an image, the image's start + max(grid h, w)).
    `moved`: some cell's rotary position may differ from its index."""

    def __init__(self, n_cells: int):
        self.n_cells = n_cells
        self.seq = np.full(n_cells, -1, np.int32)
        self.pos = np.zeros(n_cells, np.int32)
        self.rope = np.zeros((n_cells, 3), np.int32)
        self.after = np.ones(n_cells, np.int32)
        self.moved = False

    def used_end(self) -> int:
        """One past the highest used cell (what attention must cover)."""
        used = np.flatnonzero(self.seq >= 0)
        return int(used[-1]) + 1 if used.size else 0

    def allocate(self, seq: int, positions: np.ndarray, rope: np.ndarray | None = None,
                 after: np.ndarray | None = None) -> np.ndarray:
        """Cells for `seq`'s tokens at `positions`; rope [n, 3] and after [n]: their rotary
        positions (default: text at its index)."""
        free = np.flatnonzero(self.seq < 0)
        if free.size < len(positions):
            raise ContextFull(f"the context is full: {len(positions)} tokens need cells, {free.size} of "
                              f"{self.n_cells} are free (raise -c)")
        cells = free[:len(positions)]
        self.seq[cells] = seq
        self.pos[cells] = positions
        if rope is None:
            self.rope[cells] = np.asarray(positions, np.int32)[:, None]
            self.after[cells] = np.asarray(positions, np.int32) + 1
        else:
            self.rope[cells] = rope
            self.after[cells] = after
            self.moved = self.moved or bool((rope != np.asarray(positions)[:, None]).any())
        return cells.astype(np.int32)

    def text_position(self, seq: int, index: int) -> int:
        """The rotary position a text token at `index` of `seq` takes: the `after` of the token
        before it (its index while no cell's position moved)."""
        if index == 0 or not self.moved:
            return index
        cell = np.flatnonzero((self.seq == seq) & (self.pos == index - 1))
        return int(self.after[cell[0]]) if cell.size else index

    def n_free(self) -> int:
        """Cells no sequence holds."""
        return int((self.seq < 0).sum())

    def highest_free(self) -> int:
        """The highest cell no sequence holds (allocate takes the lowest); there must be one."""
        return int(np.flatnonzero(self.seq < 0)[-1])

    def free(self, seq: int, from_pos: int = 0) -> None:
        """Forget sequence `seq`'s cells at positions >= from_pos."""
        drop = (self.seq == seq) & (self.pos >= from_pos)
        self.seq[drop] = -1

    def length(self, seq: int) -> int:
        mine = self.seq == seq
        return int(self.pos[mine].max()) + 1 if mine.any() else 0

    def cells_of(self, seq: int, n: int) -> np.ndarray:
        """The cells holding sequence `seq`'s positions 0..n-1, in position order."""
        mine = np.flatnonzero((self.seq == seq) & (self.pos < n))
        cells = mine[np.argsort(self.pos[mine], kind="stable")]
        if cells.size != n or (self.pos[cells] != np.arange(n)).any():
            raise VkrtError(f"sequence {seq} does not hold positions 0..{n - 1} (it holds {self.length(seq)} tokens)")
        return cells.astype(np.int32)

    def mask(self, tok_seq: np.ndarray, tok_pos: np.ndarray, n_kv: int, n_rows: int, window: int = 0,
             used: int | None = None, causal: bool = True) -> np.ndarray:
        """f16 [n_rows, n_kv]: 0 where token t may attend cell c (same sequence, not in the future,
        and within `window` positions when given), -inf elsewhere; rows past the tokens are -inf.
        `used`: used_end() when the caller has it. causal False: later cells of the sequence are
        visible too (llama.cpp's mask with causal_attn off: the window still bounds only the past)."""
        live = min(n_kv, self.used_end() if used is None else used)   # no token attends a cell past it
        cs, cp = self.seq[:live][None, :], self.pos[:live][None, :]
        ts, tp = tok_seq[:, None], tok_pos[:, None]
        visible = (cs == ts) & (cp <= tp) if causal else cs == ts
        if window:
            visible &= (tp - cp) < window
        out = np.full((n_rows, n_kv), -np.inf, np.float16)
        out[:len(tok_seq), :live] = np.where(visible, np.float16(0), np.float16(-np.inf))
        return out


class KVCache(Owned):
    """K and V tensors of the `layers` that attend (DeltaNet layers keep a recurrent state
    instead), by layer index; F16 by default, `type` K's (and V's unless `v_type` is given): F32,
    F16 or a quantised KV type (ops/kv_quant.py). `cells`: the cell table to share (the stages of
    a layer split hold the same cells of their own layers). `rotate`: a quantised K or V is
    stored Walsh-Hadamard rotated where the head allows (k_rot / v_rot: the runs, 0 none), as
    llama.cpp stores it (ops/hadamard.py)."""

    def __init__(self, device, layers, head_dim_k: int, head_dim_v: int, n_head_kv: int, n_ctx: int,
                 type=F16, cells: CellTable | None = None, v_type=None, rotate: bool = True):
        super().__init__(f"KV cache {n_ctx} cells")
        self.k_type = kv_type(type)
        self.v_type = kv_type(v_type) if v_type is not None else self.k_type
        self.type = self.k_type
        for t, hd, what in ((self.k_type, head_dim_k, "-ctk"), (self.v_type, head_dim_v, "-ctv")):
            if t.name in KV_QUANT and hd % t.block_size:
                raise ConfigError(f"{what} {t.name.lower()}: a {t.name} KV cache needs head sizes that are "
                                  f"multiples of {t.block_size}; this model's is {hd} (use f16)")
        self.k_rot = k_rotation(head_dim_k) if rotate and self.k_type.name in KV_QUANT else 0
        self.v_rot = v_rotation(head_dim_v) if rotate and self.v_type.name in KV_QUANT else 0
        self.n_ctx = n_ctx
        self.cells = cells if cells is not None else CellTable(n_ctx)
        self.k: dict[int, Tensor] = {}
        self.v: dict[int, Tensor] = {}
        try:
            for il in layers:
                self.k[il] = Tensor.empty(device, self.k_type, (head_dim_k, n_ctx, n_head_kv), name=f"cache_k.{il}")
                self.v[il] = Tensor.empty(device, self.v_type, (head_dim_v, n_ctx, n_head_kv), name=f"cache_v.{il}")
            # zeros, not whatever the memory held: attention weighs unused cells by exactly 0,
            # and 0 * NaN would still be NaN
            if self.k:
                run_once(device, lambda seq: [seq.fill(t.range(), 0) for t in self._all()], "clear KV cache")
        except BaseException:
            self.close()
            raise

    @property
    def type_name(self) -> str:
        """The cache's type, K/V where they differ (Q8_0, Q8_0/Q4_0)."""
        k, v = self.k_type.name, self.v_type.name
        return k if k == v else f"{k}/{v}"

    def _all(self) -> list[Tensor]:
        return [*self.k.values(), *self.v.values()]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self._all())

    def _release(self) -> None:
        for t in self._all():
            t.close()
