"""Models: GGUF files (metadata, tensor table, tensor data)."""

from .gguf_file import GGUFFile, TensorInfo

__all__ = ["GGUFFile", "TensorInfo"]
