"""CommandSequence: record dispatches, copies and barriers once; submit and replay many times
(docs/ARCHITECTURE.md §4, record once, replay)."""

from __future__ import annotations

import contextlib
from typing import Sequence

from ..errors import VkrtError
from ..owned import Owned
from ..device.vk import ffi, lib, result_error, vk, vk_call
from .descriptors import DescriptorArena
from .hazards import HazardTracker

# Barriers between commands name only the access kinds commands make: with the generic
# VK_ACCESS_MEMORY_* bits NVIDIA's driver flushes more at every barrier, which cost 21% of a decode
# step on the H200 (Qwen3-30B-A3B shape: 192.5 -> 244.7 t/s without them). The barrier that opens
# a sequence (after other submissions and queues) keeps the generic bits.
_TRANSFER_WRITES = vk.VK_ACCESS_TRANSFER_WRITE_BIT
_TRANSFER_ACCESS = vk.VK_ACCESS_TRANSFER_READ_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT
_MEMORY_WRITES = vk.VK_ACCESS_MEMORY_WRITE_BIT
_MEMORY_ACCESS = vk.VK_ACCESS_MEMORY_READ_BIT | vk.VK_ACCESS_MEMORY_WRITE_BIT
_SHADER_WRITES = vk.VK_ACCESS_SHADER_WRITE_BIT
_SHADER_ACCESS = vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT


