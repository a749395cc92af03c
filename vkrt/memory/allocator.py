"""Suballocation: many tensors share a few large buffers of one memory kind."""

from __future__ import annotations

import bisect
import threading

from ..errors import OutOfRange
from ..owned import Owned
from .buffer import Buffer, BufferRange
from .memory_types import MemoryKind

DEFAULT_BLOCK = 256 << 20


def _align_up(x: int, a: int) -> int:
    return -(-x // a) * a


class Allocation(Owned):
    """`size` bytes at `offset` of a shared Buffer. close() returns the space."""

    def __init__(self, allocator: "Allocator", block: "_Block", offset: int, size: int, label: str):
        super().__init__(label)
        self.allocator = allocator
        self.block = block
        self.buffer: Buffer = block.buffer
        self.offset = offset
        self.size = size
        allocator.device.adopt(self)

    @property
    def handle(self):
        return self.buffer.handle

    def range(self, offset: int = 0, size: int | None = None) -> BufferRange:
        return BufferRange(self.buffer, self.offset, self.size).sub(offset, size)

    def _release(self) -> None:
        self.allocator.device.forget(self)
        self.allocator._free(self)


class _Block:
    """One Buffer and its free list of (offset, size), sorted by offset."""

    def __init__(self, buffer: Buffer, dedicated: bool):
        self.buffer = buffer
        self.dedicated = dedicated
        self.free = [(0, buffer.size)]
        self.used = 0

    def take(self, size: int, align: int) -> int | None:
        for i, (off, length) in enumerate(self.free):
            start = _align_up(off, align)
            if start + size <= off + length:
                pieces = []
                if start > off:
                    pieces.append((off, start - off))
                if start + size < off + length:
                    pieces.append((start + size, off + length - start - size))
                self.free[i:i + 1] = pieces
                self.used += size
                return start
        return None

    def give(self, offset: int, size: int) -> None:
        i = bisect.bisect(self.free, (offset, size))
        self.free.insert(i, (offset, size))
        # coalesce with the right, then the left neighbour
        if i + 1 < len(self.free) and offset + size == self.free[i + 1][0]:
            self.free[i] = (offset, size + self.free[i + 1][1])
            del self.free[i + 1]
        if i > 0 and self.free[i - 1][0] + self.free[i - 1][1] == self.free[i][0]:
            self.free[i - 1] = (self.free[i - 1][0], self.free[i - 1][1] + self.free[i][1])
            del self.free[i]
        self.used -= size


class Allocator(Owned):
    """Hands out Allocations from blocks of `block_size` bytes; requests larger than half a
    block get a dedicated buffer. Offsets honour the storage-buffer offset alignment."""

    def __init__(self, device, kind: MemoryKind = MemoryKind.DEVICE, block_size: int | None = None,
                 label: str | None = None):
        super().__init__(label or f"{MemoryKind(kind).value} allocator")
        self.device = device
        self.kind = MemoryKind(kind)
        p = device.profile
        self.block_size = min(block_size or DEFAULT_BLOCK, p.max_allocation_size, p.max_buffer_size)
        self.alignment = max(16, p.min_storage_buffer_offset_alignment)
        self._blocks: list[_Block] = []
        self._lock = threading.Lock()

    def alloc(self, size: int, label: str = "allocation", align: int = 1) -> Allocation:
        if size <= 0:
            raise OutOfRange(f"allocation {label!r}: size must be positive, got {size}")
        align = max(align, self.alignment)
        size = _align_up(size, 4)
        with self._lock:
            if size > self.block_size // 2:
                block = _Block(Buffer(self.device, size, self.kind, label=label), dedicated=True)
                self._blocks.append(block)
                offset = block.take(size, align)
            else:
                for block in self._blocks:
                    if not block.dedicated:
                        offset = block.take(size, align)
                        if offset is not None:
                            break
                else:
                    block = _Block(Buffer(self.device, self.block_size, self.kind,
                                          label=f"{self.label} block {len(self._blocks)}"), dedicated=False)
                    self._blocks.append(block)
                    offset = block.take(size, align)
        return Allocation(self, block, offset, size, label)

    def _free(self, allocation: Allocation) -> None:
        with self._lock:
            block = allocation.block
            if block not in self._blocks:  # allocator already closed
                return
            block.give(allocation.offset, allocation.size)
            if block.used == 0:
                spare = [b for b in self._blocks if b.used == 0 and not b.dedicated and b is not block]
                if block.dedicated or spare:  # keep one empty shared block for reuse
                    self._blocks.remove(block)
                    block.buffer.close()

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"blocks": len(self._blocks),
                    "reserved": sum(b.buffer.size for b in self._blocks),
                    "used": sum(b.used for b in self._blocks)}

    def _release(self) -> None:
        with self._lock:
            for block in self._blocks:
                block.buffer.close()
            self._blocks.clear()


def allocator(device, kind: MemoryKind = MemoryKind.DEVICE) -> Allocator:
    """The device's shared allocator for `kind`."""
    kind = MemoryKind(kind)
    return device.service(f"allocator:{kind.value}", lambda d: Allocator(d, kind))


def allocate(device, size: int, kind: MemoryKind = MemoryKind.DEVICE, label: str = "allocation") -> Allocation:
    return allocator(device, kind).alloc(size, label)
