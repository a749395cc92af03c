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
from ..device.vk import ffi, vk, vk_call
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
        self.pool = self.memory = self._sets = None
        self._lock = threading.Lock()
        binding = vk.VkDescriptorSetLayoutBinding(binding=0, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                                  descriptorCount=1, stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT)
        with vk_call("creating the IQ grids' descriptor set layout"):
            self.set_layout = vk.vkCreateDescriptorSetLayout(
                device.handle, vk.VkDescriptorSetLayoutCreateInfo(bindingCount=1, pBindings=[binding]), None)

    @property
    def sets(self):
        """The one descriptor set, as the array vkCmdBindDescriptorSets takes."""
        if self._sets is None:
            with self._lock:
                if self._sets is None:
                    self._fill()
        return self._sets

    def _fill(self) -> None:
        words = grid_words()[0]
        self.memory = allocate(self.device, words.nbytes, label="IQ grids")
        upload(self.device, self.memory.range(), words)
        d = self.device.handle
        with vk_call("creating the IQ grids' descriptor set"):
            size = vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount=1)
            self.pool = vk.vkCreateDescriptorPool(
                d, vk.VkDescriptorPoolCreateInfo(maxSets=1, poolSizeCount=1, pPoolSizes=[size]), None)
            dset = vk.vkAllocateDescriptorSets(d, vk.VkDescriptorSetAllocateInfo(
                descriptorPool=self.pool, descriptorSetCount=1, pSetLayouts=[self.set_layout]))[0]
            r = self.memory.range()
            info = vk.VkDescriptorBufferInfo(buffer=r.handle, offset=r.offset, range=r.size)
            vk.vkUpdateDescriptorSets(d, 1, [vk.VkWriteDescriptorSet(
                dstSet=dset, dstBinding=0, descriptorCount=1, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                pBufferInfo=[info])], 0, None)
        self._sets = ffi.new("VkDescriptorSet[1]", [dset])

    def _release(self) -> None:
        d = self.device.handle
        if self.pool is not None:
            vk.vkDestroyDescriptorPool(d, self.pool, None)
        if self.set_layout is not None:
            vk.vkDestroyDescriptorSetLayout(d, self.set_layout, None)
        if self.memory is not None:
            self.memory.close()
        self.pool = self.set_layout = self.memory = self._sets = None


def quant_tables(device) -> QuantTables:
    """The device's QuantTables, made on first use."""
    return device.service("quant tables", QuantTables)
