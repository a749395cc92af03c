"""norm_rope: q/k RMS norm + RoPE (+ the K store into the cache) in one kernel, bit for bit against
rms_norm, rope and set_rows apart, which have their own numpy tests."""

import numpy as np
import pytest

from vkrt.commands import CommandSequence, read_tensor, tensor_from_numpy
from vkrt.errors import OutOfRange
from vkrt.memory import Tensor
from vkrt.ops.norm import rms_norm
from vkrt.ops.norm_rope import norm_rope
from vkrt.ops.rope import rope
from vkrt.ops.set_rows import set_rows

N_TOK, N_HEAD, N_CELLS = 5, 3, 11


def case(device, head_dim, n_dims, neox, norm, cache, ff):
    rng = np.random.default_rng(head_dim + n_dims + 2 * neox + 4 * norm)
    x = (rng.standard_normal((N_TOK, N_HEAD, head_dim)) * 3).astype(np.float32)
    pos = np.array([0, 1, 7, 100, 4095], np.int32)
    rows = np.array([3, 0, 10, 4, 7], np.int32)
    own = [tensor_from_numpy(device, a) for a in (x, pos, rows,
                                                  rng.uniform(0.5, 1.5, head_dim).astype(np.float32),
                                                  rng.uniform(1.0, 4.0, n_dims // 2).astype(np.float32))]
    tx, tp, trows, tw, tff = own
    args = dict(n_dims=n_dims, freq_base=10000.0, neox=neox, freq_factors=tff if ff else None)
    shape = (head_dim, N_CELLS, N_HEAD) if cache else x.shape[::-1]
    outs = [Tensor.empty(device, cache or "F32", shape) for _ in range(2)]
    tmp = [Tensor.empty(device, "F32", x.shape[::-1]) for _ in range(2)]
    own += outs + tmp
    try:
        with CommandSequence(device) as seq:
            with seq.record():
                for o in outs:   # cells no token writes must match too
                    seq.fill(o.range(), 0)
                src = tx
                if norm:
                    rms_norm(seq, tx, tmp[0], 1e-6, tw)
                    src = tmp[0]
                rope(seq, src, tp, tmp[1] if cache else outs[0], **args)
                if cache:
                    set_rows(seq, tmp[1], trows, outs[0])
                norm_rope(seq, tx, tp, outs[1], weight=tw if norm else None, eps=1e-6,
                          rows=trows if cache else None, **args)
            seq.run()
        return [read_tensor(o) for o in outs]
    finally:
        for t in own:
            t.close()


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("head_dim,n_dims", [(128, 128), (64, 32)])
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("cache", [None, "F16", "F32"])
def test_same_bits_as_the_separate_kernels(device, neox, head_dim, n_dims, norm, cache):
    apart, fused = case(device, head_dim, n_dims, neox, norm, cache, ff=False)
    assert np.abs(apart).max() > 0
    bits = np.uint16 if cache == "F16" else np.uint32
    np.testing.assert_array_equal(apart.view(bits), fused.view(bits))


def test_frequency_factors(device):
    apart, fused = case(device, 128, 128, True, True, "F16", ff=True)
    np.testing.assert_array_equal(apart.view(np.uint16), fused.view(np.uint16))


def test_cache_that_does_not_fit(device):
    x = tensor_from_numpy(device, np.zeros((2, 4, 64), np.float32))
    pos = tensor_from_numpy(device, np.zeros(2, np.int32))
    bad = Tensor.empty(device, "F16", (64, 8, 3))
    try:
        with CommandSequence(device) as seq, seq.record():
            with pytest.raises(OutOfRange, match="does not fit the cache"):
                norm_rope(seq, x, pos, bad, rows=pos, n_dims=64, freq_base=1e4)
    finally:
        for t in (x, pos, bad):
            t.close()
