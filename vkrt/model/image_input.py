"""Images for a vision projector: decoded with Pillow (checked: a clear error naming the image for
a corrupt, oversized or unsupported one), sized and resized as llama.cpp's mtmd prepares them
(Qwen-VL: both sides multiples of patch x merge, the area within the projector's pixel limits;
Gemma 3: the projector's image_size square; the aspect kept either way: clip's bilinear resize,
centred on black padding) and normalised with the file's mean and std, channel-first float32."""

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
    except UnidentifiedImageError:
        raise ImageError(f"{what}: not an image vkrt decodes ({', '.join(FORMATS)})") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageError(f"{what}: refused as a decompression bomb: {exc}") from None
    except (OSError, ValueError, SyntaxError) as exc:
        raise ImageError(f"{what}: the image data is corrupt: {exc}") from None
    return img.convert("RGB")


def fit_size(width: int, height: int, align: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """clip's calc_size_preserved_ratio (llama.cpp's "smart resize"): sides rounded to multiples of
    `align` (at least one), then scaled down (floored) past max_pixels or up (ceiled) below
    min_pixels, the aspect kept. Returns (width, height)."""
    def by(x: float, op) -> int:
        return int(op(np.float32(x) / np.float32(align))) * align

    def nearest(v: float) -> float:   # std::round: halves away from zero
        return math.floor(v + 0.5)
    h, w = max(align, by(height, nearest)), max(align, by(width, nearest))
    if h * w > max_pixels:
        beta = np.sqrt(np.float32(height * width) / np.float32(max_pixels))
        h, w = max(align, by(height / beta, math.floor)), max(align, by(width / beta, math.floor))
    elif h * w < min_pixels:
        beta = np.sqrt(np.float32(min_pixels) / np.float32(height * width))
        h, w = by(height * beta, math.ceil), by(width * beta, math.ceil)
    return w, h


def _bilinear(rgb: np.ndarray, width: int, height: int) -> np.ndarray:
    """clip's resize_bilinear: corners aligned (output pixel x samples x * (w - 1) / (width - 1)),
    float32 lerps, the result truncated to uint8 (llama.cpp b10434's, matched against its image
    embeddings). rgb [h, w, 3] uint8, at least 2 x 2."""
    h, w = rgb.shape[:2]

    def ratio(n_in: int, n_out: int) -> np.float32:
        return np.float32(n_in - 1) / np.float32(max(n_out - 1, 1))
    px = ratio(w, width) * np.arange(width, dtype=np.float32)
    py = ratio(h, height) * np.arange(height, dtype=np.float32)
    x0, y0 = np.minimum(px.astype(np.int64), w - 2), np.minimum(py.astype(np.int64), h - 2)
    tx = (px - x0.astype(np.float32))[None, :, None]   # float32 throughout, as clip's floats
    ty = (py - y0.astype(np.float32))[:, None, None]
    src = rgb.astype(np.float32)

    def lerp(a, b, t):
        return a + (b - a) * t
    top = lerp(src[y0][:, x0], src[y0][:, x0 + 1], tx)
    bottom = lerp(src[y0 + 1][:, x0], src[y0 + 1][:, x0 + 1], tx)
    return lerp(top, bottom, ty).astype(np.uint8)


def resize_padded(rgb: np.ndarray, width: int, height: int) -> np.ndarray:
    """clip's img_tool::resize with padding, as llama.cpp sizes Qwen-VL images: scaled to fit
    (bilinear), centred on black. rgb [h, w, 3] uint8 -> [height, width, 3]."""
    h, w = rgb.shape[:2]
    if (w, h) == (width, height):
        return rgb
    scale = min(np.float32(width) / np.float32(w), np.float32(height) / np.float32(h))
    nw = min(int(math.ceil(np.float32(w) * scale)), width)
    nh = min(int(math.ceil(np.float32(h) * scale)), height)
    out = np.zeros((height, width, 3), np.uint8)
    ox, oy = (width - nw) // 2, (height - nh) // 2
    out[oy:oy + nh, ox:ox + nw] = _bilinear(rgb, nw, nh)
    return out


def preprocess(img: Image.Image, vc: VisionConfig) -> np.ndarray:
    """The encoder's input of `img`: float32 [3, H, W], fitted (fit_size, or image_size square
    for a fixed-size projector; resize_padded) and normalised ((x / 255 - mean) / std per
    channel), as llama.cpp's mtmd prepares it."""
    if img.width < 2 or img.height < 2:
        raise ImageError(f"the image is {img.width}x{img.height} pixels: at least 2x2 are needed")
    if vc.fixed_size:   # mtmd_image_preprocessor_fixed_size
        width = height = vc.image_size
    else:
        width, height = fit_size(img.width, img.height, vc.align, vc.min_pixels, vc.max_pixels)
    rgb = resize_padded(np.asarray(img, dtype=np.uint8), width, height)
    x = rgb.astype(np.float32).transpose(2, 0, 1) / np.float32(255.0)
    mean = np.asarray(vc.mean, np.float32)[:, None, None]
    std = np.asarray(vc.std, np.float32)[:, None, None]
    return np.ascontiguousarray((x - mean) / std, dtype=np.float32)
