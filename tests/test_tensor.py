"""Tensor geometry, views sharing memory, and numpy round trips."""

import itertools

import numpy as np
import pytest

from vkrt.commands import read_tensor, tensor_from_numpy, write_tensor
from vkrt.errors import GGMLTypeError, OutOfRange
from vkrt.memory import BF16, F16, F32, I32, TYPES, Tensor, allocate, ggml_type


def test_types_table():
    assert ggml_type("q4_k").block_size == 256 and ggml_type("Q4_K").type_size == 144
    assert ggml_type(0) is F32 and ggml_type("F16") is F16
    with pytest.raises(GGMLTypeError):
        ggml_type("Q9_9")
    for name in ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"):
        assert name in TYPES


@pytest.mark.parametrize("shape", [(1,), (31,), (33, 7), (5, 3, 1001), (2, 3, 4, 5)])
def test_roundtrip(device, shape):
    a = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    t = tensor_from_numpy(device, a)
    try:
        assert t.shape == shape and t.ne[:len(shape)] == tuple(reversed(shape))
        np.testing.assert_array_equal(read_tensor(t), a)
    finally:
        t.close()


def test_views_share_memory(device):
    a = np.arange(4 * 6, dtype=np.float32).reshape(4, 6)  # ne = (6, 4)
    t = tensor_from_numpy(device, a)
    try:
        tt = t.transpose()
        assert not tt.is_contiguous() and tt.is_transposed()
        np.testing.assert_array_equal(read_tensor(tt), a.T)
        s = t.slice(0, 2, 5)
        np.testing.assert_array_equal(read_tensor(s), a[:, 2:5])
        s1 = t.slice(1, 1, 3)
        np.testing.assert_array_equal(read_tensor(s1), a[1:3])
        write_tensor(s, np.zeros((4, 3), np.float32))  # strided write keeps the other elements
        b = a.copy()
        b[:, 2:5] = 0
        np.testing.assert_array_equal(read_tensor(t), b)
        r = t.reshape(3, 8)
        np.testing.assert_array_equal(read_tensor(r), b.reshape(8, 3))
        with pytest.raises(OutOfRange):
            tt.reshape(24)
        p = t.view((6, 2, 2)).permute(0, 2, 1, 3)
        np.testing.assert_array_equal(read_tensor(p), b.reshape(2, 2, 6).transpose(1, 0, 2))
    finally:
        t.close()


def test_f16_and_quantised_geometry(device):
    h = np.random.default_rng(1).standard_normal((3, 5)).astype(np.float16)
    t = tensor_from_numpy(device, h)
    try:
        assert t.type is F16 and t.nb == (2, 10, 30, 30)
        np.testing.assert_array_equal(read_tensor(t), h)
    finally:
        t.close()
    q = Tensor.empty(device, "Q4_0", (64, 3))
    try:
        assert q.nb[:2] == (18, 36) and q.nbytes == 108
        blocks = np.arange(108, dtype=np.uint8).reshape(1, 1, 3, 36)
        write_tensor(q, blocks)
        np.testing.assert_array_equal(read_tensor(q), blocks)
        with pytest.raises(GGMLTypeError):
            Tensor.empty(device, "Q4_0", (48, 2))
    finally:
        q.close()


def test_contiguity_ignores_size_one_dims(device):
    a = np.arange(3 * 4 * 6, dtype=np.float32).reshape(3, 4, 6)   # ne (6, 4, 3)
    t = tensor_from_numpy(device, a)
    try:
        rows = t.slice(1, 1, 3)                                     # ne (6, 2, 3): gaps between planes
        assert not rows.is_contiguous()
        with pytest.raises(OutOfRange, match="contiguous"):
            rows.reshape(36)
        plane_rows = rows.slice(2, 1, 2)                            # ne (6, 2, 1): packed, nb[2] irrelevant
        assert plane_rows.is_contiguous() and plane_rows.nb[2] == 96
        np.testing.assert_array_equal(read_tensor(plane_rows.reshape(12)), a[1, 1:3].reshape(12))
        assert t.view((6, 1, 4), nb=(4, 12345 * 4, 24)).is_contiguous()
        assert t.slice(0, 0, 1).view((1, 4, 3), nb=t.nb[:3]).is_contiguous() is False  # rows 24 bytes apart
        assert t.view((1, 12), nb=(8, 4)).is_contiguous()          # ne[0] == 1: nb[0] irrelevant
    finally:
        t.close()


def test_is_transposed(device):
    t = Tensor.empty(device, F32, (6, 4))
    h = Tensor.empty(device, F16, (5, 3))
    q = Tensor.empty(device, "Q8_0", (32, 2))
    try:
        assert t.transpose().is_transposed() and h.transpose().is_transposed()
        assert not t.is_transposed()
        assert not t.transpose().slice(1, 1, 5).is_transposed()    # a column block: nb[0] is 6 columns
        assert t.transpose().slice(0, 1, 3).is_transposed()        # fewer columns, same column length
        assert not t.view((6, 2, 2)).permute(1, 0, 2, 3).is_transposed()  # 3-D
        assert not q.is_transposed()
    finally:
        for x in (t, h, q):
            x.close()


