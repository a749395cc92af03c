"""CopyCommands: command buffers on one queue for batches of buffer copies, each reused once its
submission has finished (no allocation per upload in steady state)."""

from __future__ import annotations

from typing import Sequence

from ..device.vk import ffi, lib, result_error, vk, vk_error
from ..memory import BufferRange
from ..owned import Owned

MAX_COMMAND_BUFFERS = 64  # copies in flight before the oldest is waited for


class CopyCommands(Owned):
    """Command buffers on one queue for copy batches, each reused once its submission finished."""

    def __init__(self, device, queue, label: str = "copy commands"):
        super().__init__(label)
        self.device = device
        self.queue = queue
        self.pool = None
        self._cbs: list = []
        self._busy: list[int] = []
        info = vk.VkCommandPoolCreateInfo(flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                                          queueFamilyIndex=queue.family)
        try:
            self.pool = vk.vkCreateCommandPool(device.handle, info, None)
        except (vk.VkError, vk.VkException) as exc:
            self.close()
            raise vk_error(f"creating the command pool of {label}", exc) from None
        self._begin = ffi.new("VkCommandBufferBeginInfo*")
        self._begin.sType = vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO
        self._begin.flags = vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT
        compute = device.profile.queue_families[queue.family].compute
        # earlier work on this queue (copies; on a compute queue also shaders) before our copies
        self._into = ffi.new("VkMemoryBarrier*")
        self._into.sType = vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER
        self._into.srcAccessMask = vk.VK_ACCESS_TRANSFER_WRITE_BIT | (vk.VK_ACCESS_SHADER_WRITE_BIT if compute else 0)
        self._into.dstAccessMask = vk.VK_ACCESS_TRANSFER_READ_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT
        # copies into host-read memory, visible to the host once the submission completes
        self._out = ffi.new("VkMemoryBarrier*")
        self._out.sType = vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER
        self._out.srcAccessMask = vk.VK_ACCESS_TRANSFER_WRITE_BIT
        self._out.dstAccessMask = vk.VK_ACCESS_HOST_READ_BIT
        device.adopt(self)

    def _acquire(self) -> int:
        done = self.queue.timeline.completed()
        for i, busy in enumerate(self._busy):
            if busy <= done:
                return i
        if len(self._cbs) >= MAX_COMMAND_BUFFERS:
            oldest = min(range(len(self._busy)), key=self._busy.__getitem__)
            self.queue.wait(self._busy[oldest])
            return oldest
        cb = ffi.new("VkCommandBuffer*")
        info = ffi.new("VkCommandBufferAllocateInfo*")
        info.sType = vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO
        info.commandPool = self.pool
        info.level = vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY
        info.commandBufferCount = 1
        self._result(lib.vkAllocateCommandBuffers(self.device.handle, info, cb), "allocating a command buffer")
        self._cbs.append(cb[0])
        self._busy.append(0)
        return len(self._cbs) - 1

    def _result(self, result: int, what: str) -> None:
        if result != vk.VK_SUCCESS:
            raise result_error(f"{what} for {self.label}", result)

    def submit(self, copies: Sequence[tuple[BufferRange, BufferRange]], waits: Sequence = (),
               to_host: bool = False) -> int:
        """Record `copies` ((src, dst) ranges of equal size) in a free command buffer and submit it
        after `waits`; returns the queue's timeline value for it."""
        i = self._acquire()
        cb = self._cbs[i]
        self._result(lib.vkResetCommandBuffer(cb, 0), "resetting a command buffer")
        self._result(lib.vkBeginCommandBuffer(cb, self._begin), "beginning a command buffer")
        lib.vkCmdPipelineBarrier(cb, vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, vk.VK_PIPELINE_STAGE_TRANSFER_BIT, 0,
                                 1, self._into, 0, ffi.NULL, 0, ffi.NULL)
        region = ffi.new("VkBufferCopy*")
        for src, dst in copies:
            region.srcOffset, region.dstOffset, region.size = src.offset, dst.offset, src.size
            lib.vkCmdCopyBuffer(cb, src.buffer.handle, dst.buffer.handle, 1, region)
        if to_host:
            lib.vkCmdPipelineBarrier(cb, vk.VK_PIPELINE_STAGE_TRANSFER_BIT, vk.VK_PIPELINE_STAGE_HOST_BIT, 0,
                                     1, self._out, 0, ffi.NULL, 0, ffi.NULL)
        self._result(lib.vkEndCommandBuffer(cb), "ending a command buffer")
        value = self.queue.submit([cb], waits, vk.VK_PIPELINE_STAGE_TRANSFER_BIT)
        self._busy[i] = value
        return value

    def _release(self) -> None:
        self.device.forget(self)
        if self.pool is not None:
            if self._busy and not self.device.closed:
                self.queue.wait(max(self._busy))
            vk.vkDestroyCommandPool(self.device.handle, self.pool, None)  # frees the command buffers
            self.pool = None
        self._cbs.clear()
