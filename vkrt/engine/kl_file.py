"""llama-perplexity's logits file (--kl-divergence-base): the base model's log-probabilities.

Layout, little-endian, as llama.cpp writes it:
    b"_logits_", int32 n_ctx, int32 n_vocab, int32 n_chunk, int32 tokens[n_chunk * n_ctx],
    then per chunk n_ctx - 1 - n_ctx // 2 rows (the scored second half) of nv = 2 * ceil(n_vocab / 2) + 4
    uint16: float32 scale, float32 min_log_prob, n_vocab codes (padded to even), where a token's
    log-probability is scale * code + min_log_prob (codes cover at most 16 nats below the best).
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from ..errors import VkrtError

MAGIC = b"_logits_"
HEADER = struct.Struct("<iii")   # n_ctx, n_vocab, n_chunk


class LogitsFileError(VkrtError):
    """A logits file that cannot be read or does not fit the model; names the file and field."""


def row_words(n_vocab: int) -> int:
    """uint16 words of one stored row: scale and minimum (two float32), the codes padded to even."""
    return 2 * ((n_vocab + 1) // 2) + 4


def scored_rows(n_ctx: int) -> int:
    """Rows scored per chunk: positions n_ctx // 2 .. n_ctx - 2 (each predicts the next token)."""
    return n_ctx - 1 - n_ctx // 2


def encode_rows(logits: np.ndarray) -> np.ndarray:
    """llama.cpp's compressed log-softmax of each row of `logits` [n, n_vocab] (float32
    arithmetic as its writer): [n, row_words(n_vocab)] uint16."""
    logits = np.ascontiguousarray(logits, np.float32)
    n, n_vocab = logits.shape
    hi = logits.max(axis=1)
    lo = np.maximum(logits.min(axis=1), hi - np.float32(16))
    sum_exp = np.exp(logits - hi[:, None]).sum(axis=1, dtype=np.float64)
    log_sum_exp = np.log(sum_exp).astype(np.float32)
    min_log_prob = (lo - hi) - log_sum_exp
    scale = (hi - lo) / np.float32(65535)
    out = np.zeros((n, row_words(n_vocab)), np.uint16)
    head = out[:, :4].view(np.float32)
    head[:, 0], head[:, 1] = scale, min_log_prob
    live = scale != 0   # a flat row keeps zero codes
    with np.errstate(divide="ignore"):
        inv = np.float32(1) / scale[live]
    z = logits[live]
    codes = np.rint(inv[:, None] * (z - lo[live][:, None])).astype(np.int64).astype(np.uint16)
    out[live, 4:4 + n_vocab] = np.where(z > lo[live][:, None], codes, np.uint16(0))
    return out


def decode_rows(rows: np.ndarray, n_vocab: int) -> np.ndarray:
    """The stored log-probabilities of encoded rows: [n, n_vocab] float32."""
    head = np.ascontiguousarray(rows[:, :4]).view(np.float32)
    return head[:, :1] * rows[:, 4:4 + n_vocab].astype(np.float32) + head[:, 1:2]


class LogitsWriter:
    """Writes a logits file: the header and tokens first, then each chunk's scored rows."""

    def __init__(self, path: str, n_ctx: int, n_vocab: int, n_chunk: int, tokens: np.ndarray):
        self.path, self.n_ctx, self.n_vocab = path, n_ctx, n_vocab
        try:
            self._f = open(path, "wb")
        except OSError as exc:
            raise LogitsFileError(f"failed to open {path} for writing: {exc.strerror}") from None
        self._f.write(MAGIC + HEADER.pack(n_ctx, n_vocab, n_chunk))
        self._f.write(np.asarray(tokens[:n_chunk * n_ctx], "<i4").tobytes())

    def write_chunk(self, logits: np.ndarray) -> None:
        if logits.shape != (scored_rows(self.n_ctx), self.n_vocab):
            raise LogitsFileError(f"{self.path}: a chunk takes {scored_rows(self.n_ctx)} rows of {self.n_vocab} "
                                  f"logits, got {logits.shape}")
        self._f.write(encode_rows(logits).astype("<u2").tobytes())

    def close(self) -> None:
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class LogitsReader:
    """Reads a logits file: header and tokens checked on opening (against `n_vocab` when
    given), chunks one by one."""

    def __init__(self, path: str, n_vocab: int | None = None):
        self.path = path
        try:
            self._f = open(path, "rb")
        except OSError as exc:
            raise LogitsFileError(f"failed to open {path}: {exc.strerror}") from None
        try:
            self._read_header(n_vocab)
        except BaseException:
            self._f.close()
            raise

    def _read_header(self, expect_vocab: int | None) -> None:
        path = self.path
        if self._f.read(len(MAGIC)) != MAGIC:
            raise LogitsFileError(f"{path} does not look like a file containing log-probabilities "
                                  f"(it does not start with {MAGIC.decode()})")
        raw = self._f.read(HEADER.size)
        if len(raw) < HEADER.size:
            raise LogitsFileError(f"{path}: failed reading n_ctx, n_vocab, n_chunk (the file ends after "
                                  f"{len(MAGIC) + len(raw)} bytes)")
        self.n_ctx, self.n_vocab, self.n_chunk = HEADER.unpack(raw)
        for field, value, least in (("n_ctx", self.n_ctx, 3), ("n_vocab", self.n_vocab, 1),
                                    ("n_chunk", self.n_chunk, 1)):
            if value < least:
                raise LogitsFileError(f"{path}: {field} is {value}, expected at least {least} (a corrupt header)")
        if expect_vocab is not None and self.n_vocab != expect_vocab:
            raise LogitsFileError(f"{path}: inconsistent vocabulary: n_vocab is {self.n_vocab} in the file, "
                                  f"the model has {expect_vocab} tokens")
        size = Path(path).stat().st_size
        n_tok = self.n_ctx * self.n_chunk
        want = len(MAGIC) + HEADER.size + 4 * n_tok + 2 * self.n_chunk * scored_rows(self.n_ctx) * row_words(
            self.n_vocab)
        if size != want:
            raise LogitsFileError(f"{path}: {size} bytes, but n_ctx {self.n_ctx}, n_vocab {self.n_vocab} and "
                                  f"n_chunk {self.n_chunk} make {want} (truncated or corrupt)")
        self.tokens = np.frombuffer(self._f.read(4 * n_tok), "<i4").astype(np.int32)
        bad = (self.tokens < 0) | (self.tokens >= self.n_vocab)
        if bad.any():
            i = int(np.argmax(bad))
            raise LogitsFileError(f"{path}: token {i} is {int(self.tokens[i])}, outside the vocabulary of "
                                  f"{self.n_vocab}")

    def read_chunk(self, i: int) -> np.ndarray:
        """The encoded rows of chunk i (read in order): [scored_rows(n_ctx), row_words(n_vocab)] uint16."""
        rows, words = scored_rows(self.n_ctx), row_words(self.n_vocab)
        raw = self._f.read(2 * rows * words)
        if len(raw) < 2 * rows * words:
            raise LogitsFileError(f"{self.path}: failed reading log-probs for chunk {i}")
        return np.frombuffer(raw, "<u2").reshape(rows, words)

    def close(self) -> None:
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
