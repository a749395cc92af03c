"""The IQ quants' lookup grids in one device buffer, bound as descriptor set 1 of the kernels
that fill their shared copies from it (shaders/quant/iq_common.glsl, QTABLES_BUFFER): a
workgroup's fill is a few coalesced 16-byte loads an invocation instead of a dynamically indexed
constant-array read an entry, which NVIDIA's compiler serialises. The words are the generated
constant arrays of shaders/quant/iq_tables.glsl, parsed from it: one source for both."""

from __future__ import annotations

import functools
import re
import threading

import numpy as np

from ..commands import upload
from ..commands.descriptors import DescriptorArena, storage_set_layout
from ..device.vk import vk, vk_call
from ..errors import VkrtError
from ..memory import allocate
from ..owned import Owned
from .compiler import shader_dir

TABLES_SET = 1       # the descriptor set the kernels declare the grids' buffer in (binding 0)
TABLES_BLOCK = "QTables"
_GRID = re.compile(r"const uint (\w+_grid)\[(\d+)\] = uint\[\]\((.*?)\);", re.S)


@functools.cache
def grid_words() -> tuple[np.ndarray, dict[str, int]]:
    """Every grid of iq_tables.glsl, one after another, and where each starts (in 16-byte units)."""
    path = shader_dir() / "quant" / "iq_tables.glsl"
    parts, starts, at = [], {}, 0
    for name, n, body in _GRID.findall(path.read_text()):
        words = np.array([int(w.strip().rstrip("u"), 16) for w in body.split(",")], np.uint32)
        if len(words) != int(n) or len(words) % 4:
            raise VkrtError(f"{path}: {name} has {len(words)} words, declared {n} (a multiple of 4 expected)")
        starts[name] = at // 4
        parts.append(words)
        at += len(words)
    if not parts:
        raise VkrtError(f"{path}: no grid tables found")
    return np.concatenate(parts), starts


@functools.cache
def grid_base(include: str) -> int:
    """Where the grid a type's include (shaders/<include>) names as IQ_GRID starts in the buffer,
    in 16-byte units."""
    path = shader_dir() / include
    found = re.search(r"^#define IQ_GRID (\w+)", path.read_text(), re.M)
    starts = grid_words()[1]
    if found is None or found.group(1) not in starts:
        raise VkrtError(f"{path}: no IQ_GRID among the grids of quant/iq_tables.glsl ({', '.join(starts)})")
    return starts[found.group(1)]


class QuantTables(Owned):
    """The grids' descriptor set layout on one device (what a kernel's pipeline layout names), and
    on first use (a dispatch's `sets`) the buffer of the grids and one set pointing at it: a
    device that only compiles (the null Polaris device of bench/gcn_shader_stats.py) allocates nothing."""

    def __init__(self, device):
        super().__init__("IQ grids")
        self.device = device
        self.memory = self.arena = self._sets = None
        self._lock = threading.Lock()
        with vk_call("creating the IQ grids' descriptor set layout"):
            self.set_layout = storage_set_layout(device, 1)

    @property
    def sets(self):
        """The one descriptor set, as the array vkCmdBindDescriptorSets takes."""
        if self._sets is None:
            with self._lock:
                if self._sets is None:
                    words = grid_words()[0]
                    self.memory = allocate(self.device, words.nbytes, label="IQ grids")
                    upload(self.device, self.memory.range(), words)
                    self.arena = DescriptorArena(self.device, label="IQ grids' descriptor set")
                    self._sets = self.arena.allocate(self.set_layout, [self.memory.range()])
        return self._sets

    def _release(self) -> None:
        if self.arena is not None:
            self.arena.close()
        if self.set_layout is not None:
            vk.vkDestroyDescriptorSetLayout(self.device.handle, self.set_layout, None)
        if self.memory is not None:
            self.memory.close()
        self.arena = self.set_layout = self.memory = self._sets = None


def quant_tables(device) -> QuantTables:
    """The device's QuantTables, made on first use."""
    return device.service("quant tables", QuantTables)
