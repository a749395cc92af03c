"""Queues and timeline semaphores: every submission signals a value you can wait on."""

from __future__ import annotations

import threading
from typing import Sequence

from ..owned import Owned
from .vk import ffi, lib, result_error, vk, vk_call


class TimelineSemaphore(Owned):
    """A VkSemaphore of timeline type."""

    def __init__(self, device, initial: int = 0, label: str = "timeline"):
        super().__init__(label)
        self.device = device
        type_info = vk.VkSemaphoreTypeCreateInfo(semaphoreType=vk.VK_SEMAPHORE_TYPE_TIMELINE, initialValue=initial)
        with vk_call(f"creating timeline semaphore {label}"):
            self.handle = vk.vkCreateSemaphore(device.handle, vk.VkSemaphoreCreateInfo(pNext=type_info), None)
        self._wait_info = ffi.new("VkSemaphoreWaitInfo*")
        self._wait_sem = ffi.new("VkSemaphore[1]", [self.handle])
        self._wait_val = ffi.new("uint64_t[1]")
        self._wait_info.sType = vk.VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO
        self._wait_info.semaphoreCount = 1
        self._wait_info.pSemaphores = self._wait_sem
        self._wait_info.pValues = self._wait_val
        self._counter = ffi.new("uint64_t*")

    def completed(self) -> int:
        """The value the GPU has reached."""
        result = lib.vkGetSemaphoreCounterValue(self.device.handle, self.handle, self._counter)
        if result != vk.VK_SUCCESS:
            raise result_error(f"reading {self.label}", result)
        return int(self._counter[0])

    def wait(self, value: int, timeout_ns: int | None = None) -> None:
        """Block until the semaphore reaches `value`; GpuTimeout after the timeout (default: the
        device's settings.gpu_timeout, VKRT_GPU_TIMEOUT)."""
        self._wait_val[0] = value
        timeout = int(self.device.settings.gpu_timeout * 1e9) if timeout_ns is None else timeout_ns
        result = lib.vkWaitSemaphores(self.device.handle, self._wait_info, timeout)
        if result != vk.VK_SUCCESS:
            what = f"waiting for {self.label} to reach {value} (timeout {timeout / 1e9:.0f} s; VKRT_GPU_TIMEOUT)"
            raise result_error(what, result)

    def _release(self) -> None:
        vk.vkDestroySemaphore(self.device.handle, self.handle, None)


class Queue:
    """A VkQueue with its own timeline: submit() returns the value that marks completion."""

    def __init__(self, device, family: int, index: int, name: str):
        self.device = device
        self.family = family
        self.name = name
        self.handle = vk.vkGetDeviceQueue(device.handle, family, index)
        self.timeline = TimelineSemaphore(device, label=f"{name}-queue timeline")
        self._last = 0
        self._lock = threading.Lock()

    @property
    def last_submitted(self) -> int:
        return self._last

    def submit(self, command_buffers: Sequence, waits: Sequence[tuple[TimelineSemaphore, int]] = (),
               wait_stage: int = vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT) -> int:
        """Submit command buffers after `waits` (semaphore, value) pairs; returns this submission's value."""
        n_wait = len(waits)
        cbs = ffi.new("VkCommandBuffer[]", list(command_buffers))
        wait_sems = ffi.new("VkSemaphore[]", [s.handle for s, _ in waits]) if n_wait else ffi.NULL
        wait_vals = ffi.new("uint64_t[]", [v for _, v in waits]) if n_wait else ffi.NULL
        stages = ffi.new("VkPipelineStageFlags[]", [wait_stage] * n_wait) if n_wait else ffi.NULL
        sig_sem = ffi.new("VkSemaphore[1]", [self.timeline.handle])
        sig_val = ffi.new("uint64_t[1]")
        tl = ffi.new("VkTimelineSemaphoreSubmitInfo*")
        tl.sType = vk.VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO
        tl.waitSemaphoreValueCount = n_wait
        tl.pWaitSemaphoreValues = wait_vals
        tl.signalSemaphoreValueCount = 1
        tl.pSignalSemaphoreValues = sig_val
        info = ffi.new("VkSubmitInfo*")
        info.sType = vk.VK_STRUCTURE_TYPE_SUBMIT_INFO
        info.pNext = tl
        info.waitSemaphoreCount = n_wait
        info.pWaitSemaphores = wait_sems
        info.pWaitDstStageMask = stages
        info.commandBufferCount = len(command_buffers)
        info.pCommandBuffers = cbs
        info.signalSemaphoreCount = 1
        info.pSignalSemaphores = sig_sem
        with self._lock:
            value = self._last + 1
            sig_val[0] = value
            result = lib.vkQueueSubmit(self.handle, 1, info, ffi.NULL)
            if result != vk.VK_SUCCESS:
                raise result_error(f"submitting {len(command_buffers)} command buffer(s) to the {self.name} queue", result)
            self._last = value
        return value

    def wait(self, value: int | None = None, timeout_ns: int | None = None) -> None:
        """Wait until submission `value` (default: the last one) has finished."""
        self.timeline.wait(self._last if value is None else value, timeout_ns)

    def done(self, value: int) -> bool:
        return self.timeline.completed() >= value

    def close(self) -> None:
        self.timeline.close()
