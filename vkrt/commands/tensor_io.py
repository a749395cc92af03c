"""numpy <-> Tensor round trips (for tests, loading, and inspection)."""

from __future__ import annotations

import numpy as np

from ..errors import GGMLTypeError, OutOfRange
from ..memory import F16, F32, I32, MemoryKind, Tensor, ggml_type
from .transfer import download, upload

_FROM_DTYPE = {np.dtype(np.float32): F32, np.dtype(np.float16): F16, np.dtype(np.int32): I32}


def tensor_from_numpy(device, array: np.ndarray, typ=None, name: str = "",
                      kind: MemoryKind = MemoryKind.DEVICE) -> Tensor:
    """A new contiguous tensor holding `array` (numpy shape (n3, n2, n1, n0) -> ne (n0, n1, n2, n3)).
    For block-quantised `typ`, pass the raw blocks as uint8 of shape (..., rows, row_bytes)
    together with the element shape in `typ`'s terms via write_tensor instead."""
    array = np.asarray(array)
    typ = ggml_type(typ) if typ is not None else _FROM_DTYPE.get(array.dtype)
    if typ is None:
        raise GGMLTypeError(f"no GGML type for numpy dtype {array.dtype}; pass typ=")
    if typ.quantized:
        raise GGMLTypeError(f"{typ.name} is block-quantised: create the tensor with Tensor.empty and write_tensor")
    t = Tensor.empty(device, typ, tuple(reversed(array.shape)) or (1,), name=name, kind=kind)
    write_tensor(t, array)
    return t


def _host_view(t: Tensor, raw: np.ndarray) -> np.ndarray:
    """A strided numpy view of `raw` (the tensor's span) with the tensor's geometry."""
    if t.type.quantized:
        row = t.type.row_bytes(t.ne[0])
        shape = (t.ne[3], t.ne[2], t.ne[1], row)
        strides = (t.nb[3], t.nb[2], t.nb[1], 1)
        return np.lib.stride_tricks.as_strided(raw, shape=shape, strides=strides)
    view = raw.view(t.type.dtype) if t.span % t.type.type_size == 0 else None
    if view is None or any(s % t.type.type_size for s in t.nb):
        raise OutOfRange(f"{t!r}: strides are not multiples of the element size")
    full = np.lib.stride_tricks.as_strided(view, shape=tuple(reversed(t.ne)), strides=tuple(reversed(t.nb)))
    return full.reshape(t.shape)


def read_tensor(t: Tensor) -> np.ndarray:
    """The tensor's elements as a new numpy array of shape t.shape (raw uint8 blocks of shape
    (ne3, ne2, ne1, row_bytes) for quantised types; uint16 bit patterns for BF16)."""
    device = t.buffer.device
    raw = download(device, t.range(), np.uint8)
    return _host_view(t, raw).copy()


def write_tensor(t: Tensor, array) -> None:
    """Store `array` (shape t.shape, or anything with the same number of elements) into `t`."""
    device = t.buffer.device
    array = np.asarray(array)
    if t.is_contiguous():
        expect = t.nbytes
        data = np.ascontiguousarray(array, dtype=None if t.type.quantized else t.type.dtype)
        if data.nbytes != expect:
            raise OutOfRange(f"writing {data.nbytes} bytes into {t!r}, which holds {expect}")
        upload(device, t.range(), data)
        return
    raw = download(device, t.range(), np.uint8)  # keep the bytes between strided elements
    view = _host_view(t, raw)
    view[...] = np.asarray(array, dtype=view.dtype).reshape(view.shape)
    upload(device, t.range(), raw)
