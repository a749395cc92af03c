"""GGUFFile: a GGUF model file's metadata, tensor table and tensor data, validated on open.

Tensor data is memory-mapped (default) or, with mmap=False (`--no-mmap`), read into page-aligned
anonymous memory, which Vulkan drivers can import as host memory where they refuse file mappings.
Every problem raises a GGUFError naming the file and what is wrong. A model split over several
files (gguf-split) is opened by split_gguf.open_gguf, each part a GGUFFile.
"""

from __future__ import annotations

import math
import os
import struct
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.constants import GGUF_MAGIC
from tqdm import tqdm

from ..errors import GGUFError
from ..memory import GGMLType, ggml_type
from ..memory.anonymous import AnonymousRegion
from ..ops.quant import supported_types
from .gguf_reader import CheckedReader
from .gguf_source import GGUFSource

SUPPORTED_VERSIONS = (2, 3)
HEADER_BYTES = 24  # magic, version, tensor count, metadata count


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the tensor table: GGML sizes (ne[0] innermost) and where its bytes are."""

    name: str
    type: GGMLType
    ne: tuple[int, ...]
    offset: int   # absolute byte offset in the file
    nbytes: int

    @property
    def end(self) -> int:
        return self.offset + self.nbytes


def _progress(enabled: bool | None) -> bool:
    return sys.stderr.isatty() if enabled is None else enabled


class GGUFFile(GGUFSource):
    """An open GGUF file. `metadata` maps keys to Python values; `tensors` maps names to
    TensorInfo in file order. `array(name)` gives a tensor's bytes without copying; `upload`
    makes device tensors. close() releases the mapping or the anonymous copy."""

    def __init__(self, path: str | os.PathLike, *, mmap: bool = True, progress: bool | None = None):
        self.path = os.fspath(path)
        super().__init__(f"gguf {os.path.basename(self.path)}")
        self.mmap = True
        self.progress = _progress(progress)
        self._map = self._region = None
        try:
            self._open()
            if not mmap:
                self.read_into_memory()
        except BaseException:
            self.close()
            raise

    def _open(self) -> None:
        self.file_size = self._check_header()
        reader = self._parse()
        self.alignment = int(reader.alignment)
        self.data_offset = int(reader.data_offset)
        self.metadata: dict[str, Any] = {}
        self.value_types: dict[str, list] = {}
        for key, field in reader.fields.items():
            if key.startswith("GGUF."):
                continue
            try:
                strings = reader.string_arrays.get(key)
                self.metadata[key] = strings if strings is not None else field.contents()
            except UnicodeDecodeError as exc:
                raise self._error(f"metadata {key!r} is not valid UTF-8 ({exc})") from None
            self.value_types[key] = list(field.types)
        self.tensors: dict[str, TensorInfo] = self._validate(reader)
        self._map = reader.data

    # -- opening ---------------------------------------------------------------------------------
    def _check_header(self) -> int:
        try:
            size = os.path.getsize(self.path)
            with open(self.path, "rb") as f:
                head = f.read(8)
        except OSError as exc:
            raise self._error(f"cannot read the file ({exc.strerror or exc})") from None
        if size < 4 or struct.unpack("<I", head[:4])[0] != GGUF_MAGIC:
            raise self._error(f"not a GGUF file: it starts with {head[:4]!r}, a GGUF file with b'GGUF'")
        if size < HEADER_BYTES:
            raise self._error(f"truncated: {size} bytes, a GGUF header alone takes {HEADER_BYTES}")
        version = struct.unpack("<I", head[4:8])[0]
        if version & 0xFFFF == 0 and version:
            raise self._error("big-endian GGUF files are not supported")
        if version not in SUPPORTED_VERSIONS:
            raise self._error(f"unsupported GGUF version {version}; vkrt reads versions "
                              f"{', '.join(map(str, SUPPORTED_VERSIONS))}")
        return size

    def _parse(self) -> CheckedReader:
        try:
            return CheckedReader(self.path)
        except GGUFError:
            raise
        except (ValueError, KeyError, IndexError, UnicodeDecodeError, OverflowError) as exc:
            raise self._error(f"corrupt header: {exc}") from None

    def _validate(self, reader: CheckedReader) -> dict[str, TensorInfo]:
        tensors: dict[str, TensorInfo] = {}
        names = ", ".join(t.name for t in supported_types())
        for raw in reader.infos:
            what = f"tensor {raw.name!r}"
            if raw.name in tensors:
                raise self._error(f"{what} appears twice in the tensor table")
            try:
                qtype = GGMLQuantizationType(raw.type_id)
            except ValueError:
                raise self._error(f"{what} has unknown GGML type id {raw.type_id}; supported types: {names}") from None
            typ = ggml_type(qtype)
            if not typ.glsl:
                raise self._error(f"{what} has type {typ.name}, which vkrt does not support; supported types: {names}")
            if not raw.dims or any(d < 1 for d in raw.dims):
                raise self._error(f"{what} has dimensions {list(raw.dims)}; each must be at least 1")
            block, size = GGML_QUANT_SIZES[qtype]
            if raw.dims[0] % block:
                raise self._error(f"{what} ({typ.name}) has ne[0] = {raw.dims[0]}, not a multiple of the "
                                  f"{typ.name} block size {block}")
            nbytes = math.prod(raw.dims) // block * size
            start = self.data_offset + raw.offset
            if raw.offset % self.alignment:
                raise self._error(f"{what}: data offset {raw.offset} is not a multiple of the file's alignment "
                                  f"{self.alignment}")
            if start + nbytes > self.file_size:
                raise self._error(f"{what} ({typ.name}{list(raw.dims)}, {nbytes} bytes) needs bytes [{start}, "
                                  f"{start + nbytes}) but the file has {self.file_size}: truncated or a bad offset")
            tensors[raw.name] = TensorInfo(raw.name, typ, raw.dims, start, nbytes)
        ordered = sorted(tensors.values(), key=lambda t: t.offset)
        for a, b in zip(ordered, ordered[1:]):
            if b.offset < a.end:
                raise self._error(f"tensors {a.name!r} [{a.offset}, {a.end}) and {b.name!r} [{b.offset}, {b.end}) "
                                  "overlap")
        return tensors

    def read_into_memory(self) -> None:
        """`--no-mmap`: copy the data section into page-aligned anonymous memory and drop the
        mapping (a split model does this once every part's header checks out)."""
        if self._region is not None:
            return
        size = self.file_size - self.data_offset
        self._map = None
        with tqdm(total=size, unit="B", unit_scale=True, desc=f"reading {os.path.basename(self.path)}",
                  disable=not self.progress, leave=False) as bar:
            try:
                self._region = AnonymousRegion(self.path, self.data_offset, size, progress=bar.update)
            except Exception as exc:
                raise self._error(f"reading the tensor data failed: {exc}") from None
        self.mmap = False

    @property
    def parts(self) -> list[GGUFFile]:
        return [self]

    def part(self, name: str) -> GGUFFile:
        self.tensor(name)
        return self

    # -- data ------------------------------------------------------------------------------------
    @property
    def region(self) -> AnonymousRegion | None:
        """With mmap=False: the page-aligned anonymous copy of the data section (from byte
        `data_offset` of the file), which host-memory import can register."""
        return self._region

    def data(self, name: str) -> np.ndarray:
        """The tensor's bytes as a flat uint8 array (a view, valid until close())."""
        if self.closed:
            raise self._error("the file is closed")
        t = self.tensor(name)
        if self._map is not None:
            return self._map[t.offset:t.end].view(np.uint8)
        start = t.offset - self.data_offset
        return self._region.array[start:start + t.nbytes]

    def _release(self) -> None:
        self._map = None
        if self._region is not None:
            self._region.close()
            self._region = None

