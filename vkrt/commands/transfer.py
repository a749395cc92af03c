"""Synchronous upload to and download from any buffer range, staging where not host-visible."""

from __future__ import annotations

import threading

import numpy as np

from ..errors import OutOfRange
from ..memory import Buffer, MemoryKind
from ..owned import Owned
from .sequence import CommandSequence

CHUNK = 64 << 20


def _as_bytes(data) -> np.ndarray:
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    return np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)


class Transfers(Owned):
    """A staging buffer, a readback buffer and a copy sequence on the transfer queue."""

    def __init__(self, device):
        super().__init__("transfers")
        self.device = device
        self._staging: Buffer | None = None
        self._readback: Buffer | None = None
        self._seq = CommandSequence(device, queue="transfer", label="transfers")
        self._lock = threading.Lock()

    def _buffer(self, attr: str, kind: MemoryKind, size: int) -> Buffer:
        buf = getattr(self, attr)
        if buf is None or buf.size < size:
            if buf is not None:
                buf.close()
            buf = Buffer(self.device, size, kind, label=f"{attr.strip('_')} buffer")
            setattr(self, attr, buf)
        return buf

    def upload(self, dst, data) -> None:
        src = _as_bytes(data)
        if src.size > dst.size:
            raise OutOfRange(f"upload of {src.size} bytes into a {dst.size}-byte range of {dst.buffer.label!r}")
        if dst.buffer.host_visible:
            self.device.compute.wait()
            self.device.transfer.wait()
            dst.buffer.write(src, dst.offset)
            return
        with self._lock:
            staging = self._buffer("_staging", MemoryKind.HOST, min(CHUNK, max(src.size, 1 << 16)))
            for start in range(0, src.size, staging.size):
                part = src[start:start + staging.size]
                self._seq.wait()
                staging.write(part)
                with self._seq.record():
                    self._seq.copy(staging.range(0, part.size), dst.buffer.range(dst.offset + start, part.size))
                self._seq.run()

    def download(self, src, dtype=np.uint8) -> np.ndarray:
        if src.buffer.host_visible:
            self.device.compute.wait()
            self.device.transfer.wait()
            return src.buffer.read(dtype, src.size, src.offset)
        out = np.empty(src.size, dtype=np.uint8)
        with self._lock:
            readback = self._buffer("_readback", MemoryKind.READBACK, min(CHUNK, max(src.size, 1 << 16)))
            for start in range(0, src.size, readback.size):
                n = min(readback.size, src.size - start)
                with self._seq.record():
                    self._seq.copy(src.buffer.range(src.offset + start, n), readback.range(0, n))
                self._seq.run()
                out[start:start + n] = readback.read(np.uint8, n)
        return out.view(dtype)

    def _release(self) -> None:
        self._seq.close()
        for buf in (self._staging, self._readback):
            if buf is not None:
                buf.close()


def upload(device, dst, data) -> None:
    """Copy host data (bytes or array) into the range `dst`, waiting until it has landed."""
    device.service("transfers", Transfers).upload(dst, data)


def download(device, src, dtype=np.uint8) -> np.ndarray:
    """A host copy of the range `src` as an array of `dtype`, after all submitted work finished."""
    return device.service("transfers", Transfers).download(src, dtype)
