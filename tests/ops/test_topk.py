"""Top-k candidates on the GPU against numpy: the k largest logits, best first, ties by index."""

import numpy as np
import pytest

from vkrt.commands import read_tensor, run_once, tensor_from_numpy
from vkrt.errors import UnsupportedShape
from vkrt.memory import Tensor
from vkrt.ops.topk import passes, scratch_words, top_candidates


def gpu_top(device, row: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    x = tensor_from_numpy(device, row.astype(np.float32))
    words = scratch_words(row.size, k)
    scratch = (Tensor.empty(device, "I32", (words,)), Tensor.empty(device, "I32", (words,)))
    out = Tensor.empty(device, "I32", (2 * k,))
    try:
        run_once(device, lambda seq: top_candidates(seq, x, k, scratch, out))
        pairs = read_tensor(out).reshape(k, 2)
        return pairs[:, 0].view(np.float32), pairs[:, 1].view(np.uint32)
    finally:
        for t in (x, *scratch, out):
            t.close()


def reference(row: np.ndarray, k: int):
    order = np.lexsort((np.arange(row.size), -row.astype(np.float64)))[:k]   # value descending, index ascending
    return row[order], order


@pytest.mark.parametrize("n,k", [(1, 1), (100, 40), (2048, 64), (5000, 64), (262144 + 5, 64), (49152, 200)])
def test_matches_numpy(device, n, k):
    rng = np.random.default_rng(n + k)
    row = rng.standard_normal(n).astype(np.float32)
    vals, ids = gpu_top(device, row, k)
    m = min(n, k)
    want_v, want_i = reference(row, m)
    np.testing.assert_array_equal(vals[:m], want_v)
    np.testing.assert_array_equal(ids[:m], want_i.astype(np.uint32))
    assert (ids[m:] == 0xFFFFFFFF).all() and np.isneginf(vals[m:]).all()   # a short row is padded


def test_ties_and_nan(device):
    row = np.zeros(6000, np.float32)
    row[[5, 4100, 3000, 17]] = 2.0
    row[9] = np.nan
    vals, ids = gpu_top(device, row, 6)
    assert ids.tolist() == [5, 17, 3000, 4100, 0, 1] and vals[:4].tolist() == [2.0] * 4


def test_pass_plan_and_errors(device):
    assert passes(262144, 64) == [128, 4, 1] and passes(100, 40) == [1]
    with pytest.raises(UnsupportedShape, match="k must be"):
        passes(100, 0)


def test_rows(device):
    """Several rows at once (a batched decode step), each row its own top k."""
    rng = np.random.default_rng(3)
    rows, n, k = 5, 9000, 40
    logits = rng.standard_normal((rows, n)).astype(np.float32)
    x = tensor_from_numpy(device, logits)
    words = scratch_words(n, k, rows)
    scratch = (Tensor.empty(device, "I32", (words,)), Tensor.empty(device, "I32", (words,)))
    out = Tensor.empty(device, "I32", (2 * k * rows,))
    try:
        run_once(device, lambda seq: top_candidates(seq, x, k, scratch, out))
        pairs = read_tensor(out).reshape(rows, k, 2)
        for r in range(rows):
            want_v, want_i = reference(logits[r], k)
            np.testing.assert_array_equal(pairs[r, :, 1].view(np.uint32), want_i.astype(np.uint32))
            np.testing.assert_array_equal(pairs[r, :, 0].view(np.float32), want_v)
    finally:
        for t in (x, *scratch, out):
            t.close()
