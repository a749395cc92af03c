"""Reading file regions into page-aligned anonymous memory (what `--no-mmap` uses), so that
VK_EXT_external_memory_host imports succeed where file-backed mappings are refused."""

from __future__ import annotations

import mmap
import os

import numpy as np

from ..errors import OutOfRange
from ..owned import Owned

PAGE = mmap.PAGESIZE


class AnonymousRegion(Owned):
    """`size` bytes of a file copied into anonymous, page-aligned memory. `array` is a uint8
    view; `address` its start. close() unmaps it (after any importer released it)."""

    def __init__(self, path: str | os.PathLike, offset: int = 0, size: int | None = None, chunk: int = 64 << 20,
                 progress=None):
        super().__init__(f"anonymous copy of {os.fspath(path)}")
        self.path = os.fspath(path)
        file_size = os.path.getsize(self.path)
        size = file_size - offset if size is None else size
        if offset < 0 or size < 0 or offset + size > file_size:
            raise OutOfRange(f"{self.path}: region [{offset}, {offset + size}) is outside the file ({file_size} bytes)")
        self.size = size
        self._map = mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.array = np.frombuffer(self._map, dtype=np.uint8, count=size)
        self.address = self.array.ctypes.data
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
        finally:
            view.release()

    def _release(self) -> None:
        self.array = None
        try:
            self._map.close()
        except BufferError:  # a numpy view still alive elsewhere: unmapped when it goes
            pass
