"""Tiled transpose against numpy: 16/32-bit elements, edges, batches, strided views and offsets,
other tile shapes (GCN's among them), grid limits, splitting over bindings."""

import dataclasses

import numpy as np
import pytest

from vkrt.commands import read_tensor, run_once, tensor_from_numpy
from vkrt.device import TABLE, Arch
from vkrt.errors import GGMLTypeError, OutOfRange
from vkrt.memory import BF16, F16, F32, I32, Tensor
from vkrt.ops.copy import copy
from vkrt.ops.transpose import transpose

TYPES = [F32, F16, I32, BF16]
# (ne0, ne1, ne2, ne3): a single element, single rows/columns, tile edges +-1, long thin ones
SHAPES = [(1, 1, 1, 1), (1, 33, 1, 1), (31, 1, 1, 1), (33, 31, 1, 1), (32, 64, 1, 1), (1031, 3, 1, 1),
          (3, 1000, 1, 1), (33, 31, 3, 2)]



def random_bits(typ, shape, seed) -> np.ndarray:
    """Random bit patterns (NaNs included) of `typ`'s element size, as `typ`'s host dtype."""
    bits = np.random.default_rng(seed).integers(0, 2 ** (8 * typ.type_size), size=shape, dtype=np.uint64)
    return bits.astype(np.uint32 if typ.type_size == 4 else np.uint16).view(typ.dtype)


def numpy_t(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.swapaxes(x, -1, -2))


def same_bits(a, b) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def check(device, typ, ne, seed=0) -> None:
    x = random_bits(typ, tuple(reversed(ne)), seed)
    src = tensor_from_numpy(device, x, typ=typ)
    dst = Tensor.empty(device, typ, (ne[1], ne[0], ne[2], ne[3]))
    try:
        run_once(device, lambda seq: transpose(seq, src, dst))
        assert same_bits(read_tensor(dst), numpy_t(x))
    finally:
        src.close()
        dst.close()


@pytest.mark.parametrize("typ", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("ne", SHAPES, ids=str)
def test_transpose_matches_numpy(device, typ, ne):
    check(device, typ, ne, seed=sum(ne))


@pytest.mark.parametrize("typ", [F32, F16], ids=lambda t: t.name)
def test_views_with_row_strides_and_offsets(device, typ):
    """src: columns 1..33 of a wider tensor with its batch dims swapped; dst: an odd-offset window
    of a larger tensor, whose other elements stay untouched."""
    x = random_bits(typ, (2, 3, 40, 36), 1)                        # ne (36, 40, 3, 2)
    big = tensor_from_numpy(device, x, typ=typ)
    src = big.slice(0, 1, 34).slice(1, 2, 37).permute(0, 1, 3, 2)  # ne (33, 35, 2, 3)
    fill = random_bits(typ, (3, 2, 40, 37), 2)                     # ne (37, 40, 2, 3)
    outer = tensor_from_numpy(device, fill, typ=typ)
    dst = outer.slice(0, 1, 36).slice(1, 3, 36)                    # ne (35, 33, 2, 3)
    try:
        run_once(device, lambda seq: transpose(seq, src, dst))
        want = numpy_t(x[:, :, 2:37, 1:34].transpose(1, 0, 2, 3))   # (3, 2, 33, 35)
        expect = fill.copy()
        expect[:, :, 3:36, 1:36] = want
        assert same_bits(read_tensor(outer), expect)
    finally:
        big.close()
        outer.close()


@pytest.mark.parametrize("rows", [1, 3, 8, 32])
def test_tile_row_counts(device, monkeypatch, rows):
    """Any number of rows per pass covers the whole tile, including ones that do not divide it."""
    monkeypatch.setattr(device, "tuning", dataclasses.replace(device.tuning, transpose_rows=rows))
    check(device, F16, (65, 33, 2, 1), seed=rows)
    check(device, F32, (31, 70, 1, 1), seed=rows + 1)


def test_gcn_tuning(device, monkeypatch):
    gcn = TABLE[Arch.AMD_GCN]
    assert (gcn.transpose_tile * gcn.transpose_rows) % 64 == 0  # whole wave64s
    monkeypatch.setattr(device, "tuning", gcn.resolved(device.profile))
    check(device, F32, (100, 37, 2, 1))


def test_grid_beyond_workgroup_count_limits(device, monkeypatch):
    """With a tiny maxComputeWorkGroupCount each workgroup walks several tiles and batches."""
    monkeypatch.setattr(device, "profile", dataclasses.replace(device.profile, max_workgroup_count=(2, 3, 2)))
    check(device, F32, (130, 100, 5, 1))
    check(device, F16, (33, 65, 2, 3))


def test_without_16bit_storage(device, monkeypatch):
    monkeypatch.setattr(device, "profile", dataclasses.replace(device.profile, storage_16bit=False))
    x = random_bits(F16, (33, 31), 9)
    src = tensor_from_numpy(device, x, typ=F16)
    out = tensor_from_numpy(device, np.zeros((32, 34), np.float16))
    try:
        run_once(device, lambda seq: transpose(seq, src.slice(0, 1, 30), out.slice(0, 1, 34).slice(1, 1, 30)))
        expect = np.zeros((32, 34), np.float16)
        expect[1:30, 1:34] = x[:, 1:30].T
        assert same_bits(read_tensor(out), expect)
    finally:
        src.close()
        out.close()


def test_split_over_small_bindings(device, monkeypatch):
    x = random_bits(F32, (2, 50, 70), 3)
    src = tensor_from_numpy(device, x)
    dst = Tensor.empty(device, F32, (50, 70, 2))
    try:
        monkeypatch.setattr(device, "profile", dataclasses.replace(device.profile, max_storage_buffer_range=2048))
        run_once(device, lambda seq: transpose(seq, src, dst))
        monkeypatch.undo()
        assert same_bits(read_tensor(dst), numpy_t(x))
    finally:
        src.close()
        dst.close()


def test_view_spanning_more_than_a_binding(device, lavapipe_binding_limit):
    """Source rows 2.25 MiB apart: the 70 x 60 source spans ~133 MiB."""
    row = 9 << 18
    x = random_bits(F32, (60, 70), 4)
    big = Tensor.empty(device, F32, (row // 4, 60))
    small, back = tensor_from_numpy(device, x), Tensor.empty(device, F32, (60, 70))
    try:
        view = big.view((70, 60), nb=(4, row), offset=4)
        assert view.span > device.profile.max_storage_buffer_range
        run_once(device, lambda seq: (copy(seq, small, view), transpose(seq, view, back)))
        assert same_bits(read_tensor(back), x.T)
    finally:
        for t in (big, small, back):
            t.close()


def test_transpose_errors(device):
    made = [Tensor.empty(device, *spec) for spec in ((F32, (4, 3)), (F16, (3, 4)), (F32, (4, 3)), (F32, (3, 4)),
                                                     ("Q8_0", (32, 2)))]
    a, half, same, good, q8 = made
    try:
        with pytest.raises(GGMLTypeError, match="does not convert"):
            transpose(None, a, half)
        with pytest.raises(OutOfRange, match="must have ne"):
            transpose(None, a, same)
        with pytest.raises(OutOfRange, match="rows must be contiguous"):
            transpose(None, a.transpose(), a)
        with pytest.raises(OutOfRange, match="rows must be contiguous"):
            transpose(None, a, good.transpose().transpose().view((3, 4), nb=(16, 4)))
        with pytest.raises(GGMLTypeError, match="2- or 4-byte"):
            transpose(None, q8, q8)
    finally:
        for t in made:
            t.close()
