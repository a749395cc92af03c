"""The RMS norm in a plain mat-vec's prologue (mul_mv NORM_IN without routing: attention's q, k
and v projections read the residual stream the summed experts were added into)."""

import dataclasses

import numpy as np
import pytest
from quant_data import random_blocks, weight_tensor
from vkrt.commands import CommandSequence, read_tensor, tensor_from_numpy
from vkrt.errors import UnsupportedShape
from vkrt.memory import Tensor
from vkrt.ops.matmul import NormInput, matmul, norm_input
from vkrt.ops.norm import rms_norm


def _needs_prologue(device, mv_wg):
    prof = device.profile
    if not prof.subgroup_shuffle or prof.subgroup_min != prof.subgroup_max or mv_wg < prof.subgroup_min:
        pytest.skip("the norm prologue needs shuffles and one fixed subgroup size no wider than the mat-vec")


@pytest.mark.parametrize("name, K, m, n_tokens, mv_wg, reduce_wg", [
    ("Q4_0", 96, 40, 1, 64, 64), ("Q4_K", 512, 24, 2, 64, 256), ("F32", 520, 17, 1, 64, 256),
    ("Q4_0", 2048, 36, 1, 128, 1024), ("Q6_K", 2048, 20, 1, 128, 512), ("Q8_0", 256, 16, 4, 64, 1024),
    ("Q5_K", 512, 12, 3, 128, 512)])
def test_norm_in_the_mat_vec_is_rms_norm_then_mat_vec(device, monkeypatch, name, K, m, n_tokens, mv_wg, reduce_wg):
    """y = W·(rms_norm(x) * w) with the norm in the mat-vec's prologue against rms_norm then the
    mat-vec, bit for bit; x (the residual stream) untouched; one to four token columns, rows of
    the norm workgroup's multiples and not, a lane holding one or several of its elements."""
    _needs_prologue(device, mv_wg)
    monkeypatch.setattr(device, "tuning", dataclasses.replace(device.tuning, mv_wg=mv_wg, reduce_wg=reduce_wg))
    rng = np.random.default_rng(K + m + n_tokens)
    x0 = (rng.standard_normal((n_tokens, K)) * 3).astype(np.float32)
    nw = (1 + 0.1 * rng.standard_normal(K)).astype(np.float32)
    w = weight_tensor(device, name, random_blocks(name, m, K, rng, scale=0.5), (K, m))
    tx, tnw = tensor_from_numpy(device, x0), tensor_from_numpy(device, nw)
    cur = Tensor.empty(device, "F32", (K, n_tokens))
    ys = [Tensor.empty(device, "F32", (m, n_tokens)) for _ in range(2)]
    try:
        with CommandSequence(device) as seq:
            with seq.record():
                rms_norm(seq, tx, cur, 1e-6, tnw)
                matmul(seq, w, cur, ys[0])
            seq.run()
        with CommandSequence(device) as seq:
            with seq.record():
                norm_in = norm_input(seq, tx, None, tnw, 1e-6, cur)
                assert norm_in is not None
                matmul(seq, w, cur, ys[1], norm_in=norm_in)
            seq.run()
        want, got = (read_tensor(y).view(np.uint32) for y in ys)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(read_tensor(tx), x0.reshape(read_tensor(tx).shape))
    finally:
        for t in (w, tx, tnw, cur, *ys):
            t.close()


def test_norm_alone_goes_without_routing_and_add_with(device):
    """A norm alone with routing, or the router's add without, is refused by name."""
    _needs_prologue(device, device.tuning.mv_wg)
    K = 64
    rng = np.random.default_rng(1)
    w = tensor_from_numpy(device, rng.standard_normal((8, K)).astype(np.float32))
    x, r, nw = (tensor_from_numpy(device, rng.standard_normal(K).astype(np.float32)) for _ in range(3))
    cur, y = Tensor.empty(device, "F32", (K, 1)), Tensor.empty(device, "F32", (8, 1))
    try:
        with CommandSequence(device) as seq, seq.record():
            with pytest.raises(UnsupportedShape, match="go with routing"):
                matmul(seq, w, cur, y, norm_in=NormInput(x, r, nw, 1e-6))
    finally:
        for t in (w, x, r, nw, cur, y):
            t.close()
