"""fill, add/mul (with broadcast), scale and the activations against numpy, odd sizes."""

import numpy as np
import pytest

from vkrt.commands import download, read_tensor, run_once, tensor_from_numpy, upload
from vkrt.memory import allocate
from vkrt.ops.elementwise import activation, add, fill, mul, scale

SIZES = [1, 31, 33, 1000, 4097]



@pytest.mark.parametrize("n", SIZES)
def test_add_mul_scale(device, n):
    rng = np.random.default_rng(n)
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    ta, tb, to = tensor_from_numpy(device, a), tensor_from_numpy(device, b), tensor_from_numpy(device, np.zeros(n, np.float32))
    try:
        run_once(device, lambda s: add(s, ta, tb, to))
        np.testing.assert_array_equal(read_tensor(to), a + b)
        run_once(device, lambda s: mul(s, ta, tb, to))
        np.testing.assert_array_equal(read_tensor(to), a * b)
        run_once(device, lambda s: scale(s, ta, 0.125, to))
        np.testing.assert_array_equal(read_tensor(to), a * np.float32(0.125))
    finally:
        for t in (ta, tb, to):
            t.close()


def test_broadcast_bias_and_views(device):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((7, 33)).astype(np.float32)
    bias = rng.standard_normal(33).astype(np.float32)
    tx, tb = tensor_from_numpy(device, x), tensor_from_numpy(device, bias)
    try:
        rows = tx.slice(1, 2, 6)  # rows 2..5: offset view
        run_once(device, lambda s: add(s, rows, tb, rows))
        expect = x.copy()
        expect[2:6] += bias
        np.testing.assert_array_equal(read_tensor(tx), expect)
        with pytest.raises(Exception, match="does not tile"):
            run_once(device, lambda s: add(s, tx, tx.slice(0, 0, 5).view((5,)), tx))
    finally:
        tx.close()
        tb.close()


@pytest.mark.parametrize("act", ["silu", "gelu"])
@pytest.mark.parametrize("gated", [False, True])
def test_activations(device, act, gated):
    rng = np.random.default_rng(3)
    g = (rng.standard_normal(1001) * 4).astype(np.float32)
    u = rng.standard_normal(1001).astype(np.float32)
    tg, tu, to = (tensor_from_numpy(device, v) for v in (g, u, np.zeros_like(g)))
    try:
        run_once(device, lambda s: activation(s, act, tg, to, up=tu if gated else None))
        x = g.astype(np.float64)
        ref = x / (1 + np.exp(-x)) if act == "silu" else \
            0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * x * (1 + 0.044715 * x * x)))
        if gated:
            ref = ref * u
        np.testing.assert_allclose(read_tensor(to), ref, rtol=2e-5, atol=2e-6)
    finally:
        for t in (tg, tu, to):
            t.close()


@pytest.mark.parametrize("n", SIZES)
def test_fill_matches_numpy(device, n):
    r = allocate(device, 4 * n + 16, label="fill")
    try:
        upload(device, r, np.zeros(n + 4, np.uint32))
        run_once(device, lambda s: fill(s, r, n, 0xDEADBEEF))
        out = download(device, r, np.uint32)
        assert (out[:n] == 0xDEADBEEF).all() and (out[n:] == 0).all()
    finally:
        r.close()
