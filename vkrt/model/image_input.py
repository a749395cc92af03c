"""Images for a vision projector: decoded with Pillow (checked: a clear error naming the image for
a corrupt, oversized or unsupported one), resized as tools/mtmd/clip.cpp sizes Qwen-VL images
(both sides multiples of patch x merge, the area within the projector's pixel limits, the aspect
kept) and normalised with the file's mean and std, channel-first float32."""

from __future__ import annotations

import io
import math
import warnings

import numpy as np
from PIL import Image, UnidentifiedImageError

from ..errors import VkrtError
from .vision_config import VisionConfig

MAX_SOURCE_PIXELS = 64 << 20   # a larger source image is refused before it is decoded
FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")


class ImageError(VkrtError):
    """An image that cannot be used; the message names it."""


def decode_image(data: bytes, what: str) -> Image.Image:
    """The RGB image of encoded bytes `data` (PNG, JPEG, WebP, GIF, BMP); ImageError naming `what`."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data), formats=FORMATS)
            w, h = img.size
            if w * h > MAX_SOURCE_PIXELS:
                raise ImageError(f"{what}: {w}x{h} pixels is more than the {MAX_SOURCE_PIXELS} vkrt decodes")
            img.load()
    except ImageError:
        raise
    except (UnidentifiedImageError, Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageError(f"{what}: not a decodable image ({', '.join(FORMATS)}): {exc}") from None
    except (OSError, ValueError, SyntaxError) as exc:
        raise ImageError(f"{what}: the image data is corrupt: {exc}") from None
    return img.convert("RGB")


def fit_size(width: int, height: int, align: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """clip.cpp's calc_size_preserved_ratio: sides rounded up to multiples of `align`, then scaled
    down (floored) past max_pixels or up (ceiled) below min_pixels. Returns (width, height)."""
    def ceil_by(x: float) -> int:
        return int(math.ceil(x / align)) * align

    def floor_by(x: float) -> int:
        return int(math.floor(x / align)) * align
    h, w = max(align, ceil_by(height)), max(align, ceil_by(width))
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h, w = max(align, floor_by(height / beta)), max(align, floor_by(width / beta))
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h, w = ceil_by(height * beta), ceil_by(width * beta)
    return w, h


def preprocess(img: Image.Image, vc: VisionConfig) -> np.ndarray:
    """The encoder's input of `img`: float32 [3, H, W], resized (bicubic) to fit_size and
    normalised ((x / 255 - mean) / std per channel)."""
    size = fit_size(img.width, img.height, vc.align, vc.min_pixels, vc.max_pixels)
    if size != img.size:
        img = img.resize(size, Image.Resampling.BICUBIC)
    x = np.asarray(img, dtype=np.float32).transpose(2, 0, 1) / np.float32(255.0)
    mean = np.asarray(vc.mean, np.float32)[:, None, None]
    std = np.asarray(vc.std, np.float32)[:, None, None]
    return np.ascontiguousarray((x - mean) / std, dtype=np.float32)
