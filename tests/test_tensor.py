"""Tensor geometry, views sharing memory, and numpy round trips."""

import numpy as np
import pytest

from vkrt.commands import read_tensor, tensor_from_numpy, write_tensor
from vkrt.errors import GGMLTypeError, OutOfRange
from vkrt.memory import F16, F32, TYPES, Tensor, ggml_type


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
