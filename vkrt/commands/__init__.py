"""Command recording, barriers, submission, replay, timestamps; uploads and downloads."""

from .sequence import CommandSequence, run_once
from .tensor_io import read_tensor, tensor_from_numpy, write_tensor
from .transfer import download, upload, upload_async
from .uploader import Upload, Uploader, uploader

__all__ = ["CommandSequence", "run_once", "Upload", "Uploader", "download", "read_tensor", "tensor_from_numpy", "upload",
           "upload_async", "uploader", "write_tensor"]