@pytest.mark.parametrize("axes", list(itertools.permutations(range(4))), ids=str)
def test_permute_matches_numpy(device, axes):
    a = np.random.default_rng(0).standard_normal((5, 4, 3, 2)).astype(np.float32)   # ne (2, 3, 4, 5)
    t = tensor_from_numpy(device, a)
    try:
        p = t.permute(*axes)
        assert p.ne == tuple(t.ne[axes.index(d)] for d in range(4))
        # numpy axis of GGML dim d is 3 - d; source dim i lands in dim axes[i]
        order = [0] * 4
        for i, d in enumerate(axes):
            order[3 - d] = 3 - i
        np.testing.assert_array_equal(read_tensor(p).reshape(a.transpose(order).shape), a.transpose(order))
        assert p.is_contiguous() == (axes == (0, 1, 2, 3))
    finally:
        t.close()


def test_geometry_of_views(device):
    t = Tensor.empty(device, F16, (6, 4, 3))
    try:
        assert t.nbytes == t.span == 144 and t.ndim == 3 and t.shape == (3, 4, 6) and t.nelements == 72
        s = t.slice(0, 1, 4).slice(1, 2, 4)
        assert s.offset == t.offset + 2 + 24 and s.nbytes == 2 * 3 * 2 * 3
        assert s.span == (3 - 1) * 2 + (2 - 1) * 12 + (3 - 1) * 48 + 2
        assert s.range().offset == s.offset and s.range().size == s.span and s.range().buffer is t.buffer
        tt = t.transpose()
        assert tt.ne == (4, 6, 3, 1) and tt.nb == (12, 2, 48, 144) and tt.span == t.span
        v = t.view((3, 2), nb=(4, 24), offset=6)
        assert v.nb == (4, 24, 48, 48) and v.offset == t.offset + 6 and v.ndim == 2
        assert t.element_size == 2
    finally:
        t.close()


def test_view_and_slice_errors(device):
    t = Tensor.empty(device, F32, (6, 4))
    try:
        with pytest.raises(OutOfRange, match="reaches byte"):
            t.view((6, 4), offset=t.buffer.size - t.offset)
        with pytest.raises(OutOfRange):
            t.view((2,), offset=-4)
        with pytest.raises(OutOfRange, match="dims 0..3"):
            t.slice(4, 0, 1)
        for start, stop in ((2, 2), (-1, 3), (0, 7)):
            with pytest.raises(OutOfRange, match="slice"):
                t.slice(0, start, stop)
        with pytest.raises(OutOfRange, match="reshape 24 elements"):
            t.reshape(5, 5)
        with pytest.raises(OutOfRange, match="permutation"):
            t.permute(0, 0, 1, 2)
        for ne in ((1, 2, 3, 4, 5), (3, 0), ()):
            with pytest.raises(OutOfRange, match="1 to 4 positive"):
                t.view(ne)
    finally:
        t.close()


def test_quantised_views(device):
    q = Tensor.empty(device, "Q4_0", (64, 3, 2))
    try:
        assert q.view((64, 3), nb=(18,)).nb == (18, 36, 108, 108)    # missing strides continue contiguously
        s = q.slice(0, 32, 64)
        assert s.offset == q.offset + 18 and s.span == 18 + 2 * 36 + 108
        with pytest.raises(GGMLTypeError):
            q.slice(0, 16, 64)
        with pytest.raises(GGMLTypeError, match="block-quantised"):
            q.element_size
    finally:
        q.close()


def test_bf16_and_i32_roundtrip(device):
    bits = np.random.default_rng(2).integers(0, 1 << 16, size=(3, 33), dtype=np.uint16)
    b = tensor_from_numpy(device, bits, typ="BF16")
    i = tensor_from_numpy(device, np.arange(-5, 26, dtype=np.int32))
    try:
        assert b.type is BF16 and b.nb[:2] == (2, 66)
        np.testing.assert_array_equal(read_tensor(b), bits)
        assert i.type is I32
        np.testing.assert_array_equal(read_tensor(i), np.arange(-5, 26))
    finally:
        b.close()
        i.close()


def test_tensor_on_a_range(device):
    rng = allocate(device, 100, label="on")
    try:
        t = Tensor.on(rng.range(), F32, (5, 5))
        assert t.buffer is rng.buffer and t.offset == rng.offset and t.owner is None
        with pytest.raises(OutOfRange, match="needs 104 bytes"):
            Tensor.on(rng.range(), F32, (26,))
    finally:
        rng.close()
