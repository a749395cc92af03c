"""fill, add/mul (with broadcast), scale and the activations against numpy, odd sizes."""

import numpy as np
import pytest

from vkrt.commands import download, read_tensor, run_once, tensor_from_numpy, upload
from vkrt.errors import OutOfRange
from vkrt.memory import allocate
from vkrt.ops.elementwise import activation, add, fill, mul, scale, gate_mul

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


def act_ref(act, x, up=None):
    """act(x), or with `up` the gated act(x) * up (swiglu_oai: its own gated form, as llama.cpp)."""
    x = x.astype(np.float64)
    if act == "swiglu_oai":
        g = np.minimum(x, 7.0)
        return g / (1 + np.exp(-1.702 * g)) * (np.clip(up.astype(np.float64), -7.0, 7.0) + 1)
    if up is not None:
        return act_ref(act, x) * up
    if act == "silu":
        return x / (1 + np.exp(-x))
    if act == "sigmoid":
        return 1 / (1 + np.exp(-x))
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * x * (1 + 0.044715 * x * x)))


@pytest.mark.parametrize("act,gated", [("silu", False), ("silu", True), ("gelu", False), ("gelu", True),
                                       ("sigmoid", False), ("sigmoid", True), ("swiglu_oai", True)])
def test_activations(device, act, gated):
    """Each activation against float64 (swiglu_oai: gate and up both past its limit of 7 too)."""
    rng = np.random.default_rng(3)
    g = (rng.standard_normal(1001) * 4).astype(np.float32)
    u = (rng.standard_normal(1001) * 4).astype(np.float32)
    tg, tu, to = (tensor_from_numpy(device, v) for v in (g, u, np.zeros_like(g)))
    try:
        run_once(device, lambda s: activation(s, act, tg, to, up=tu if gated else None))
        ref = act_ref(act, g, u if gated else None)
        np.testing.assert_allclose(read_tensor(to), ref, rtol=2e-5, atol=2e-6)
        if act == "swiglu_oai":
            assert (np.abs(g) > 7).sum() > 10 and (np.abs(u) > 7).sum() > 10
            with pytest.raises(Exception, match="needs `up`"):
                run_once(device, lambda s: activation(s, act, tg, to))
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


@pytest.mark.parametrize("in_place", [False, True])
def test_sigmoid_gate_of_interleaved_projection(device, in_place):
    """Gated attention: out = x * sigmoid(gate), the gate the second half of each head of the
    query projection [2*D*H, T] (view ne (D, H, T), nb (4, 8D, 8DH)); out may be x itself."""
    d, h, t = 24, 3, 5
    rng = np.random.default_rng(7)
    x = rng.standard_normal((t, h, d)).astype(np.float32)
    proj = (rng.standard_normal((t, h, 2, d)) * 4).astype(np.float32)   # per head: [query, gate]
    tx, tp, to = (tensor_from_numpy(device, v) for v in (x, proj, np.zeros_like(x)))
    try:
        gate = tp.view((d, h, t), nb=(4, 8 * d, 8 * d * h), offset=4 * d)
        out = tx if in_place else to
        run_once(device, lambda s: gate_mul(s, tx, gate, out))
        np.testing.assert_allclose(read_tensor(out), x * act_ref("sigmoid", proj[:, :, 1]), rtol=2e-6, atol=1e-7)
        with pytest.raises(OutOfRange, match="shapes differ"):
            run_once(device, lambda s: gate_mul(s, tx, tp.view((d, h, t - 1), nb=(4, 8 * d, 8 * d * h)), to))
    finally:
        for v in (tx, tp, to):
            v.close()


def test_strided_activation_is_the_contiguous_one(device):
    """A strided g (a column-sliced 4-D view) gives the same bits as the same values contiguous."""
    rng = np.random.default_rng(11)
    g = (rng.standard_normal((2, 3, 4, 10)) * 4).astype(np.float32)
    tg, tc, ts, to = (tensor_from_numpy(device, v) for v in (g, np.ascontiguousarray(g[..., 2:9]),
                                                              np.zeros((2, 3, 4, 7), np.float32),
                                                              np.zeros((2, 3, 4, 7), np.float32)))
    try:
        view = tg.slice(0, 2, 9)
        assert not view.is_contiguous()
        run_once(device, lambda s: (activation(s, "silu", view, ts), activation(s, "silu", tc, to)))
        np.testing.assert_array_equal(read_tensor(ts).view(np.uint32), read_tensor(to).view(np.uint32))
        np.testing.assert_allclose(read_tensor(ts), act_ref("silu", g[..., 2:9]), rtol=2e-5, atol=2e-6)
        with pytest.raises(OutOfRange, match="strided g must have"):
            run_once(device, lambda s: activation(s, "silu", view, ts.view((7, 24))))
    finally:
        for v in (tg, tc, ts, to):
            v.close()
