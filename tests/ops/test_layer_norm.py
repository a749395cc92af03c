"""LayerNorm with weight and bias against a float64 numpy reference."""

import numpy as np
import pytest

from vkrt.commands import CommandSequence, read_tensor, tensor_from_numpy
from vkrt.errors import OutOfRange


def layer_norm_ref(x, w, b, eps):
    x = x.astype(np.float64)
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


@pytest.mark.parametrize("shape", [(1, 1), (3, 31), (5, 576), (130, 64)])
def test_layer_norm(device, shape):
    from vkrt.ops.layer_norm import layer_norm
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 3 + 2).astype(np.float32)
    w, b = (rng.standard_normal(shape[-1]).astype(np.float32) for _ in range(2))
    tx, tw, tb = (tensor_from_numpy(device, a) for a in (x, w, b))
    to = tensor_from_numpy(device, np.zeros_like(x))
    try:
        with CommandSequence(device) as seq:
            with seq.record():
                layer_norm(seq, tx, to, tw, tb, 1e-6)
            seq.run()
        np.testing.assert_allclose(read_tensor(to), layer_norm_ref(x, w, b, 1e-6), rtol=1e-4, atol=1e-4)
    finally:
        for t in (tx, tw, tb, to):
            t.close()


def test_layer_norm_checks_weight(device):
    from vkrt.ops.layer_norm import layer_norm
    x = np.zeros((2, 8), np.float32)
    tx, to = tensor_from_numpy(device, x), tensor_from_numpy(device, x)
    tw = tensor_from_numpy(device, np.zeros(4, np.float32))
    try:
        with CommandSequence(device) as seq:
            with seq.record(), pytest.raises(OutOfRange, match="weight must have 8"):
                layer_norm(seq, tx, to, tw, tw, 1e-6)
    finally:
        for t in (tx, to, tw):
            t.close()
