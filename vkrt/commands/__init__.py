"""Command recording, barriers, submission, replay, timestamps; uploads and downloads."""

from .sequence import CommandSequence
from .transfer import download, upload

__all__ = ["CommandSequence", "download", "upload"]
