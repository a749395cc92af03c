"""Page-aligned anonymous memory, and file regions read into it (what `--no-mmap` uses), so that
VK_EXT_external_memory_host imports succeed where file-backed mappings are refused."""

from __future__ import annotations

import contextlib
import mmap
import os

import numpy as np

from ..errors import OutOfRange
from ..owned import Owned

PAGE = mmap.PAGESIZE
HUGE_PAGE = 2 << 20


class AnonymousMemory(Owned):
    """`size` zeroed bytes of private anonymous memory, page-aligned (transparent huge pages
    requested where the kernel offers them). `array` is a uint8 view; `address` its start.
    close() unmaps it: unregister it from any HostRegistry first."""

    def __init__(self, size: int, label: str = "anonymous memory"):
        if size < 0:
            raise OutOfRange(f"{label}: size must not be negative, got {size}")
        super().__init__(label)
        self.size = size
        self._map = mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if size >= HUGE_PAGE and hasattr(mmap, "MADV_HUGEPAGE"):
            with contextlib.suppress(OSError):
                self._map.madvise(mmap.MADV_HUGEPAGE)
        self.array = np.frombuffer(self._map, dtype=np.uint8, count=size)
        self.address = self.array.ctypes.data

    def _release(self) -> None:
        self.array = None
        try:
            self._map.close()
        except BufferError:  # a numpy view still alive elsewhere: unmapped when it goes
            pass


class AnonymousRegion(AnonymousMemory):
    """`size` bytes of a file copied into anonymous, page-aligned memory."""

    def __init__(self, path: str | os.PathLike, offset: int = 0, size: int | None = None, chunk: int = 64 << 20,
                 progress=None):
        self.path = os.fspath(path)
        file_size = os.path.getsize(self.path)
        size = file_size - offset if size is None else size
        if offset < 0 or size < 0 or offset + size > file_size:
            raise OutOfRange(f"{self.path}: region [{offset}, {offset + size}) is outside the file ({file_size} bytes)")
        super().__init__(size, f"anonymous copy of {self.path}")
        view = memoryview(self._map)
        try:
            with open(self.path, "rb", buffering=0) as f:
                f.seek(offset)
                done = 0
                while done < size:
                    n = f.readinto(view[done:min(size, done + chunk)])
                    if not n:
                        raise OutOfRange(f"{self.path}: file ended after {offset + done} bytes while reading")
                    done += n
                    if progress is not None:
                        progress(n)
        except BaseException:
            view.release()
            self.close()
            raise
        view.release()
