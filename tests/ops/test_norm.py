"""RMS norm (fused weight) against a float64 numpy reference."""

import numpy as np
import pytest

from vkrt.commands import CommandSequence, read_tensor, tensor_from_numpy


def rms_ref(x, w, eps):
    x = x.astype(np.float64)
    y = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
    return y * w if w is not None else y


@pytest.mark.parametrize("shape", [(1, 1), (3, 31), (5, 576), (2, 3, 1000)])
@pytest.mark.parametrize("with_weight", [True, False])
def test_rms_norm(device, shape, with_weight):
    from vkrt.ops.norm import rms_norm
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    w = rng.standard_normal(shape[-1]).astype(np.float32) if with_weight else None
    tx = tensor_from_numpy(device, x)
    to = tensor_from_numpy(device, np.zeros_like(x))
    tw = tensor_from_numpy(device, w) if with_weight else None
    try:
        with CommandSequence(device) as seq:
            with seq.record():
                rms_norm(seq, tx, to, 1e-6, tw)
            seq.run()
        np.testing.assert_allclose(read_tensor(to), rms_ref(x, w, 1e-6), rtol=1e-5, atol=1e-5)
    finally:
        for t in (tx, to, tw):
            if t is not None:
                t.close()


def test_rms_norm_per_head_view(device):
    """QK-norm: rows are heads of a strided view (every other head of a packed tensor)."""
    from vkrt.ops.norm import rms_norm
    rng = np.random.default_rng(9)
    x = rng.standard_normal((3, 4, 16)).astype(np.float32)  # tokens, heads, head_dim
    w = rng.standard_normal(16).astype(np.float32)
    tx, tw = tensor_from_numpy(device, x), tensor_from_numpy(device, w)
    to = tensor_from_numpy(device, np.zeros_like(x))
    try:
        v_in = tx.view((16, 2, 3), nb=(4, 128, 256))
        v_out = to.view((16, 2, 3), nb=(4, 128, 256))
        with CommandSequence(device) as seq:
            with seq.record():
                rms_norm(seq, v_in, v_out, 1e-6, tw)
            seq.run()
        out = read_tensor(to)
        np.testing.assert_allclose(out[:, ::2], rms_ref(x[:, ::2], w, 1e-6), rtol=1e-5, atol=1e-5)
        assert (out[:, 1::2] == 0).all()
    finally:
        for t in (tx, tw, to):
            t.close()


@pytest.mark.parametrize("shape", [(1, 7), (3, 576), (4, 2048)])
@pytest.mark.parametrize("in_place", [True, False])
def test_add_rms_norm_is_add_then_norm_bit_for_bit(device, shape, in_place):
    """The fused residual add + norm against numpy, and bit for bit against add then rms_norm,
    with the sum written over x (as the transformer does) or elsewhere; out may alias the residual."""
    from vkrt.commands import run_once
    from vkrt.ops.elementwise import add
    from vkrt.ops.norm import rms_norm
    rng = np.random.default_rng(shape[1])
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    r = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal(shape[-1]).astype(np.float32)
    tensors = [tensor_from_numpy(device, a) for a in (x, r, w, x, np.zeros_like(x), np.zeros_like(x))]
    tx, tr, tw, tx2, tsum, to = tensors
    try:
        run_once(device, lambda seq: (add(seq, tx2, tr, tx2), rms_norm(seq, tx2, to, 1e-6, tw)))
        want_sum, want = read_tensor(tx2), read_tensor(to)
        total = x + r
        np.testing.assert_array_equal(want_sum, total)
        np.testing.assert_allclose(want, rms_ref(total, w, 1e-6), rtol=1e-5, atol=1e-5)
        sum_out = tx if in_place else tsum
        out = tr if in_place else to   # the transformer normalises into the residual's buffer too
        run_once(device, lambda seq: rms_norm(seq, tx, out, 1e-6, tw, residual=tr, sum_out=sum_out))
        np.testing.assert_array_equal(read_tensor(sum_out).view(np.uint32), want_sum.view(np.uint32))
        np.testing.assert_array_equal(read_tensor(out).view(np.uint32), want.view(np.uint32))
    finally:
        for t in tensors:
            t.close()


