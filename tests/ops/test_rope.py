"""RoPE, NORMAL and NEOX, partial rotation and frequency factors, against float64 numpy."""

import numpy as np
import pytest

from vkrt.commands import CommandSequence, read_tensor, tensor_from_numpy, write_tensor


def rope_ref(x, pos, n_dims, base, freq_scale, neox, ff=None):
    x = x.astype(np.float64)
    y = x.copy()
    half = n_dims // 2
    i = np.arange(half)
    theta = pos[:, None].astype(np.float64) * base ** (-2.0 * i / n_dims) * freq_scale
    if ff is not None:
        theta = theta / ff[:half]
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    if neox:
        a, b = x[..., :half], x[..., half:n_dims]
        y[..., :half], y[..., half:n_dims] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., 0:n_dims:2], x[..., 1:n_dims:2]
        y[..., 0:n_dims:2], y[..., 1:n_dims:2] = a * c - b * s, a * s + b * c
    return y


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("head_dim, n_dims", [(64, 64), (128, 64), (256, 256)])
def test_rope(device, neox, head_dim, n_dims):
    from vkrt.ops.rope import rope
    rng = np.random.default_rng(head_dim + n_dims + neox)
    n_tok, n_head = 5, 3
    x = rng.standard_normal((n_tok, n_head, head_dim)).astype(np.float32)
    pos = np.array([0, 1, 7, 100, 4095], np.int32)
    tx, tp = tensor_from_numpy(device, x), tensor_from_numpy(device, pos)
    to = tensor_from_numpy(device, np.zeros_like(x))
    try:
        with CommandSequence(device) as seq:
            with seq.record():
                rope(seq, tx, tp, to, n_dims=n_dims, freq_base=10000.0, neox=neox)
            seq.run()
            np.testing.assert_allclose(read_tensor(to), rope_ref(x, pos, n_dims, 1e4, 1.0, neox), atol=2.5e-3)  # fp32 theta near 4096 rad: a few ulps (4.9e-4 each)
            pos2 = pos + 3  # replay with new positions: no re-recording
            write_tensor(tp, pos2)
            seq.run()
            np.testing.assert_allclose(read_tensor(to), rope_ref(x, pos2, n_dims, 1e4, 1.0, neox), atol=2.5e-3)  # fp32 theta near 4096 rad: a few ulps (4.9e-4 each)
    finally:
        for t in (tx, tp, to):
            t.close()


def test_rope_freq_scale_and_factors(device):
    from vkrt.ops.rope import rope
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 2, 32)).astype(np.float32)
    pos = np.arange(4, dtype=np.int32) * 13
    ff = (1 + rng.random(16) * 4).astype(np.float32)
    tx, tp, tf = tensor_from_numpy(device, x), tensor_from_numpy(device, pos), tensor_from_numpy(device, ff)
    to = tensor_from_numpy(device, np.zeros_like(x))
    try:
        with CommandSequence(device) as seq:
            with seq.record():
                rope(seq, tx, tp, to, n_dims=32, freq_base=500000.0, freq_scale=0.25, neox=True, freq_factors=tf)
            seq.run()
        np.testing.assert_allclose(read_tensor(to), rope_ref(x, pos, 32, 5e5, 0.25, True, ff), atol=2.5e-3)  # fp32 theta near 4096 rad: a few ulps (4.9e-4 each)
    finally:
        for t in (tx, tp, tf, to):
            t.close()
