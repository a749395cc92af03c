"""Models: GGUF files (metadata, tensor table, tensor data)."""

from .gguf_file import GGUFFile, TensorInfo
from .split_gguf import SplitGGUF, open_gguf

__all__ = ["GGUFFile", "SplitGGUF", "TensorInfo", "open_gguf"]
