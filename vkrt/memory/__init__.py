"""Buffers, memory kinds, suballocation, GGML types and tensors."""

from .allocator import Allocation, Allocator, allocate, allocator
from .buffer import Buffer, BufferRange
from .ggml_types import BF16, F16, F32, I32, TYPES, GGMLType, ggml_type
from .host_import import HostRegion, HostRegistry, host_registry
from .imported import ImportedBuffer
from .memory_types import MemoryKind
from .tensor import Tensor

__all__ = ["Allocation", "Allocator", "BF16", "Buffer", "BufferRange", "F16", "F32", "GGMLType", "HostRegion",
           "HostRegistry", "I32", "ImportedBuffer", "MemoryKind", "TYPES", "Tensor", "allocate", "allocator",
           "ggml_type", "host_registry"]
