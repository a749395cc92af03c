"""The KV cache's Walsh-Hadamard rotation against llama.cpp's matrix (numpy)."""

import numpy as np
import pytest

from vkrt.commands import CommandSequence, read_tensor, tensor_from_numpy
from vkrt.errors import UnsupportedShape
from vkrt.ops.hadamard import hadamard, hadamard_matrix, k_rotation, v_rotation


def gen_hadamard(n):
    """ggml_gen_hadamard as llama-kv-cache.cpp writes it (data[i*n + j])."""
    d = np.zeros((n, n), np.float32)
    d[0, 0] = 1.0 / np.sqrt(np.float32(n))
    s = 1
    while s < n:
        for i in range(s):
            for j in range(s):
                d[i + s, j] = d[i, j + s] = d[i, j]
                d[i + s, j + s] = -d[i, j]
        s *= 2
    return d


@pytest.mark.parametrize("n", [64, 128, 256])
def test_matrix_is_llamas_and_its_own_inverse(n):
    h = hadamard_matrix(n)
    np.testing.assert_array_equal(h, gen_hadamard(n))
    np.testing.assert_allclose(h @ h, np.eye(n), atol=1e-6)


def test_rotation_runs_follow_llama():
    assert [k_rotation(d) for d in (32, 64, 80, 96, 128, 192, 256, 576)] == [0, 64, 0, 0, 128, 64, 256, 64]
    assert [v_rotation(d) for d in (32, 64, 128, 256, 80)] == [0, 64, 64, 64, 0]


@pytest.mark.parametrize("n,shape", [(64, (128, 3, 5)), (128, (128, 2, 3)), (256, (256, 4, 2)), (64, (192, 2, 1))])
def test_hadamard_in_place(device, n, shape):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(shape[::-1]).astype(np.float32)
    x[..., 3] = 40.0   # an outlier channel: the rotation spreads it over its run
    t = tensor_from_numpy(device, x)
    try:
        with CommandSequence(device) as seq:
            with seq.record():
                hadamard(seq, t, n)
            seq.run()
            got = read_tensor(t)
            expect = (x.reshape(-1, n) @ hadamard_matrix(n).T).reshape(x.shape)
            np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-5)
            assert np.abs(got).max() < 0.5 * np.abs(x).max()
            seq.run()   # twice: back where it started
            np.testing.assert_allclose(read_tensor(t), x, rtol=1e-5, atol=1e-5)
    finally:
        t.close()


def test_hadamard_strided_view_leaves_the_rest(device):
    """A view whose rows are strided (the queries' part of a fused q|gate projection): only its runs move."""
    rng = np.random.default_rng(7)
    full = rng.standard_normal((3, 2, 128)).astype(np.float32)   # [tokens, heads, q|gate]
    t = tensor_from_numpy(device, full)
    try:
        q = t.view((64, 2, 3), nb=(4, 4 * 128, 4 * 256))
        with CommandSequence(device) as seq:
            with seq.record():
                hadamard(seq, q, 64)
            seq.run()
        got = read_tensor(t).reshape(3, 2, 128)
        np.testing.assert_allclose(got[..., :64], full[..., :64] @ hadamard_matrix(64).T, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got[..., 64:], full[..., 64:])
    finally:
        t.close()


def test_hadamard_refuses_runs_that_do_not_divide(device):
    t = tensor_from_numpy(device, np.zeros((2, 96), np.float32))
    try:
        with CommandSequence(device) as seq, seq.record(), pytest.raises(UnsupportedShape, match="runs of 64"):
            hadamard(seq, t, 64)
    finally:
        t.close()
