"""Prompts with images, as llama.cpp's mtmd builds them: the text is cut at each media marker,
each image framed by the projector's begin / end text (Qwen-VL: <|vision_start|> ...
<|vision_end|>) and stood for by its rows (ImageChunk). A MediaPrompt holds the token ids with
each image's tokens as placeholder ids derived from the image's hash (negative: no vocabulary
id), so that prompt reuse compares an image as its hash, as llama-server does, and a different
image never reuses another's cells."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from ..errors import VkrtError

MARKER = "<__media__>"   # mtmd's default media marker (vkrt run's; the server makes its own)


class MediaPromptError(VkrtError):
    """A prompt's media markers and images do not fit together; the message says how."""


@dataclass(frozen=True, eq=False)
class ImageChunk:
    """An encoded image: `rows` [n, n_embd] float32 (one an image token, raster order of the
    merged grid), `grid` (rows, columns) of image tokens and `digest` the sha256 of its file."""

    rows: np.ndarray
    grid: tuple[int, int]
    digest: str

    @property
    def n_tokens(self) -> int:
        return self.rows.shape[0]

    def n_pos(self, mrope: bool) -> int:
        """Rotary positions the image takes (mtmd_image_tokens_get_n_pos): max(grid) with
        Qwen's M-RoPE, else one a token."""
        return max(self.grid) if mrope else self.n_tokens

    def positions(self, pos0: int, mrope: bool) -> tuple[np.ndarray, np.ndarray]:
        """(rope [n, 3], after [n]) of its tokens starting at rotary position pos0: with M-RoPE
        (t, y, x) = (pos0, pos0 + row, pos0 + column) as mtmd's set_position_mrope_2d, else
        pos0 + i on each stream; `after`, the position of text that follows, pos0 + n_pos."""
        n, w = self.n_tokens, self.grid[1]
        i = np.arange(n, dtype=np.int32)
        if mrope:
            rope = np.stack([np.full(n, pos0, np.int32), pos0 + i // w, pos0 + i % w], axis=1)
        else:
            rope = np.repeat((pos0 + i)[:, None], 3, axis=1)
        return rope.astype(np.int32), np.full(n, pos0 + self.n_pos(mrope), np.int32)

    def placeholders(self) -> list[int]:
        """The ids its tokens stand as in a token list: negative, one a token, from the hash."""
        out = []
        for k in range(self.n_tokens):
            h = hashlib.sha256(f"{self.digest}:{k}".encode()).digest()
            out.append(-1 - (int.from_bytes(h[:4], "little") & 0x3FFFFFFF))
        return out


@dataclass
class MediaPrompt:
    """Token ids with each image's tokens as its placeholders, and where each image starts."""

    tokens: list[int]
    images: list[tuple[int, ImageChunk]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)

    def image_at(self, index: int) -> tuple[int, ImageChunk] | None:
        """(start, image) of the image whose tokens include `index`; None: a text token."""
        for start, img in self.images:
            if start <= index < start + img.n_tokens:
                return start, img
        return None

    def prefix(self, n: int) -> MediaPrompt:
        """The first n tokens (an image cut short keeps its rows: those past n are not read)."""
        return MediaPrompt(self.tokens[:n], [(s, img) for s, img in self.images if s < n])

    def text_run(self, index: int) -> int:
        """How many tokens from `index` on are text (up to the next image or the end)."""
        nxt = min([s for s, _ in self.images if s >= index] + [len(self.tokens)])
        return nxt - index if self.image_at(index) is None else 0

    @property
    def text_tokens(self) -> list[int]:
        return [t for t in self.tokens if t >= 0]


def split_at_markers(text: str, marker: str, n_images: int, what: str = "the prompt") -> list[str]:
    """The text between markers (n_images + 1 pieces); MediaPromptError when the count is off."""
    pieces = text.split(marker)
    if len(pieces) - 1 != n_images:
        raise MediaPromptError(f"{what} has {len(pieces) - 1} media marker(s) {marker!r} for {n_images} image(s): "
                               "give one marker an image")
    return pieces


def text_pieces(tokenizer, text: str, n_images: int, marker: str, frame: tuple[str, str],
                add_special: bool = True) -> list[list[int]]:
    """The tokens of the text around `n_images` markers (n_images + 1 lists), each image framed by
    frame (begin, end text), the pieces tokenised apart (special tokens parsed; BOS, with
    add_special, on the first only) as mtmd_tokenize does."""
    pieces = split_at_markers(text, marker, n_images)
    out = []
    for k, piece in enumerate(pieces):
        piece = (frame[1] if k > 0 else "") + piece + (frame[0] if k < n_images else "")
        out.append(tokenizer.encode(piece, add_special=add_special and k == 0) if piece else [])
    return out


def assemble(pieces: list[list[int]], images: list[ImageChunk]) -> MediaPrompt:
    """The MediaPrompt of text pieces (text_pieces) with images between them."""
    tokens: list[int] = []
    spans = []
    for k, piece in enumerate(pieces):
        tokens += piece
        if k < len(images):
            spans.append((len(tokens), images[k]))
            tokens += images[k].placeholders()
    return MediaPrompt(tokens, spans)


def media_prompt(tokenizer, text: str, images: list[ImageChunk], marker: str, frame: tuple[str, str],
                 add_special: bool = True) -> MediaPrompt:
    """The MediaPrompt of `text` with `images` at its markers (text_pieces, assemble)."""
    return assemble(text_pieces(tokenizer, text, len(images), marker, frame, add_special), images)
