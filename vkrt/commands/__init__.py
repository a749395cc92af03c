"""Command recording, barriers, submission, replay, timestamps; uploads and downloads."""

from .sequence import CommandSequence
from .tensor_io import read_tensor, tensor_from_numpy, write_tensor
from .transfer import download, upload

__all__ = ["CommandSequence", "download", "read_tensor", "tensor_from_numpy", "upload", "write_tensor"]
