"""soft_max (ggml soft_max_ext + softcap) against numpy: scale, mask broadcast, ALiBi, dead rows, sinks."""

from __future__ import annotations

import numpy as np
import pytest
from attn_reference import alibi_slopes

from vkrt.commands import CommandSequence, read_tensor, tensor_from_numpy
from vkrt.errors import UnsupportedShape
from vkrt.memory import F32, Tensor
from vkrt.ops.softmax import soft_max


def reference(x, mask=None, *, scale=1.0, softcap=0.0, max_bias=0.0, sinks=None):
    s = np.asarray(x, np.float64) * scale
    if softcap:
        s = softcap * np.tanh(s / softcap)
    if mask is not None:
        m = np.asarray(mask, np.float64)
        slopes = alibi_slopes(x.shape[1], max_bias)
        for i3 in range(x.shape[0]):
            for i2 in range(x.shape[1]):
                s[i3, i2] += slopes[i2] * m[i3 % m.shape[0], i2 % m.shape[1], :x.shape[2]]
    mx = s.max(axis=-1, keepdims=True)
    if sinks is not None:   # one a head (dim 1): in the max and the sum, no output of its own
        mx = np.maximum(mx, np.asarray(sinks, np.float64)[None, :, None, None])
    live = np.isfinite(mx)
    e = np.where(live, np.exp(s - np.where(live, mx, 0.0)), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    if sinks is not None:
        total = total + np.exp(np.asarray(sinks, np.float64)[None, :, None, None] - mx)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def run(device, x, mask=None, *, in_place=False, sinks=None, **kw):
    tx = tensor_from_numpy(device, x)
    tm = tensor_from_numpy(device, mask) if mask is not None else None
    ts = tensor_from_numpy(device, sinks) if sinks is not None else None
    out = tx if in_place else Tensor.empty(device, F32, tx.ne)
    try:
        with CommandSequence(device) as seq:
            with seq.record():
                soft_max(seq, tx, out, tm, sinks=ts, **kw)
            seq.run()
        return read_tensor(out)
    finally:
        for t in {id(t): t for t in (tx, tm, ts, out) if t is not None}.values():
            t.close()


@pytest.mark.parametrize("n", [1, 7, 64, 300, 1000])
def test_plain_rows(device, n):
    x = np.random.default_rng(n).standard_normal((2, 3, 5, n)).astype(np.float32) * 4
    got = run(device, x, scale=0.7)
    np.testing.assert_allclose(got, reference(x, scale=0.7), rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("in_place", [False, True])
def test_mask_planes_alibi_softcap_dead_rows(device, in_place):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 6, 9, 40)).astype(np.float32) * 6
    mask = rng.uniform(-3, 0, (2, 3, 12, 40))  # planes per (batch, head % 3), 12 >= 9 rows
    mask[rng.random(mask.shape) < 0.4] = -np.inf
    mask[1, 2, 4] = -np.inf  # row 4 of heads 2 and 5 in batch 1: nothing visible
    mask = mask.astype(np.float16)
    kw = dict(scale=0.5, softcap=10.0, max_bias=4.0)
    got = run(device, x, mask, in_place=in_place, **kw)
    ref = reference(x, mask, **kw)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    assert (got[1, [2, 5], 4] == 0).all()


def test_mask_shape_is_checked(device):
    x = Tensor.empty(device, F32, (40, 9, 6, 1))
    bad = Tensor.empty(device, "F16", (40, 9, 4, 1))  # 4 planes do not divide 6 heads
    try:
        with CommandSequence(device) as seq, seq.record():
            with pytest.raises(UnsupportedShape, match="divisor of 6"):
                soft_max(seq, x, x, bad)
    finally:
        x.close()
        bad.close()


def test_sinks(device):
    """Attention sinks (gpt-oss): a value a head in the denominator, above and below the rows'
    maxima; a fully masked row stays zeros. Without the sinks the rows sum to 1, with them less."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 4, 9, 40)).astype(np.float32) * 3
    mask = np.zeros((1, 1, 9, 40), np.float32)
    mask[0, 0, :, 30:] = -np.inf
    mask[0, 0, 3] = -np.inf
    mask = mask.astype(np.float16)
    sinks = np.array([-2.0, 0.5, 4.0, 12.0], np.float32)
    got = run(device, x, mask, sinks=sinks, scale=0.8)
    np.testing.assert_allclose(got, reference(x, mask, sinks=sinks, scale=0.8), rtol=1e-5, atol=1e-7)
    assert (got[:, :, 3] == 0).all()
    sums = got.sum(-1)
    assert (sums[:, 3] < 0.9).all() and np.abs(reference(x, mask, scale=0.8).sum(-1)[:, :, [0, 1]] - 1).max() < 1e-9
    with pytest.raises(UnsupportedShape, match="one a head"):
        run(device, x, sinks=sinks[:3])
