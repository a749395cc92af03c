"""The vision tower of a projector file, by its clip.projector_type: VisionEncoder (Qwen-VL) or
SiglipEncoder (Gemma 3)."""

from __future__ import annotations

import os

from .gguf_file import GGUFFile
from .vision_config import GEMMA3, vision_config
from .vision_encoder import VisionEncoder
from .vision_siglip import SiglipEncoder


def open_encoder(device, path: str | os.PathLike):
    """The tower of the mmproj file at `path` on `device` (GGUFError naming the file for one
    vkrt cannot run)."""
    path = os.fspath(path)
    with GGUFFile(path, progress=False) as f:
        projector = vision_config(path, f.metadata, f.tensors).projector
    return SiglipEncoder(device, path) if projector == GEMMA3 else VisionEncoder(device, path)
