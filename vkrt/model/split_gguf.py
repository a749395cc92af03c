"""Models split over several GGUF files by llama.cpp's gguf-split: NAME-00001-of-0000N.gguf holds
the metadata, each part some of the tensors and the keys split.no (from 0), split.count and
split.tensors.count. As with llama.cpp, the first part is the one to open; the others are found by
name. `open_gguf` opens a single file or a split model alike."""

from __future__ import annotations

import os

import numpy as np
from gguf.constants import Keys

from .gguf_file import GGUFFile
from .gguf_source import GGUFSource

SPLIT_NO = Keys.Split.LLM_KV_SPLIT_NO
SPLIT_COUNT = Keys.Split.LLM_KV_SPLIT_COUNT
SPLIT_TENSORS = Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT


def split_path(prefix: str, no: int, count: int) -> str:
    """The file name of part `no` (from 0) of `count`, as llama_split_path writes it."""
    return f"{prefix}-{no + 1:05d}-of-{count:05d}.gguf"


def split_prefix(path: str, no: int, count: int) -> str | None:
    """`path` without its -0000K-of-0000N.gguf ending for part `no` of `count`; None when the
    name does not end so."""
    suffix = split_path("", no, count)
    return path[:-len(suffix)] if path.endswith(suffix) and len(path) > len(suffix) else None


def _int_key(f: GGUFFile, key: str, required: bool = True) -> int | None:
    value = f.metadata.get(key)
    if value is None:
        if required:
            raise f._error(f"metadata key {key!r} is missing (every part of a split model has it)")
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise f._error(f"metadata {key!r} is {value!r}, expected an integer")
    return int(value)


def open_gguf(path: str | os.PathLike, *, mmap: bool = True, progress: bool | None = None) -> GGUFSource:
    """The GGUF model at `path`: a GGUFFile, or a SplitGGUF when `path` is the first part of a
    split model. With mmap=False the tensor data is read into memory once every header checks out."""
    first = GGUFFile(path, progress=progress)
    try:
        count = _int_key(first, SPLIT_COUNT, required=False) or 1
        if count <= 1:
            if not mmap:
                first.read_into_memory()
            return first
        return SplitGGUF(first, count, mmap=mmap)
    except BaseException:
        first.close()
        raise


class SplitGGUF(GGUFSource):
    """A split model: the first part's metadata and one tensor table over every part. Takes
    ownership of `first`; close() closes every part."""

    def __init__(self, first: GGUFFile, count: int, *, mmap: bool = True):
        self.path = first.path
        super().__init__(f"split gguf {os.path.basename(self.path)}")
        self.progress = first.progress
        self.mmap = mmap
        self.metadata = first.metadata
        self.value_types = first.value_types
        self.tensors = {}
        self._parts: list[GGUFFile] = []
        self._part_of: dict[str, GGUFFile] = {}
        try:
            self._open_parts(first, count)
            if not mmap:
                for part in self._parts:
                    part.read_into_memory()
        except BaseException:
            first.close()
            self.close()
            raise

    def _open_parts(self, first: GGUFFile, count: int) -> None:
        no = _int_key(first, SPLIT_NO)
        prefix = split_prefix(first.path, no, count)
        if no != 0:
            hint = f", {split_path(prefix, 0, count)}" if prefix is not None else ""
            raise first._error(f"this is part {no + 1} of {count} of a split model ({SPLIT_NO} = {no}); "
                               f"open the first part{hint}, which holds the metadata")
        if prefix is None:
            raise first._error(f"{SPLIT_COUNT} is {count} but the name does not end in "
                               f"{split_path('', 0, count)!r}, so the other parts cannot be found")
        expected = _int_key(first, SPLIT_TENSORS)
        self._parts.append(first)
        self._add_tensors(first)
        for no in range(1, count):
            path = split_path(prefix, no, count)
            if not os.path.exists(path):
                raise first._error(f"part {no + 1} of {count} of this split model is missing: no file {path}")
            part = GGUFFile(path, progress=self.progress)
            self._parts.append(part)
            for key, want in ((SPLIT_NO, no), (SPLIT_COUNT, count), (SPLIT_TENSORS, expected)):
                got = _int_key(part, key, required=key != SPLIT_TENSORS)
                if got is not None and got != want:
                    raise part._error(f"{key}: expected {want} (part {no + 1} of {count} of {first.path}), got {got}")
            self._add_tensors(part)
        if len(self.tensors) != expected:
            raise first._error(f"{SPLIT_TENSORS}: expected {expected} tensors, the {count} parts hold "
                               f"{len(self.tensors)}")

    def _add_tensors(self, part: GGUFFile) -> None:
        for name, info in part.tensors.items():
            if name in self._part_of:
                raise part._error(f"tensor {name!r} is also in {self._part_of[name].path}: a tensor may be in "
                                  "one part only")
            self._part_of[name] = part
            self.tensors[name] = info

    @property
    def parts(self) -> list[GGUFFile]:
        return list(self._parts)

    def part(self, name: str) -> GGUFFile:
        self.tensor(name)
        return self._part_of[name]

    def data(self, name: str) -> np.ndarray:
        return self.part(name).data(name)

    def _release(self) -> None:
        for part in reversed(self._parts):
            part.close()
        self._parts.clear()
