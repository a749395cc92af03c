"""Uploader: host -> GPU copies on the transfer queue (the compute queue where the device has no
DMA-only family), handed to compute through timeline semaphores.

Sources in registered host memory (vkrt.memory.host_import) are copied by the GPU straight from
their imported (or host-visible fallback) chunks; anything else streams through a StagingRing.
upload() returns an Upload: wait on it, or pass it in `waits` to CommandSequence.submit.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np

from ..device.queue import TimelineSemaphore
from ..errors import OutOfRange, VkrtError
from ..memory import BufferRange, MemoryKind
from ..memory.host_import import host_registry
from ..owned import Owned
from .copy_commands import CopyCommands
from .staging_ring import StagingRing


class Upload(NamedTuple):
    """A submitted copy: done when `semaphore` reaches `value` (0: already done). It is a
    (semaphore, value) pair, so it can go straight into `waits` of CommandSequence.submit."""

    semaphore: TimelineSemaphore
    value: int

    def wait(self, timeout_ns: int | None = None) -> None:
        if self.value:
            self.semaphore.wait(self.value, timeout_ns)

    def done(self) -> bool:
        return self.value == 0 or self.semaphore.completed() >= self.value


@dataclass
class UploadStats:
    """Bytes moved by each path, and queue submissions made."""

    bytes_direct: int = 0        # GPU copy from registered host memory
    bytes_staged: int = 0        # through the staging ring
    bytes_host_written: int = 0  # memcpy into a host-visible destination
    bytes_downloaded: int = 0
    submissions: int = 0


def as_bytes(data) -> np.ndarray:
    """A flat uint8 view of an array or any buffer-protocol object (no copy when contiguous)."""
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    return np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)


def _host_side(buffer) -> bool:
    """Whether the host reads and writes `buffer` directly: host-visible and not VRAM."""
    return getattr(buffer, "kind", MemoryKind.DEVICE) is not MemoryKind.DEVICE and buffer.host_visible


def _as_range(rng) -> BufferRange:
    """A BufferRange for anything with .buffer/.offset/.size (Buffer, Allocation, BufferRange)."""
    return rng if isinstance(rng, BufferRange) else BufferRange(rng.buffer, rng.offset, rng.size)


def _check(rng, size: int, what: str) -> None:
    buf = rng.buffer
    if buf.closed:
        raise VkrtError(f"{what}: buffer {buf.label!r} is closed")
    if size > rng.size or rng.offset < 0 or rng.offset + size > buf.size:
        raise OutOfRange(f"{what}: {size} bytes at offset {rng.offset} do not fit range of {rng.size} bytes "
                         f"in {buf.label!r} ({buf.size} bytes)")


class Uploader(Owned):
    """Uploads and downloads on one queue: "transfer" (default; the compute queue when the device
    has no transfer family) or "compute". Staging segments default to the device's tuning."""

    def __init__(self, device, queue: str = "transfer", *, segment_size: int | None = None,
                 segments: int | None = None, registry=None, label: str | None = None):
        if queue not in ("transfer", "compute"):
            raise VkrtError(f"uploader queue must be 'transfer' or 'compute', got {queue!r}")
        super().__init__(label or f"{queue} uploader")
        self.device = device
        self.queue = device.transfer if queue == "transfer" else device.compute
        self.other = device.compute if self.queue is device.transfer else device.transfer
        self.registry = registry
        self.stats = UploadStats()
        self._segment_size = segment_size or device.tuning.staging_segment
        self._segments = segments or device.tuning.staging_segments
        self._ring = self._readback = None
        self._commands = None
        self._lock = threading.RLock()
        try:
            self._commands = CopyCommands(device, self.queue, label=f"{self.label} commands")
            self._ring = StagingRing(device, self.queue, self._segment_size, self._segments,
                                     label=f"{self.label} staging")
        except BaseException:
            self.close()
            raise
        device.adopt(self)

    @property
    def ring(self) -> StagingRing:
        """The upload staging ring."""
        return self._ring

    @property
    def readback_ring(self) -> StagingRing | None:
        """The download ring (made on the first download that needs it)."""
        return self._readback

    def _default_waits(self, waits) -> list:
        if waits is not None:
            return list(waits)
        if self.other is not self.queue and self.other.last_submitted:
            # the other queue's earlier work may still read (or write) the destination
            return [(self.other.timeline, self.other.last_submitted)]
        return []

    def _done(self) -> Upload:
        return Upload(self.queue.timeline, 0)

    # -- uploads ------------------------------------------------------------------------------------
    def upload(self, dst, data, waits: Sequence | None = None) -> Upload:
        """Copy host `data` (array or bytes) into range `dst`. Returns once the host side is done
        with `data` unless it lies in registered host memory (then keep it until the Upload is
        done; registered memory stays alive until unregistered). `waits`: (semaphore, value)
        pairs to wait for first; default: the other queue's last submission."""
        src = as_bytes(data)
        n = src.size
        dst = _as_range(dst)
        _check(dst, n, f"uploading {n} bytes")
        if n == 0:
            return self._done()
        with self._lock:
            registry = self.registry or host_registry(self.device)
            spans = registry.spans(src.ctypes.data, n) if registry.regions else None
            if spans:
                up = self.copy(spans, dst, waits)
                self.stats.bytes_direct += n
                return up
            if _host_side(dst.buffer):
                self.device.compute.wait()
                self.device.transfer.wait()
                dst.buffer.write(src, dst.offset)
                self.stats.bytes_host_written += n
                return self._done()
            return self._stage(src, dst, self._default_waits(waits))

    def _stage(self, src: np.ndarray, dst, waits: list) -> Upload:
        ring = self._ring
        value = 0
        for start in range(0, src.size, ring.segment_size):
            part = src[start:start + ring.segment_size]
            i = ring.acquire()
            ring.fill(i, part)
            value = self._commands.submit([(ring.segment(i, part.size), dst.sub(start, part.size))], waits)
            ring.release(i, value)
            self.stats.submissions += 1
        self.stats.bytes_staged += src.size
        return Upload(self.queue.timeline, value)

    def copy(self, sources, dst, waits: Sequence | None = None) -> Upload:
        """GPU copy of BufferRange `sources` (one, or a list laid end to end) into range `dst`."""
        sources = [_as_range(sources)] if hasattr(sources, "buffer") else [_as_range(s) for s in sources]
        dst = _as_range(dst)
        total = sum(src.size for src in sources)
        _check(dst, total, f"copying {total} bytes")
        copies, offset = [], 0
        for src in sources:
            _check(src, src.size, "copy source")
            copies.append((src, dst.sub(offset, src.size)))
            offset += src.size
        with self._lock:
            value = self._commands.submit(copies, self._default_waits(waits))
            self.stats.submissions += 1
        return Upload(self.queue.timeline, value)

    # -- downloads ----------------------------------------------------------------------------------
    def download(self, src, dtype=np.uint8) -> np.ndarray:
        """A host copy of range `src` as an array of `dtype`, after all work submitted so far."""
        src = _as_range(src)
        n = src.size
        _check(src, n, f"downloading {n} bytes")
        with self._lock:
            self.stats.bytes_downloaded += n
            if _host_side(src.buffer):
                self.device.compute.wait()
                self.device.transfer.wait()
                return src.buffer.read(dtype, n, src.offset)
            if self._readback is None:
                self._readback = StagingRing(self.device, self.queue, self._segment_size, self._segments,
                                             MemoryKind.READBACK, label=f"{self.label} readback")
            ring = self._readback
            out = np.empty(n, dtype=np.uint8)
            pending: collections.deque = collections.deque()
            waits = self._default_waits(None)
            for start in range(0, n, ring.segment_size):
                if len(pending) == ring.count:
                    self._collect(ring, pending.popleft(), out)
                size = min(ring.segment_size, n - start)
                i = ring.acquire()
                value = self._commands.submit([(src.sub(start, size), ring.segment(i, size))], waits, to_host=True)
                ring.release(i, value)
                self.stats.submissions += 1
                pending.append((i, start, size, value))
            while pending:
                self._collect(ring, pending.popleft(), out)
        return out.view(dtype)

    def _collect(self, ring: StagingRing, item, out: np.ndarray) -> None:
        i, start, size, value = item
        self.queue.wait(value)
        ring.read_into(i, out[start:start + size])

    def _release(self) -> None:
        self.device.forget(self)
        for part in (self._ring, self._readback, self._commands):
            if part is not None:
                part.close()


def uploader(device, queue: str = "transfer") -> Uploader:
    """The device's shared Uploader for `queue` (created on first use, closed with the device)."""
    return device.service(f"uploader:{queue}", lambda d: Uploader(d, queue))