@pytest.mark.parametrize("with_weight", [True, False])
def test_gated_rms_norm_with_strided_gate(device, with_weight):
    """Gated DeltaNet's output norm: rms_norm(x) * w * silu(z) over rows of D, x [D, Hv, T], with z
    a strided view (each token's gates interleaved with other values, as in a fused projection)."""
    from vkrt.commands import run_once
    from vkrt.ops.norm import rms_norm
    d, hv, t = 48, 3, 5
    rng = np.random.default_rng(hv * t)
    x = (rng.standard_normal((t, hv, d)) * 3).astype(np.float32)
    packed = (rng.standard_normal((t, 2 * hv + 1, d)) * 4).astype(np.float32)   # per token: [?, z0, ?, z1, ...]
    w = rng.standard_normal(d).astype(np.float32) if with_weight else None
    tensors = [tensor_from_numpy(device, a) for a in (x, packed, np.zeros_like(x))]
    tx, tp, to = tensors
    tw = tensor_from_numpy(device, w) if with_weight else None
    try:
        z_view = tp.view((d, hv, t), nb=(4, 8 * d, 4 * d * (2 * hv + 1)), offset=4 * d)
        run_once(device, lambda seq: rms_norm(seq, tx, to, 1e-6, tw, gate=z_view))
        z = packed[:, 1:2 * hv:2].astype(np.float64)
        want = rms_ref(x, w, 1e-6) * z / (1 + np.exp(-z))
        np.testing.assert_allclose(read_tensor(to), want, rtol=1e-5, atol=1e-5)
    finally:
        for tn in tensors + [tw]:
            if tn is not None:
                tn.close()


def test_gated_rms_norm_rejects_bad_gates(device):
    from vkrt.commands import run_once
    from vkrt.errors import OutOfRange
    from vkrt.ops.norm import rms_norm
    tensors = [tensor_from_numpy(device, np.ones(s, np.float32)) for s in ((2, 8), (3, 8), (2, 8))]
    tx, tz, to = tensors
    try:
        with pytest.raises(OutOfRange, match="gate: shapes differ"):
            run_once(device, lambda seq: rms_norm(seq, tx, to, 1e-6, gate=tz))
        with pytest.raises(OutOfRange, match="gate and residual"):
            run_once(device, lambda seq: rms_norm(seq, tx, to, 1e-6, gate=to, residual=to))
    finally:
        for t in tensors:
            t.close()


def test_reduce_layout_by_device():
    """Norms sum by butterflies only where every subgroup is full (subgroups no wider than the
    smallest norm workgroup: an Adreno-style 128-lane subgroup would shuffle from idle lanes),
    else by subgroupAdd, else by a tree; the router's norm prologue needs the butterfly and one
    fixed subgroup size. A profile laid out for wider subgroups than the device runs (a test's:
    tests/conftest.py wave64) emulates them (SG_LOGICAL)."""
    from types import SimpleNamespace

    from vkrt.ops.reduce import butterfly_subgroups, reduce_defines

    def dev(lo, hi, shuffle=True, arithmetic=True, reduce_wg=1024, runs=None):
        prof = SimpleNamespace(subgroup_min=lo, subgroup_max=hi, subgroup_shuffle=shuffle,
                               subgroup_arithmetic=arithmetic, subgroup_size=runs or hi)
        return SimpleNamespace(profile=prof, tuning=SimpleNamespace(reduce_wg=reduce_wg))

    assert reduce_defines(dev(32, 32)) == {"SG_BUTTERFLY": 1}
    assert reduce_defines(dev(64, 64)) == {"SG_BUTTERFLY": 1}
    assert reduce_defines(dev(32, 64, runs=32)) == {"SG_BUTTERFLY": 1}   # RDNA: 32 to 64 lanes
    assert reduce_defines(dev(64, 64, runs=8)) == {"SG_BUTTERFLY": 1, "SG_LOGICAL": 64}
    assert reduce_defines(dev(64, 64, shuffle=False, runs=8)) == {"SG_REDUCE": 1, "SG_LOGICAL": 64}
    assert reduce_defines(dev(128, 128)) == {"SG_REDUCE": 1}
    assert reduce_defines(dev(32, 32, shuffle=False)) == {"SG_REDUCE": 1}
    assert reduce_defines(dev(32, 32, shuffle=False, arithmetic=False)) == {}
    assert butterfly_subgroups(dev(32, 32), 2048) == 32   # 1024 invocations
    assert butterfly_subgroups(dev(64, 64), 2048) == 16
    assert butterfly_subgroups(dev(8, 32), 2048) is None   # varying sizes
    assert butterfly_subgroups(dev(32, 32, shuffle=False), 2048) is None
