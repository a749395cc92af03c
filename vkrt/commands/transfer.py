"""Upload to and download from any buffer range: the device's shared Uploader on the transfer
queue (registered host memory copied directly, anything else through the staging ring)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .uploader import Upload, uploader


def upload(device, dst, data) -> None:
    """Copy host data (bytes or array) into the range `dst`, waiting until it has landed."""
    uploader(device).upload(dst, data).wait()


def upload_async(device, dst, data, waits: Sequence | None = None) -> Upload:
    """Start copying host data into `dst` on the transfer queue; wait on the returned Upload or
    pass it in `waits` to CommandSequence.submit. See Uploader.upload for when `data` may change."""
    return uploader(device).upload(dst, data, waits)


def download(device, src, dtype=np.uint8) -> np.ndarray:
    """A host copy of the range `src` as an array of `dtype`, after all submitted work finished."""
    return uploader(device).download(src, dtype)
