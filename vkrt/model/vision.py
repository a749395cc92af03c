"""Vision: a text model's image input from its llama.cpp projector file (--mmproj): the tower on
the GPU (VisionEncoder for Qwen-VL, SiglipEncoder for Gemma 3), checked against the text model,
turning image files into ImageChunks and prompts with media markers into MediaPrompts."""

from __future__ import annotations

import hashlib
import logging
import os

from ..errors import GGUFError
from ..owned import Owned
from ..units import fmt_bytes
from .image_input import ImageError, decode_image, preprocess
from .media_prompt import ImageChunk, MediaPrompt, media_prompt, split_at_markers
from .vision_config import GEMMA3, QWEN3VL, check_against_text
from .vision_memory import activation_bytes
from .vision_towers import open_encoder

# the text mtmd puts around an image's tokens, by projector type (tools/mtmd/mtmd.cpp)
FRAMES = {QWEN3VL: ("<|vision_start|>", "<|vision_end|>"), GEMMA3: ("<start_of_image>", "<end_of_image>")}
MAX_IMAGE_BYTES = 64 << 20   # an encoded image larger than this is refused unread

log = logging.getLogger("vkrt")


def check_projector(path: str) -> None:
    """A one-line GGUFError unless `path` is a readable file (before anything loads)."""
    if not os.path.isfile(path):
        raise GGUFError(f"{path}: no such vision projector file (--mmproj)")


class Vision(Owned):
    """The projector at `path` on `device` for the text model of config `cfg` (from `text_path`):
    its rows must be as wide as the text model's embeddings, and the projector of the text
    model's kind. `mrope`: images take Qwen's 2-D rotary positions (the text model's RoPE has
    sections). `bidirectional`: the text model reads an image's rows with attention among all
    of them (Gemma 3; media.read_image)."""

    def __init__(self, device, path: str | os.PathLike, cfg, text_path: str):
        path = os.fspath(path)
        check_projector(path)
        super().__init__(f"vision {os.path.basename(path)}")
        self.path = path
        self.encoder = open_encoder(device, path)
        try:
            check_against_text(self.encoder.cfg, cfg.n_embd, text_path, cfg.arch, cfg.pos_streams > 1)
        except BaseException:
            self.encoder.close()
            raise
        self.mrope = cfg.pos_streams > 1
        self.frame = FRAMES[self.encoder.cfg.projector]
        self.bidirectional = self.encoder.cfg.bidirectional
        vc = self.cfg
        log.info("vision projector %s: %s tower of %d layers, %s of weights, up to %d image tokens", path,
                 vc.projector, vc.n_layer, fmt_bytes(self.nbytes), vc.max_pixels // vc.align ** 2)

    @property
    def cfg(self):
        return self.encoder.cfg

    @property
    def nbytes(self) -> int:
        """VRAM the tower's weights take."""
        return sum(t.nbytes for t in self.encoder.w.values())

    @property
    def activation_bytes(self) -> int:
        """VRAM encoding the largest image the projector takes needs (held: the tower keeps the
        buffers of the last image size it encoded, vision_run)."""
        return activation_bytes(self.cfg, self.cfg.max_pixels // self.cfg.patch_size ** 2, self.encoder.device)

    def image(self, data: bytes, what: str) -> ImageChunk:
        """Encode the image file `data` (PNG, JPEG, WebP, GIF, BMP); ImageError naming `what`."""
        if len(data) > MAX_IMAGE_BYTES:
            raise ImageError(f"{what}: {len(data)} bytes is more than the {MAX_IMAGE_BYTES} an image may have")
        pixels = preprocess(decode_image(data, what), self.cfg)
        rows = self.encoder.encode(pixels)
        return ImageChunk(rows, self.encoder.grid(pixels), hashlib.sha256(data).hexdigest())

    def prompt(self, tokenizer, text: str, images: list[bytes], marker: str, add_special: bool = True,
               names: list[str] | None = None) -> MediaPrompt:
        """`text` with `images` (encoded files, named `names` in errors) at its markers."""
        names = names or [f"image {k}" for k in range(len(images))]
        split_at_markers(text, marker, len(images))   # before any image is encoded
        chunks = [self.image(data, name) for data, name in zip(images, names)]
        return media_prompt(tokenizer, text, chunks, marker, self.frame, add_special)

    def _release(self) -> None:
        if getattr(self, "encoder", None) is not None:
            self.encoder.close()
