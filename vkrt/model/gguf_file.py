"""GGUFFile: a GGUF model file's metadata, tensor table and tensor data, validated on open.

Tensor data is memory-mapped (default) or, with mmap=False (`--no-mmap`), read into page-aligned
anonymous memory, which Vulkan drivers can import as host memory where they refuse file mappings.
Every problem raises a GGUFError naming the file and what is wrong.
"""

from __future__ import annotations

import math
import os
import struct
import sys
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.constants import GGUF_MAGIC
from gguf.quants import dequantize
from tqdm import tqdm

from ..commands import write_tensor
from ..errors import GGUFError
from ..memory import GGMLType, MemoryKind, Tensor, ggml_type
from ..memory.anonymous import AnonymousRegion
from ..ops.quant import supported_types
from ..owned import Owned
from .gguf_reader import CheckedReader

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


class GGUFFile(Owned):
    """An open GGUF file. `metadata` maps keys to Python values; `tensors` maps names to
    TensorInfo in file order. `array(name)` gives a tensor's bytes without copying; `upload`
    makes device tensors. close() releases the mapping or the anonymous copy."""

    def __init__(self, path: str | os.PathLike, *, mmap: bool = True, progress: bool | None = None):
        self.path = os.fspath(path)
        super().__init__(f"gguf {os.path.basename(self.path)}")
        self.mmap = mmap
        self.progress = _progress(progress)
        self._map = self._region = None
        try:
            self._open()
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
        if self.mmap:
            self._map = reader.data
        else:
            del reader  # drop the header mapping before the copy
            self._read_anonymous()

    # -- opening ---------------------------------------------------------------------------------
    def _error(self, message: str) -> GGUFError:
        return GGUFError(f"{self.path}: {message}")

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

    def _read_anonymous(self) -> None:
        size = self.file_size - self.data_offset
        with tqdm(total=size, unit="B", unit_scale=True, desc=f"reading {os.path.basename(self.path)}",
                  disable=not self.progress, leave=False) as bar:
            try:
                self._region = AnonymousRegion(self.path, self.data_offset, size, progress=bar.update)
            except Exception as exc:
                raise self._error(f"reading the tensor data failed: {exc}") from None

    # -- metadata --------------------------------------------------------------------------------
    @property
    def architecture(self) -> str | None:
        return self.metadata.get("general.architecture")

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def __getitem__(self, key: str) -> Any:
        if key not in self.metadata:
            raise self._error(f"metadata key {key!r} is missing")
        return self.metadata[key]

    def require(self, keys: Iterable[str] = (), tensors: Iterable[str] = ()) -> None:
        """Raise one GGUFError listing every missing metadata key and tensor."""
        missing_keys = [k for k in keys if k not in self.metadata]
        missing_tensors = [t for t in tensors if t not in self.tensors]
        parts = []
        if missing_keys:
            parts.append(f"metadata key(s) {', '.join(map(repr, missing_keys))}")
        if missing_tensors:
            parts.append(f"tensor(s) {', '.join(map(repr, missing_tensors))}")
        if parts:
            arch = f" ({self.architecture} model)" if self.architecture else ""
            raise self._error(f"missing {' and '.join(parts)}{arch}")

    def tensor(self, name: str) -> TensorInfo:
        if name not in self.tensors:
            raise self._error(f"no tensor {name!r}")
        return self.tensors[name]

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

    def array(self, name: str) -> np.ndarray:
        """Plain types: elements of numpy shape (ne[n-1], ..., ne[0]); BF16 as uint16 bit patterns.
        Quantised types: uint8 blocks of shape (ne[n-1], ..., ne[1], row bytes), as gguf.quants takes."""
        t = self.tensor(name)
        raw = self.data(name)
        shape = tuple(reversed(t.ne))
        if t.type.quantized:
            return raw.reshape(shape[:-1] + (t.type.row_bytes(t.ne[0]),))
        return raw.view(t.type.dtype).reshape(shape)

    def dequantize(self, name: str) -> np.ndarray:
        """The tensor as float32 on the host, computed by gguf.quants (the reference)."""
        t = self.tensor(name)
        return dequantize(self.array(name), GGMLQuantizationType(t.type.id)).reshape(tuple(reversed(t.ne)))

    def upload(self, device, names: Iterable[str] | None = None,
               kind: MemoryKind = MemoryKind.DEVICE, together: Iterable[Sequence[str]] = ()) -> dict[str, Tensor]:
        """New device tensors holding `names` (default: every tensor), with a progress bar. Each
        group in `together` whose tensors are all uploaded shares one allocation (the first tensor
        owns it), so that one binding can cover them (a gated FFN's gate and up weights)."""
        names = list(self.tensors if names is None else names)
        infos = [self.tensor(n) for n in names]
        wanted = set(names)
        group_of = {g[0]: g for g in together if all(n in wanted for n in g)}
        out: dict[str, Tensor] = {}
        with tqdm(total=sum(t.nbytes for t in infos), unit="B", unit_scale=True,
                  desc=f"uploading {os.path.basename(self.path)}", disable=not self.progress, leave=False) as bar:
            try:
                for t in infos:
                    if t.name in out:
                        continue
                    group = group_of.get(t.name, (t.name,))
                    if len(group) > 1:
                        infos_g = [self.tensor(n) for n in group]
                        out.update((t.name, dev_t) for t, dev_t in zip(infos_g, Tensor.empty_group(
                            device, [(t.type, t.ne, t.name) for t in infos_g], kind, GROUP_ALIGN)))
                    else:
                        out[t.name] = Tensor.empty(device, t.type, t.ne, name=t.name, kind=kind)
                    for name in group:
                        write_tensor(out[name], self.array(name))
                        bar.update(self.tensor(name).nbytes)
            except BaseException:
                for dev_t in out.values():
                    dev_t.close()
                raise
        return out

    def _release(self) -> None:
        self._map = None
        if self._region is not None:
            self._region.close()
            self._region = None


GROUP_ALIGN = 256   # tensors after the first of a shared allocation start at a multiple of this
