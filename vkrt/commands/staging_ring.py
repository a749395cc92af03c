"""StagingRing: a fixed set of host-visible segments reused round-robin, so uploads (and
downloads) of any size stream through without allocating, and the host memcpy into one segment
overlaps the GPU copy out of another."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..errors import OutOfRange
from ..memory import Buffer, BufferRange, MemoryKind
from ..owned import Owned

SEGMENT_ALIGN = 4096
THREADED_COPY_MIN = 4 << 20  # smaller copies are not worth handing to threads


def default_copy_threads(settings) -> int:
    """Threads for one memcpy (numpy releases the GIL while copying): settings.staging_threads
    (VKRT_STAGING_THREADS), else up to 4, leaving a core free."""
    if settings.staging_threads is not None:
        return settings.staging_threads
    return max(1, min(4, (os.cpu_count() or 1) - 1))


class StagingRing(Owned):
    """`count` segments of `segment_size` bytes (rounded up to 4 KiB) in one host-visible buffer
    of `kind` (HOST for uploads, always host-coherent; READBACK for downloads), tied to `queue`:
    a segment is handed out again only after the submission that last used it
    (release(index, value)) has finished on that queue."""

    def __init__(self, device, queue, segment_size: int, count: int, kind: MemoryKind = MemoryKind.HOST,
                 copy_threads: int | None = None, label: str = "staging ring"):
        if count < 2 or segment_size < SEGMENT_ALIGN:
            raise OutOfRange(f"{label}: need at least 2 segments of at least {SEGMENT_ALIGN} bytes, "
                             f"got {count} x {segment_size}")
        super().__init__(label)
        self.device = device
        self.queue = queue
        self.segment_size = -(-segment_size // SEGMENT_ALIGN) * SEGMENT_ALIGN
        self.count = count
        self._busy = [0] * count  # timeline value on `queue` that frees each segment
        self._next = 0
        self.acquired = 0         # segments handed out (for statistics and tests)
        self._pool = self.buffer = None
        try:
            self._threads = default_copy_threads(device.settings) if copy_threads is None else copy_threads
            self.buffer = Buffer(device, self.segment_size * count, kind, label=label)
        except BaseException:
            self.close()
            raise
        if self._threads > 1:
            self._pool = ThreadPoolExecutor(self._threads - 1, thread_name_prefix="vkrt-staging")  # + this thread
        device.adopt(self)

    def segment(self, index: int, size: int | None = None) -> BufferRange:
        return self.buffer.range(index * self.segment_size, self.segment_size if size is None else size)

    def acquire(self) -> int:
        """The next segment in turn, after waiting for its previous use to finish."""
        index = self._next
        self._next = (index + 1) % self.count
        if self._busy[index]:
            self.queue.wait(self._busy[index])
        self.acquired += 1
        return index

    def release(self, index: int, value: int) -> None:
        """Segment `index` is in use until `queue` reaches timeline `value`."""
        self._busy[index] = value

    def busy_until(self, index: int) -> int:
        return self._busy[index]

    def fill(self, index: int, src: np.ndarray) -> None:
        """Copy uint8 `src` (at most one segment) into the start of segment `index`."""
        n = src.size
        if n > self.segment_size:
            raise OutOfRange(f"{self.label}: {n} bytes do not fit a {self.segment_size}-byte segment")
        start = index * self.segment_size
        dst = self.buffer.host_bytes[start:start + n]
        if self._pool is None or n < THREADED_COPY_MIN:
            dst[:] = src
        else:
            step = -(-n // self._threads)
            parts = [(s, min(n, s + step)) for s in range(0, n, step)]
            futures = [self._pool.submit(_copy, dst, src, s, e) for s, e in parts[1:]]
            _copy(dst, src, *parts[0])  # this thread copies the first part
            for f in futures:
                f.result()

    def read_into(self, index: int, out: np.ndarray) -> None:
        """Copy the first out.size bytes of segment `index` into uint8 `out`."""
        start = index * self.segment_size
        if self.buffer.memory_type.host_coherent:
            out[:] = self.buffer.host_bytes[start:start + out.size]
        else:  # read() invalidates the CPU caches first
            out[:] = self.buffer.read(np.uint8, out.size, start)

    def drain(self) -> None:
        """Wait until no segment is in use."""
        last = max(self._busy)
        if last:
            self.queue.wait(last)

    def _release(self) -> None:
        self.device.forget(self)
        if not self.device.closed:
            self.drain()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        if self.buffer is not None:
            self.buffer.close()


def _copy(dst: np.ndarray, src: np.ndarray, start: int, end: int) -> None:
    dst[start:end] = src[start:end]
