"""Descriptor sets for recorded dispatches, from pools that grow on demand and reset together."""

from __future__ import annotations

from ..device.vk import VK_ERROR_OUT_OF_POOL_MEMORY, ffi, lib, result_error, vk, vk_call
from ..errors import VkrtError
from ..owned import Owned

SETS_PER_POOL = 256
BUFFERS_PER_SET = 8


def storage_set_layout(device, n: int):
    """A descriptor set layout of n storage buffers, bindings 0..n-1, for compute shaders."""
    bindings = [vk.VkDescriptorSetLayoutBinding(binding=i, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                                descriptorCount=1, stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT)
                for i in range(n)]
    return vk.vkCreateDescriptorSetLayout(
        device.handle, vk.VkDescriptorSetLayoutCreateInfo(bindingCount=n, pBindings=bindings or None), None)


class DescriptorArena(Owned):
    """Allocates storage-buffer descriptor sets; reset() frees them all at once."""

    def __init__(self, device, label: str = "descriptors"):
        super().__init__(label)
        self.device = device
        self._pools: list = []
        self._used: list[list[int]] = []  # per pool: [sets, descriptors] handed out since the reset
        self._current = 0
        device.adopt(self)

    def _new_pool(self):
        size = vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                       descriptorCount=SETS_PER_POOL * BUFFERS_PER_SET)
        info = vk.VkDescriptorPoolCreateInfo(maxSets=SETS_PER_POOL, poolSizeCount=1, pPoolSizes=[size])
        with vk_call(f"creating a descriptor pool for {self.label}"):
            self._pools.append(vk.vkCreateDescriptorPool(self.device.handle, info, None))
        self._used.append([0, 0])

    def allocate(self, set_layout, ranges) -> object:
        """A descriptor set of `set_layout` whose binding i points at ranges[i]."""
        out = ffi.new("VkDescriptorSet*")
        layouts = ffi.new("VkDescriptorSetLayout[1]", [set_layout])
        info = ffi.new("VkDescriptorSetAllocateInfo*")
        info.sType = vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO
        info.descriptorSetCount = 1
        info.pSetLayouts = layouts
        n = len(ranges)
        while True:
            fresh = self._current >= len(self._pools)
            if fresh:
                self._new_pool()
            sets, descs = self._used[self._current]
            if n > SETS_PER_POOL * BUFFERS_PER_SET:
                raise VkrtError(f"{self.label}: a set of {n} buffers exceeds a pool's {SETS_PER_POOL * BUFFERS_PER_SET}")
            if sets + 1 > SETS_PER_POOL or descs + n > SETS_PER_POOL * BUFFERS_PER_SET:
                self._current += 1  # full by its own count (some drivers never say so)
                continue
            info.descriptorPool = self._pools[self._current]
            result = lib.vkAllocateDescriptorSets(self.device.handle, info, out)
            if result == vk.VK_SUCCESS:
                self._used[self._current][0] += 1
                self._used[self._current][1] += n
                break
            if result in (VK_ERROR_OUT_OF_POOL_MEMORY, vk.VK_ERROR_FRAGMENTED_POOL) and not fresh:
                self._current += 1  # this pool is full: move on to the next (or a new) one
                continue
            raise result_error("allocating a descriptor set", result)
        infos = ffi.new("VkDescriptorBufferInfo[]", n)
        writes = ffi.new("VkWriteDescriptorSet[]", n)
        for i, r in enumerate(ranges):
            infos[i].buffer = r.buffer.handle
            infos[i].offset = r.offset
            infos[i].range = r.size
            w = writes[i]
            w.sType = vk.VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET
            w.dstSet = out[0]
            w.dstBinding = i
            w.descriptorCount = 1
            w.descriptorType = vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER
            w.pBufferInfo = infos + i
        lib.vkUpdateDescriptorSets(self.device.handle, n, writes, 0, ffi.NULL)
        return out

    def reset(self) -> None:
        for pool in self._pools:
            lib.vkResetDescriptorPool(self.device.handle, pool, 0)
        self._used = [[0, 0] for _ in self._pools]
        self._current = 0

    def _release(self) -> None:
        self.device.forget(self)
        for pool in self._pools:
            vk.vkDestroyDescriptorPool(self.device.handle, pool, None)
        self._pools.clear()
