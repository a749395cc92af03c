"""ImportedBuffer: a VkBuffer over host memory imported with VK_EXT_external_memory_host, so the
GPU copies (or reads) straight from system RAM by DMA."""

from __future__ import annotations

import numpy as np

from ..device.vk import ffi, vk, vk_call
from ..errors import HostImportError
from ..units import fmt_bytes
from .buffer import STORAGE_USAGE, Buffer
from .memory_types import MemoryKind

HOST_ALLOCATION = vk.VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT


def _host_pointer_type_bits(device, address: int, label: str) -> int:
    fn = device.service("host-pointer-properties", _HostPointerProperties)
    props = vk.VkMemoryHostPointerPropertiesEXT()  # built here so that sType is set
    with vk_call(f"querying the memory types that can import {label!r} at 0x{address:x}"):
        fn(device.handle, HOST_ALLOCATION, ffi.cast("void *", address), props)
    return props.memoryTypeBits


class _HostPointerProperties:
    """vkGetMemoryHostPointerPropertiesEXT, fetched once per device."""

    def __init__(self, device):
        with vk_call("looking up vkGetMemoryHostPointerPropertiesEXT"):
            self._fn = vk.vkGetDeviceProcAddr(device.handle, "vkGetMemoryHostPointerPropertiesEXT")

    def __call__(self, *args):
        return self._fn(*args)

    def close(self) -> None:
        self._fn = None


class ImportedBuffer(Buffer):
    """`size` bytes of host memory at `address` seen by the GPU as a buffer. `address` and `size`
    must be multiples of the device's minImportedHostPointerAlignment. The host memory must
    outlive the buffer: close() it (waiting for GPU work that reads it) before freeing the memory.
    `host_bytes` is the host memory itself."""

    imported = True

    def __init__(self, device, address: int, size: int, *, label: str = "imported host memory",
                 usage: int = STORAGE_USAGE):
        p = device.profile
        if not p.host_import:
            raise HostImportError(f"importing {label!r}: {p.name} lacks VK_EXT_external_memory_host")
        align = p.host_import_alignment
        if address % align or size % align:
            raise HostImportError(f"importing {label!r}: address 0x{address:x} and size {size} must be multiples "
                                  f"of minImportedHostPointerAlignment {align}")
        self.address = address
        super().__init__(device, size, MemoryKind.HOST, label=label, usage=usage)

    def _create(self, usage: int) -> None:
        dev = self.device
        what = f"importing {fmt_bytes(self.size)} of host memory at 0x{self.address:x} as {self.label!r}"
        type_bits = _host_pointer_type_bits(dev, self.address, self.label)
        families = [dev.compute.family, dev.transfer.family] if dev.has_transfer_queue else []
        share = vk.VK_SHARING_MODE_CONCURRENT if families else vk.VK_SHARING_MODE_EXCLUSIVE
        external = vk.VkExternalMemoryBufferCreateInfo(handleTypes=HOST_ALLOCATION)
        info = vk.VkBufferCreateInfo(pNext=external, size=self.size, usage=usage, sharingMode=share,
                                     queueFamilyIndexCount=len(families), pQueueFamilyIndices=families or None)
        with vk_call(what):
            self.handle = vk.vkCreateBuffer(dev.handle, info, None)
            req = vk.vkGetBufferMemoryRequirements(dev.handle, self.handle)
        allowed = [t for t in dev.profile.memory_types if req.memoryTypeBits & type_bits & (1 << t.index)]
        if not allowed:
            raise HostImportError(f"{what} failed: no memory type allows it (buffer types 0x{req.memoryTypeBits:x}, "
                                  f"host pointer types 0x{type_bits:x})")
        if req.size > self.size:
            raise HostImportError(f"{what} failed: the buffer needs {req.size} bytes of memory")
        mtype = max(allowed, key=lambda t: (t.host_visible and t.host_coherent, not t.device_local))
        pointer = ffi.cast("void *", self.address)
        import_info = vk.VkImportMemoryHostPointerInfoEXT(handleType=HOST_ALLOCATION, pHostPointer=pointer)
        alloc = vk.VkMemoryAllocateInfo(pNext=import_info, allocationSize=self.size, memoryTypeIndex=mtype.index)
        with vk_call(what):
            self.memory = vk.vkAllocateMemory(dev.handle, alloc, None)
            vk.vkBindBufferMemory(dev.handle, self.handle, self.memory, 0)
        self.memory_type = mtype
        self.heap = mtype.heap
        self.allocation_size = self.size
        if mtype.host_visible and mtype.host_coherent:
            self._bytes = np.frombuffer(ffi.buffer(ffi.cast("char *", self.address), self.size), dtype=np.uint8)

    @property
    def host_bytes(self) -> np.ndarray:
        if self.closed:
            raise HostImportError(f"{self.label!r} was released (unregistered); its host memory is no longer imported")
        return super().host_bytes

    def _release(self) -> None:
        # imported memory is the caller's: no unmap, and it never counted against a heap
        dev = self.device
        dev.forget(self)
        self._bytes = None
        if self.handle is not None:
            vk.vkDestroyBuffer(dev.handle, self.handle, None)
            self.handle = None
        if self.memory is not None:
            vk.vkFreeMemory(dev.handle, self.memory, None)
            self.memory = None
