"""A sequence's KV cells and recurrent state to and from host memory (the server's prompt cache
in host RAM and its slot files): read positions [0, n) of a sequence into numpy arrays, write
them back into the cells of an empty sequence, on every stage of a layer split. Copies go through
a host-visible staging buffer per device, a group of layers at a time (at most STAGING_BYTES
unless one layer needs more): a copy per head for each run of consecutive cells, or, where the
sequence's cells are interleaved with others', for the span covering them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..commands import run_once
from ..errors import VkrtError
from ..memory import Buffer, MemoryKind

STAGING_BYTES = 256 << 20
MAX_RUNS = 16   # runs of cells copied one by one; more: the span covering them (see _Plan)


@dataclass
class KVBlock:
    """The K and V rows of positions [0, n_tokens) of a sequence: per attention layer, uint8
    arrays (n_head_kv, n_tokens, row bytes), as the cache stores them (its type, unconverted);
    with images among them, the cells' rotary positions (CellTable.rope [n, 3] and .after [n];
    None: every token text at its index)."""

    n_tokens: int
    layers: dict[int, tuple[np.ndarray, np.ndarray]]
    rope: np.ndarray | None = None
    after: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        extra = self.rope.nbytes + self.after.nbytes if self.rope is not None else 0
        return sum(k.nbytes + v.nbytes for k, v in self.layers.values()) + extra

    def prefix(self, n: int) -> KVBlock:
        """The first n positions (views, not copies)."""
        if not 0 <= n <= self.n_tokens:
            raise VkrtError(f"a KV block of {self.n_tokens} positions has no prefix of {n}")
        return KVBlock(n, {il: (k[:, :n], v[:, :n]) for il, (k, v) in self.layers.items()},
                       None if self.rope is None else self.rope[:n], None if self.after is None else self.after[:n])


def kv_layout(engine) -> dict:
    """What a KVBlock and a recurrent state of this engine look like: the cache type, each
    attention layer's (K row bytes, V row bytes, heads), the runs a quantised K and V are rotated
    in (0: not rotated) and the recurrent state's bytes a sequence on each stage (a saved block
    fits another engine only where these agree)."""
    layers = {}
    for st in engine.stages:
        for il, k in st.cache.k.items():
            layers[il] = (k.nb[1], st.cache.v[il].nb[1], k.ne[2])
    return {"kv_type": engine.cache.type_name, "layers": {str(il): list(v) for il, v in sorted(layers.items())},
            "kv_rotation": [engine.cache.k_rot, engine.cache.v_rot],
            "state_bytes": [st.state.slot_bytes for st in engine.stages if st.state is not None]}


def _runs(cells: np.ndarray) -> list[tuple[int, int, int]]:
    """(first position, first cell, length) of each run of consecutive cells."""
    breaks = np.flatnonzero(np.diff(cells) != 1) + 1
    starts = np.concatenate([[0], breaks])
    ends = np.concatenate([breaks, [cells.size]])
    return [(int(s), int(cells[s]), int(e - s)) for s, e in zip(starts, ends)]


@dataclass
class _Plan:
    """How a sequence's cells meet the staging buffer: `regions` (first cell, first staging row,
    rows) are copied, the staging holds `width` rows a head, position p's at row where[p]. A few
    runs of cells are copied one by one (rows in position order); more (cells interleaved with
    other sequences'), the span covering them at once, the rows gathered on the host."""

    regions: list[tuple[int, int, int]]
    width: int
    where: np.ndarray
    span: bool


def _plan(cells: np.ndarray) -> _Plan:
    runs = _runs(cells)
    if len(runs) <= MAX_RUNS:
        return _Plan([(cell, pos, length) for pos, cell, length in runs], cells.size, np.arange(cells.size), False)
    lo, hi = int(cells.min()), int(cells.max()) + 1
    return _Plan([(lo, 0, hi - lo)], hi - lo, cells - lo, True)


def _groups(cache, width: int) -> list[list[int]]:
    """The stage's attention layers in groups whose K and V rows (`width` a head) fit the staging."""
    groups, size = [[]], 0
    for il in sorted(cache.k):
        k, v = cache.k[il], cache.v[il]
        need = width * k.ne[2] * (k.nb[1] + v.nb[1])
        if groups[-1] and size + need > STAGING_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(il)
        size += need
    return [g for g in groups if g]


def _transfer(cache, device, layers: list[int], plan: _Plan, to_host: bool, block: KVBlock) -> None:
    """Copy `layers`' rows of the planned cells between the cache and `block` (read: filled;
    write: its rows sent) through a staging buffer. A write over a span first reads it, so the
    other sequences' cells in it are written back unchanged."""
    tensors, size = [], 0   # (layer, K or V, tensor, staging offset)
    for il in layers:
        for j, t in enumerate((cache.k[il], cache.v[il])):
            tensors.append((il, j, t, size))
            size += t.ne[2] * plan.width * t.nb[1]

    def record(down: bool):
        def rec(seq):   # one command a cache buffer: every head's runs of every tensor in it
            regions: dict[int, tuple[object, list]] = {}
            for _, _, t, at in tensors:
                row, whole = t.nb[1], t.range()
                buf, pairs = regions.setdefault(id(whole.buffer), (whole.buffer, []))
                for h in range(t.ne[2]):
                    for cell, first, rows in plan.regions:
                        pairs.append((whole.offset + h * t.nb[2] + cell * row, (h * plan.width + first) * row + at,
                                      rows * row))
            for buf, pairs in regions.values():
                if down:
                    seq.copy_regions(buf, staging, pairs)
                else:
                    seq.copy_regions(staging, buf, [(s, d, n) for d, s, n in pairs])
        return rec

    with Buffer(device, max(4, size), MemoryKind.READBACK if to_host else MemoryKind.HOST,
                label="KV transfer staging") as staging:
        if to_host or plan.span:
            run_once(device, record(True), "read KV cells")
        if to_host:   # one read of the staging (each call into C is a turn at the GIL another thread may keep)
            data = staging.read(np.uint8, size)
            for il, j, t, at in tensors:
                rows = data[at:at + t.ne[2] * plan.width * t.nb[1]].reshape(t.ne[2], plan.width, -1)
                pair = list(block.layers.get(il, (None, None)))
                pair[j] = np.ascontiguousarray(rows[:, plan.where]) if plan.span else rows
                block.layers[il] = tuple(pair)
            return
        for il, j, t, at in tensors:
            if plan.span:
                rows = staging.read(np.uint8, t.ne[2] * plan.width * t.nb[1], at).reshape(t.ne[2], plan.width, -1)
                rows[:, plan.where] = block.layers[il][j]
            else:
                rows = np.ascontiguousarray(block.layers[il][j])
            staging.write(rows, at)
        run_once(device, record(False), "write KV cells")


def read_kv(engine, seq_id: int, n: int) -> KVBlock:
    """A host copy of sequence `seq_id`'s K and V rows at positions [0, n)."""
    block = KVBlock(n, {})
    if n == 0:
        return block
    cells = engine.cache.cells
    held = cells.cells_of(seq_id, n)
    index = np.arange(n, dtype=np.int32)
    if cells.moved and ((cells.rope[held] != index[:, None]).any() or (cells.after[held] != index + 1).any()):
        block.rope, block.after = cells.rope[held].copy(), cells.after[held].copy()   # this sequence's moved
    plan = _plan(held)
    for st in engine.stages:
        for layers in _groups(st.cache, plan.width):
            _transfer(st.cache, st.device, layers, plan, True, block)
    return block


def write_kv(engine, seq_id: int, block: KVBlock, n: int | None = None) -> None:
    """Give the empty sequence `seq_id` the first n (default: all) positions of `block`: it takes
    free cells for them and their rows are written there."""
    n = block.n_tokens if n is None else n
    cells = engine.cache.cells
    if cells.length(seq_id):
        raise VkrtError(f"sequence {seq_id} must be empty to take saved KV cells (it holds {cells.length(seq_id)})")
    mine = {il for st in engine.stages for il in st.cache.k}
    if set(block.layers) != mine:
        raise VkrtError(f"saved KV cells of layers {sorted(block.layers)} do not fit this model's attention layers "
                        f"{sorted(mine)}")
    if n == 0:
        return
    part = block.prefix(n)
    plan = _plan(cells.allocate(seq_id, np.arange(n, dtype=np.int32), part.rope, part.after))
    try:
        for st in engine.stages:
            for layers in _groups(st.cache, plan.width):
                _transfer(st.cache, st.device, layers, plan, False, part)
    except BaseException:
        cells.free(seq_id)
        raise


def _states(engine) -> list:
    return [st.state for st in engine.stages if st.state is not None]


def read_state(engine, seq_id: int) -> list[np.ndarray]:
    """Host copies of sequence `seq_id`'s recurrent state, one a stage holding DeltaNet layers."""
    return [s.read(seq_id) for s in _states(engine)]


def read_checkpoint(engine, ckpt) -> list[np.ndarray]:
    """Host copies of a recurrent-state checkpoint, one a stage holding DeltaNet layers."""
    return [s.read_checkpoint(ckpt) for s in _states(engine)]


def write_state(engine, seq_id: int, parts: list[np.ndarray], length: int) -> None:
    """Put a state read_state or read_checkpoint gave into sequence `seq_id`, as having absorbed
    `length` tokens."""
    states = _states(engine)
    if len(parts) != len(states):
        raise VkrtError(f"a recurrent state saved from {len(parts)} device(s) does not fit this engine's "
                        f"{len(states)}")
    for s, data in zip(states, parts):
        s.write(seq_id, data, length)
