"""Buffers, memory kinds and suballocation."""

from .allocator import Allocation, Allocator, allocate, allocator
from .buffer import Buffer, BufferRange
from .memory_types import MemoryKind

__all__ = ["Allocation", "Allocator", "Buffer", "BufferRange", "MemoryKind", "allocate", "allocator"]
