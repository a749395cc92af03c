"""Buffer: one VkBuffer bound to its own VkDeviceMemory; BufferRange: a window into one."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import BufferTooLarge, OutOfDeviceMemory, OutOfRange, VkrtError
from ..owned import Owned
from ..units import fmt_bytes
from ..device.vk import result_name, vk, vk_call, vk_error
from .memory_types import MemoryKind, memory_type_candidates

STORAGE_USAGE = (vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT
                 | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT)


@dataclass(frozen=True)
class BufferRange:
    """`size` bytes of `buffer` starting at byte `offset`: what a kernel binds or a copy moves."""

    buffer: "Buffer"
    offset: int
    size: int

    @property
    def handle(self):
        return self.buffer.handle

    def sub(self, offset: int, size: int | None = None) -> "BufferRange":
        size = self.size - offset if size is None else size
        if offset < 0 or size < 0 or offset + size > self.size:
            raise OutOfRange(f"range [{offset}, {offset + size}) is outside {self.size} bytes of {self.buffer.label}")
        return BufferRange(self.buffer, self.offset + offset, size)

    def write(self, data, offset: int = 0) -> None:
        self.buffer.write(data, self.offset + offset, limit=self.offset + self.size)

    def read(self, dtype=np.uint8, count: int | None = None, offset: int = 0) -> np.ndarray:
        nbytes = self.size - offset if count is None else count * np.dtype(dtype).itemsize
        if offset + nbytes > self.size:
            raise OutOfRange(f"reading {nbytes} bytes at {offset} overruns a {self.size}-byte range")
        return self.buffer.read(dtype, nbytes, self.offset + offset)


def out_of_memory(device, size: int, heap: int, label: str, result: str) -> OutOfDeviceMemory:
    h = device.profile.heaps[heap]
    kind = "device-local" if h.device_local else "host"
    budget = f", driver budget {fmt_bytes(h.budget)}" if h.budget is not None else ""
    return OutOfDeviceMemory(
        f"out of memory allocating {fmt_bytes(size)} ({size} bytes) for {label!r} in heap {heap} "
        f"({kind}, {fmt_bytes(h.size)}{budget}); vkrt already uses {fmt_bytes(device.heap_used[heap])} there",
        result)


class Buffer(Owned):
    """A VkBuffer with dedicated memory of `kind`. Host-visible kinds stay mapped for life."""

    def __init__(self, device, size: int, kind: MemoryKind = MemoryKind.DEVICE, *, label: str = "buffer",
                 usage: int = STORAGE_USAGE):
        if size <= 0:
            raise OutOfRange(f"buffer {label!r}: size must be positive, got {size}")
        limit = device.profile.max_buffer_size
        if size > limit:
            raise BufferTooLarge(f"buffer {label!r} of {fmt_bytes(size)} exceeds the device's maximum buffer size "
                            f"{fmt_bytes(limit)}; split it")
        super().__init__(label)
        self.device = device
        self.size = size
        self.kind = MemoryKind(kind)
        self.handle = self.memory = None
        self._mapped = self._bytes = None
        self.heap = None
        try:
            self._create(usage)
        except BaseException:
            self.close()
            raise
        device.adopt(self)

    def _create(self, usage: int) -> None:
        dev = self.device
        share = vk.VK_SHARING_MODE_EXCLUSIVE
        families = None
        if dev.has_transfer_queue:
            share = vk.VK_SHARING_MODE_CONCURRENT
            families = [dev.compute.family, dev.transfer.family]
        info = vk.VkBufferCreateInfo(size=self.size, usage=usage, sharingMode=share,
                                     queueFamilyIndexCount=len(families or []), pQueueFamilyIndices=families)
        with vk_call(f"creating buffer {self.label!r} ({fmt_bytes(self.size)})"):
            self.handle = vk.vkCreateBuffer(dev.handle, info, None)
            req = vk.vkGetBufferMemoryRequirements(dev.handle, self.handle)
        candidates = memory_type_candidates(dev.profile, req.memoryTypeBits, self.kind)
        if not candidates:
            raise VkrtError(f"no memory type suits a {self.kind.value} buffer on {dev.profile.name}")
        if self.kind is MemoryKind.DEVICE and dev.vram_budget is not None \
                and dev.vram_used + req.size > dev.vram_budget:
            raise OutOfDeviceMemory(
                f"allocating {fmt_bytes(req.size)} for {self.label!r} would exceed the VRAM budget of "
                f"{fmt_bytes(dev.vram_budget)} (--vram-budget / VKRT_VRAM_BUDGET); {fmt_bytes(dev.vram_used)} "
                "is in use", "VRAM_BUDGET")
        error = None
        for mtype in candidates:
            alloc = vk.VkMemoryAllocateInfo(allocationSize=req.size, memoryTypeIndex=mtype.index)
            try:
                self.memory = vk.vkAllocateMemory(dev.handle, alloc, None)
            except (vk.VkErrorOutOfDeviceMemory, vk.VkErrorOutOfHostMemory) as exc:
                error = out_of_memory(dev, req.size, mtype.heap, self.label, result_name(exc))
                continue
            except (vk.VkError, vk.VkException) as exc:
                raise vk_error(f"allocating memory for buffer {self.label!r}", exc) from None
            self.memory_type = mtype
            self.heap = mtype.heap
            self.allocation_size = req.size
            dev.heap_used[mtype.heap] += req.size
            if self.kind is MemoryKind.DEVICE:
                dev.vram_used += req.size
            break
        else:
            raise error
        with vk_call(f"binding memory of buffer {self.label!r}"):
            vk.vkBindBufferMemory(dev.handle, self.handle, self.memory, 0)
            if self.memory_type.host_visible:
                self._mapped = vk.vkMapMemory(dev.handle, self.memory, 0, self.size, 0)
                self._bytes = np.frombuffer(self._mapped, dtype=np.uint8)

    # -- BufferRange protocol ----------------------------------------------------------------
    @property
    def buffer(self) -> "Buffer":
        return self

    @property
    def offset(self) -> int:
        return 0

    def range(self, offset: int = 0, size: int | None = None) -> BufferRange:
        return BufferRange(self, 0, self.size).sub(offset, size)

    # -- host access ----------------------------------------------------------------------------
    @property
    def host_visible(self) -> bool:
        return self._bytes is not None

    @property
    def host_bytes(self) -> np.ndarray:
        """The mapped memory as a uint8 array (host-visible buffers only)."""
        if self._bytes is None:
            raise VkrtError(f"buffer {self.label!r} ({self.kind.value}) is not host-visible; upload through staging")
        return self._bytes

    def _atom_range(self, offset: int, size: int):
        atom = self.device.profile.non_coherent_atom_size
        start = offset // atom * atom
        end = min(-(-(offset + size) // atom) * atom, self.allocation_size)
        return vk.VkMappedMemoryRange(memory=self.memory, offset=start, size=end - start)

    def write(self, data, offset: int = 0, limit: int | None = None) -> None:
        """Copy bytes (or any array) into host-visible memory at `offset`."""
        src = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8) if not isinstance(data, np.ndarray) \
            else np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        end = offset + src.size
        if offset < 0 or end > (self.size if limit is None else limit):
            raise OutOfRange(f"writing {src.size} bytes at {offset} overruns buffer {self.label!r} ({self.size} bytes)")
        self.host_bytes[offset:end] = src
        if not self.memory_type.host_coherent:
            with vk_call(f"flushing buffer {self.label!r}"):
                vk.vkFlushMappedMemoryRanges(self.device.handle, 1, [self._atom_range(offset, src.size)])

    def read(self, dtype=np.uint8, nbytes: int | None = None, offset: int = 0) -> np.ndarray:
        """A copy of host-visible memory as an array of `dtype`."""
        nbytes = self.size - offset if nbytes is None else nbytes
        if offset < 0 or offset + nbytes > self.size:
            raise OutOfRange(f"reading {nbytes} bytes at {offset} overruns buffer {self.label!r} ({self.size} bytes)")
        if not self.memory_type.host_coherent:
            with vk_call(f"invalidating buffer {self.label!r}"):
                vk.vkInvalidateMappedMemoryRanges(self.device.handle, 1, [self._atom_range(offset, nbytes)])
        return self.host_bytes[offset:offset + nbytes].copy().view(dtype)

    def _release(self) -> None:
        dev = self.device
        dev.forget(self)
        if self._mapped is not None:
            self._bytes = None
            self._mapped = None
            vk.vkUnmapMemory(dev.handle, self.memory)
        if self.handle is not None:
            vk.vkDestroyBuffer(dev.handle, self.handle, None)
            self.handle = None
        if self.memory is not None:
            vk.vkFreeMemory(dev.handle, self.memory, None)
            dev.heap_used[self.heap] -= self.allocation_size
            if self.kind is MemoryKind.DEVICE:
                dev.vram_used -= self.allocation_size
            self.memory = None

