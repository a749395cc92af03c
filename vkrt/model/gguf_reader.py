"""gguf.GGUFReader with every read bounds-checked, so a broken file fails fast with a GGUFError
that names the file, the byte offset and what was being read (instead of an IndexError deep in
numpy, or a loop over a corrupt count of billions), and without building tensor data views."""

from __future__ import annotations

import struct
from typing import NamedTuple

import numpy as np
from gguf import GGUFReader, GGUFValueType

from ..errors import GGUFError

# smallest encoding of one item, to reject counts the rest of the file cannot hold
_MIN_KV = 8 + 4 + 1          # key length, value type, a 1-byte value
_MIN_TENSOR_INFO = 8 + 4 + 4 + 8   # name length, n_dims, type, offset
_SCALAR_SIZE = {GGUFValueType.UINT8: 1, GGUFValueType.INT8: 1, GGUFValueType.BOOL: 1, GGUFValueType.UINT16: 2,
                GGUFValueType.INT16: 2, GGUFValueType.UINT32: 4, GGUFValueType.INT32: 4, GGUFValueType.FLOAT32: 4,
                GGUFValueType.UINT64: 8, GGUFValueType.INT64: 8, GGUFValueType.FLOAT64: 8,
                GGUFValueType.STRING: 8, GGUFValueType.ARRAY: 12}
MAX_DIMS = 4


class RawTensorInfo(NamedTuple):
    name: str
    dims: tuple[int, ...]
    type_id: int
    offset: int        # relative to the start of the data section
    header_offset: int  # where its entry in the tensor table starts


class CheckedReader(GGUFReader):
    """Parses the header of `path`; `infos` holds the tensor table unvalidated."""

    def __init__(self, path: str):
        self.path = path
        self.infos: list[RawTensorInfo] = []
        self._what = "the header"
        # arrays of strings (a vocabulary: 262144 for Gemma 3), decoded in one pass; the base
        # reader would make two numpy views per string, which takes seconds
        self.string_arrays: dict[str, list[str]] = {}
        self._pending_strings: list[str] | None = None
        super().__init__(path, "r")

    def fail(self, message: str) -> GGUFError:
        return GGUFError(f"{self.path}: {message}")

    def _get(self, offset, dtype, count=1, override_order=None):
        itemsize = np.dtype(dtype).itemsize
        end = int(offset) + itemsize * int(count)
        if end > len(self.data):
            raise self.fail(f"truncated: reading {self._what} needs bytes up to {end}, but the file ends at "
                            f"{len(self.data)}")
        return super()._get(offset, dtype, count, override_order)

    def _check_count(self, count: int, each: int, offs: int, what: str) -> None:
        room = len(self.data) - offs
        if int(count) * each > room:
            raise self.fail(f"truncated or corrupt: {what} count {int(count)} at byte {offs} needs at least "
                            f"{int(count) * each} bytes; the file has {room} left")

    def _build_fields(self, offs: int, count: int) -> int:
        self._check_count(count, _MIN_KV, offs, "metadata key/value")
        for i in range(int(count)):
            self._what = f"metadata entry {i} of {int(count)} (at byte {offs})"
            self._pending_strings = None
            try:
                offs = super()._build_fields(offs, 1)
            except UnicodeDecodeError:
                raise self.fail(f"corrupt metadata: the key of {self._what} is not valid UTF-8") from None
            if self._pending_strings is not None:
                self.string_arrays[next(reversed(self.fields))] = self._pending_strings
        return offs

    def _get_field_parts(self, orig_offs: int, raw_type: int):
        try:
            gtype = GGUFValueType(int(raw_type))
        except ValueError:
            raise self.fail(f"corrupt metadata: unknown value type {int(raw_type)} in {self._what}") from None
        if gtype == GGUFValueType.ARRAY:
            item = int(self._get(orig_offs, np.uint32)[0])
            length = int(self._get(orig_offs + 4, np.uint64)[0])
            try:
                each = _SCALAR_SIZE[GGUFValueType(item)]
            except ValueError:
                raise self.fail(f"corrupt metadata: unknown array item type {item} in {self._what}") from None
            self._check_count(length, each, orig_offs + 12, "array item")
            if item == GGUFValueType.STRING:
                return self._string_array(orig_offs, length)
            nptype = self.gguf_scalar_to_np.get(GGUFValueType(item))
            if nptype is not None:  # all values as one part, not one part per value
                values = self._get(orig_offs + 12, nptype, length)
                parts = [self._get(orig_offs, np.uint32), self._get(orig_offs + 4, np.uint64), values]
                return 12 + int(values.nbytes), parts, [2], [GGUFValueType.ARRAY, GGUFValueType(item)]
        return super()._get_field_parts(orig_offs, raw_type)

    def _string_array(self, orig_offs: int, length: int):
        buf = memoryview(self.data)
        end = len(self.data)
        pos = orig_offs + 12
        strings = []
        for i in range(length):
            if pos + 8 > end:
                raise self.fail(f"truncated: string {i} of {length} in {self._what} starts past the end of the file")
            (n,) = struct.unpack_from("<Q", buf, pos)
            if pos + 8 + n > end:
                raise self.fail(f"truncated: string {i} of {length} in {self._what} needs bytes up to {pos + 8 + n}, "
                                f"but the file ends at {end}")
            try:
                strings.append(str(buf[pos + 8:pos + 8 + n], "utf-8"))
            except UnicodeDecodeError:
                raise self.fail(f"metadata string {i} of {self._what} is not valid UTF-8") from None
            pos += 8 + n
        self._pending_strings = strings
        parts = [self._get(orig_offs, np.uint32), self._get(orig_offs + 4, np.uint64),
                 self._get(orig_offs + 12, np.uint8, pos - orig_offs - 12)]
        return pos - orig_offs, parts, [2], [GGUFValueType.ARRAY, GGUFValueType.STRING]

    def _build_tensor_info(self, offs: int, count: int):
        self._check_count(count, _MIN_TENSOR_INFO, offs, "tensor")
        fields = []
        for i in range(int(count)):
            self._what = f"tensor table entry {i} of {int(count)} (at byte {offs})"
            name_len = int(self._get(offs, np.uint64)[0])
            n_dims = int(self._get(offs + 8 + name_len, np.uint32)[0])
            if n_dims > MAX_DIMS:
                name = bytes(self._get(offs + 8, np.uint8, name_len)).decode("utf-8", "replace")
                raise self.fail(f"tensor {name!r} has {n_dims} dimensions; GGML tensors have at most {MAX_DIMS}")
            try:
                field = self._get_tensor_info_field(offs)
            except UnicodeDecodeError:
                raise self.fail(f"corrupt tensor table: the name of {self._what} is not valid UTF-8") from None
            fields.append((offs, field))
            offs += sum(int(part.nbytes) for part in field.parts)
        self._what = "the header"
        return offs, fields

    def _build_tensors(self, start_offs: int, fields) -> None:
        for header_offset, field in fields:
            _, name_data, _, dims, raw_type, offset = field.parts
            name = bytes(name_data).decode("utf-8", "replace")
            self.infos.append(RawTensorInfo(name, tuple(int(d) for d in dims), int(raw_type[0]), int(offset[0]),
                                            header_offset))
        self.tensors = []