class CommandSequence(Owned):
    """A command buffer on one queue (compute by default) with its descriptor sets.

        seq = CommandSequence(device)
        with seq.record():
            seq.dispatch(kernel, [a, b, out], push={"n": n}, groups=(g, 1, 1))
        seq.run()          # submit and wait; call again to replay without re-recording

    Barriers are inserted automatically where one command reads or writes memory an earlier one
    touched; `barrier()` forces one. With `timestamps=True`, gpu_times() gives each dispatch's
    GPU seconds after the run.
    """

    def __init__(self, device, *, queue: str = "compute", timestamps: bool = False, max_timestamps: int = 1024,
                 label: str = "sequence"):
        super().__init__(label)
        self.device = device
        self.queue = device.transfer if queue == "transfer" else device.compute
        self.compute_capable = self.queue is device.compute
        self.handle = self.pool = self.query_pool = None
        self._descriptors = None
        self._tracker = HazardTracker()
        self._keep: list = []
        self._labels: list[str] = []
        self._state = "empty"   # empty | recording | recorded
        self._submitted = 0     # timeline value of the last submission
        self._last_pipeline = None
        self.dispatch_count = 0
        self.barrier_count = 0
        # stages and access kinds this queue's family supports (a DMA-only queue has no shaders)
        self._stages = vk.VK_PIPELINE_STAGE_TRANSFER_BIT
        self._writes, self._access = _TRANSFER_WRITES, _TRANSFER_ACCESS
        if self.compute_capable:
            self._stages |= vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT
            self._writes |= _SHADER_WRITES
            self._access |= _SHADER_ACCESS
        self._barrier = ffi.new("VkMemoryBarrier*")
        self._barrier.sType = vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER
        try:
            info = vk.VkCommandPoolCreateInfo(flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                                              queueFamilyIndex=self.queue.family)
            with vk_call(f"creating the command pool of {label}"):
                self.pool = vk.vkCreateCommandPool(device.handle, info, None)
                alloc = vk.VkCommandBufferAllocateInfo(commandPool=self.pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                                       commandBufferCount=1)
                self.handle = vk.vkAllocateCommandBuffers(device.handle, alloc)[0]
            if timestamps:
                family = device.profile.queue_families[self.queue.family]
                if family.timestamp_bits == 0:
                    raise VkrtError(f"the {self.queue.name} queue of {device.profile.name} has no timestamps")
                self._ts_mask = (1 << family.timestamp_bits) - 1 if family.timestamp_bits < 64 else (1 << 64) - 1
                self.max_timestamps = max_timestamps
                qinfo = vk.VkQueryPoolCreateInfo(queryType=vk.VK_QUERY_TYPE_TIMESTAMP, queryCount=max_timestamps)
                with vk_call(f"creating the timestamp query pool of {label}"):
                    self.query_pool = vk.vkCreateQueryPool(device.handle, qinfo, None)
            self._descriptors = DescriptorArena(device, label=f"{label} descriptors")
        except BaseException:
            self.close()
            raise
        device.adopt(self)

    # -- recording ---------------------------------------------------------------------------
    def begin(self) -> None:
        if self._state == "recording":
            raise VkrtError(f"{self.label}: begin() while already recording")
        self.wait()
        with vk_call(f"beginning {self.label}"):
            vk.vkResetCommandBuffer(self.handle, 0)
            self._descriptors.reset()
            vk.vkBeginCommandBuffer(self.handle, vk.VkCommandBufferBeginInfo())
        self._tracker.reset()
        self._keep.clear()
        self._labels.clear()
        self._last_pipeline = None
        self.dispatch_count = self.barrier_count = 0
        self._state = "recording"
        # earlier submissions (any queue) may have written what we are about to read
        self._memory_barrier(vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, self._writes | _MEMORY_WRITES,
                             vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, self._access | _MEMORY_ACCESS)
        if self.query_pool is not None:
            lib.vkCmdResetQueryPool(self.handle, self.query_pool, 0, self.max_timestamps)
            lib.vkCmdWriteTimestamp(self.handle, vk.VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, self.query_pool, 0)

    def end(self) -> None:
        self._require_recording()
        # make device writes visible to the host once the submission completes
        self._memory_barrier(vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, self._writes | _MEMORY_WRITES,
                             vk.VK_PIPELINE_STAGE_HOST_BIT, vk.VK_ACCESS_HOST_READ_BIT)
        with vk_call(f"ending {self.label}"):
            vk.vkEndCommandBuffer(self.handle)
        self._state = "recorded"

    @contextlib.contextmanager
    def record(self):
        """`with seq.record():` begin, record the body, end."""
        self.begin()
        try:
            yield self
        except BaseException:
            with contextlib.suppress(Exception):
                vk.vkEndCommandBuffer(self.handle)
            self._state = "empty"
            raise
        self.end()

    def _require_recording(self) -> None:
        if self._state != "recording":
            raise VkrtError(f"{self.label}: commands can only be added between begin() and end()")

    def _memory_barrier(self, src_stage, src_access, dst_stage, dst_access) -> None:
        b = self._barrier
        b.srcAccessMask = src_access
        b.dstAccessMask = dst_access
        lib.vkCmdPipelineBarrier(self.handle, src_stage, dst_stage, 0, 1, b, 0, ffi.NULL, 0, ffi.NULL)

    def barrier(self) -> None:
        """Make every earlier write visible to every later command."""
        self._require_recording()
        self._memory_barrier(self._stages, self._writes, self._stages, self._access)
        self._tracker.reset()
        self.barrier_count += 1

    def _hazard(self, reads, writes) -> None:
        if self._tracker.needs_barrier(reads, writes):
            self.barrier()
        self._tracker.record(reads, writes)
        self._keep.extend(r.buffer for r in (*reads, *writes))

    def _check_range(self, r, what: str, storage: bool) -> None:
        p = self.device.profile
        if r.offset < 0 or r.size <= 0 or r.offset + r.size > r.buffer.size:
            raise VkrtError(f"{what}: range [{r.offset}, {r.offset + r.size}) is outside buffer "
                            f"{r.buffer.label!r} of {r.buffer.size} bytes")
        if r.buffer.closed:
            raise VkrtError(f"{what}: buffer {r.buffer.label!r} is closed")
        if storage:
            if r.offset % p.min_storage_buffer_offset_alignment:
                raise VkrtError(f"{what}: offset {r.offset} is not a multiple of the storage-buffer offset "
                                f"alignment {p.min_storage_buffer_offset_alignment}")
            if r.size > p.max_storage_buffer_range:
                raise VkrtError(f"{what}: binding {r.size} bytes exceeds maxStorageBufferRange "
                                f"{p.max_storage_buffer_range}; bind a sub-range")

    def dispatch(self, kernel, buffers: Sequence, push: dict | bytes | None = None,
                 groups: tuple[int, int, int] = (1, 1, 1), label: str | None = None) -> None:
        """Record `kernel` over `groups` workgroups with buffers[i] at binding i."""
        self._require_recording()
        if not self.compute_capable:
            raise VkrtError(f"{self.label}: dispatches need the compute queue, not {self.queue.name}")
        what = f"{self.label}: dispatch of {kernel.label}"
        if len(buffers) != len(kernel.bindings):
            raise VkrtError(f"{what}: the kernel has {len(kernel.bindings)} bindings, got {len(buffers)} buffers")
        limit = self.device.profile.max_workgroup_count
        gx, gy, gz = groups
        if not (0 < gx <= limit[0] and 0 < gy <= limit[1] and 0 < gz <= limit[2]):
            raise VkrtError(f"{what}: workgroup count {tuple(groups)} is outside 1..{limit}")
        for r in buffers:
            self._check_range(r, what, storage=True)
        reads = [r for r, b in zip(buffers, kernel.bindings) if not b.writeonly]
        writes = [r for r, b in zip(buffers, kernel.bindings) if not b.readonly]
        self._hazard(reads, writes)
        data = kernel.push.pack(push) if isinstance(push, dict) else (push or b"")
        if len(data) != kernel.push_size:
            raise VkrtError(f"{what}: {len(data)} bytes of push constants, the kernel takes {kernel.push_size}")
        dset = self._descriptors.allocate(kernel.set_layout, buffers)
        cb = self.handle
        if self._last_pipeline is not kernel.pipeline:
            lib.vkCmdBindPipeline(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, kernel.pipeline)
            self._last_pipeline = kernel.pipeline
        lib.vkCmdBindDescriptorSets(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, kernel.layout, 0, 1, dset, 0, ffi.NULL)
        if kernel.tables is not None:   # set 1: the IQ grids (pipeline/quant_tables.py)
            lib.vkCmdBindDescriptorSets(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, kernel.layout, 1, 1,
                                        kernel.tables.sets, 0, ffi.NULL)
        if data:
            lib.vkCmdPushConstants(cb, kernel.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0, len(data),
                                   ffi.from_buffer(data))
        lib.vkCmdDispatch(cb, gx, gy, gz)
        self._keep.append(kernel)
        self.dispatch_count += 1
        self._timestamp(label or kernel.label)

    def copy(self, src, dst, size: int | None = None, label: str = "copy") -> None:
        """Copy `size` bytes (default: all of src) from range src to range dst."""
        self._require_recording()
        size = src.size if size is None else size
        if size > dst.size or size > src.size:
            raise VkrtError(f"{self.label}: copy of {size} bytes from {src.size} into {dst.size} bytes")
        self._check_range(src, f"{self.label}: copy source", storage=False)
        self._check_range(dst, f"{self.label}: copy destination", storage=False)
        src, dst = src.buffer.range(src.offset, size), dst.buffer.range(dst.offset, size)
        self._hazard([src], [dst])
        region = ffi.new("VkBufferCopy*")
        region.srcOffset, region.dstOffset, region.size = src.offset, dst.offset, size
        lib.vkCmdCopyBuffer(self.handle, src.buffer.handle, dst.buffer.handle, 1, region)
        self._timestamp(label)

    def copy_regions(self, src, dst, regions: list[tuple[int, int, int]], label: str = "copy") -> None:
        """Copy each (src offset, dst offset, size) of `regions` from Buffer src to Buffer dst in
        one command (one call into the driver, where copy() would make one a region)."""
        self._require_recording()
        if not regions:
            return
        reads, writes = [], []
        for so, do, size in regions:
            if size <= 0 or so < 0 or do < 0 or so + size > src.size or do + size > dst.size:
                raise VkrtError(f"{self.label}: copy region {so}+{size} -> {do}+{size} outside {src.size} / "
                                f"{dst.size} bytes")
            reads.append(src.range(so, size))
            writes.append(dst.range(do, size))
        for r in reads:
            self._check_range(r, f"{self.label}: copy source", storage=False)
        for w in writes:
            self._check_range(w, f"{self.label}: copy destination", storage=False)
        self._hazard(reads, writes)
        array = ffi.new("VkBufferCopy[]", len(regions))
        for k, (so, do, size) in enumerate(regions):
            array[k].srcOffset, array[k].dstOffset, array[k].size = so, do, size
        lib.vkCmdCopyBuffer(self.handle, src.handle, dst.handle, len(regions), array)
        self._timestamp(label)

    def fill(self, dst, value: int = 0, label: str = "fill") -> None:
        """Set every 32-bit word of range dst to `value` (size must be a multiple of 4)."""
        self._require_recording()
        if dst.size % 4 or dst.offset % 4:
            raise VkrtError(f"{self.label}: fill needs 4-byte aligned offset and size, got {dst.offset}+{dst.size}")
        self._check_range(dst, f"{self.label}: fill", storage=False)
        self._hazard([], [dst])
        lib.vkCmdFillBuffer(self.handle, dst.buffer.handle, dst.offset, dst.size, value & 0xFFFFFFFF)
        self._timestamp(label)

    @property
    def timed_commands(self) -> int:
        """Commands recorded so far with a timestamp after them (with timestamps=True)."""
        return len(self._labels)

    def _timestamp(self, label: str) -> None:
        if self.query_pool is None:
            return
        index = len(self._labels) + 1
        if index >= self.max_timestamps:
            raise VkrtError(f"{self.label}: more than {self.max_timestamps - 1} timed commands; "
                            "raise max_timestamps")
        lib.vkCmdWriteTimestamp(self.handle, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, self.query_pool, index)
        self._labels.append(label)

    # -- execution -----------------------------------------------------------------------------
    def submit(self, waits: Sequence = (), auto_wait: bool = True) -> int:
        """Queue the recorded commands after `waits` ((semaphore, value) pairs); returns the
        timeline value of this submission. A previous run of this sequence is waited for first.
        auto_wait also waits for everything submitted to the other queue (off when the caller
        orders the queues itself, e.g. to overlap uploads with compute)."""
        if self._state != "recorded":
            raise VkrtError(f"{self.label}: nothing recorded to submit (state {self._state})")
        self.wait()
        other = self.device.transfer if self.queue is self.device.compute else self.device.compute
        if auto_wait and other is not self.queue and other.last_submitted:
            # work submitted earlier on the other queue comes first (e.g. an upload before its use)
            waits = [*waits, (other.timeline, other.last_submitted)]
        self._submitted = self.queue.submit([self.handle], waits)
        return self._submitted

    @property
    def timeline(self):
        return self.queue.timeline

    def wait(self, timeout_ns: int | None = None) -> None:
        if self._submitted:
            self.queue.wait(self._submitted, timeout_ns)

    def run(self, waits: Sequence = ()) -> None:
        self.submit(waits)
        self.wait()

    def gpu_times(self) -> list[tuple[str, float]]:
        """(label, seconds) per timed command of the last completed run."""
        if self.query_pool is None:
            raise VkrtError(f"{self.label} was created without timestamps=True")
        self.wait()
        n = len(self._labels) + 1
        data = ffi.new("uint64_t[]", n)
        flags = vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT
        with vk_call(f"reading timestamps of {self.label}"):
            result = lib.vkGetQueryPoolResults(self.device.handle, self.query_pool, 0, n, n * 8, data, 8, flags)
            if result != vk.VK_SUCCESS:
                raise result_error(f"reading timestamps of {self.label}", result)
        period = self.device.profile.timestamp_period_ns * 1e-9
        ticks = [int(data[i]) & self._ts_mask for i in range(n)]
        return [(self._labels[i], (ticks[i + 1] - ticks[i]) * period) for i in range(n - 1)]

    def gpu_time(self) -> float:
        """GPU seconds of the whole last run."""
        return sum(t for _, t in self.gpu_times())

    def _release(self) -> None:
        dev = self.device
        dev.forget(self)
        if self._submitted and not dev.closed:
            with contextlib.suppress(Exception):
                self.queue.wait(self._submitted)
        if self._descriptors is not None:
            self._descriptors.close()
        if self.query_pool is not None:
            vk.vkDestroyQueryPool(dev.handle, self.query_pool, None)
        if self.pool is not None:
            vk.vkDestroyCommandPool(dev.handle, self.pool, None)  # frees the command buffer too
        self.pool = self.handle = self.query_pool = None
        self._keep.clear()


def run_once(device, record, label: str = "one-off"):
    """Record `record(seq)` into a new sequence, run it, wait, and return what record returned."""
    with CommandSequence(device, label=label) as seq:
        with seq.record():
            out = record(seq)
        seq.run()
    return out
