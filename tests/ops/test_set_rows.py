"""Scatter of token rows into a KV cache layout at positions from a tensor."""

import numpy as np
import pytest

from vkrt.commands import CommandSequence, read_tensor, tensor_from_numpy, write_tensor
from vkrt.memory import Tensor


@pytest.mark.parametrize("cache_type", ["F32", "F16"])
def test_set_rows(device, cache_type):
    from vkrt.ops.set_rows import set_rows
    rng = np.random.default_rng(2)
    head_dim, n_head, n_tok, n_cells = 24, 3, 4, 10
    src = rng.standard_normal((n_tok, n_head, head_dim)).astype(np.float32)
    rows = np.array([5, 0, 9, 2], np.int32)
    cache = Tensor.empty(device, cache_type, (head_dim, n_cells, n_head))
    ts, tr = tensor_from_numpy(device, src), tensor_from_numpy(device, rows)
    dt = np.float32 if cache_type == "F32" else np.float16
    try:
        write_tensor(cache, np.zeros((n_head, n_cells, head_dim), dt))
        with CommandSequence(device) as seq:
            with seq.record():
                set_rows(seq, ts, tr, cache)
            seq.run()
            expect = np.zeros((n_head, n_cells, head_dim), dt)
            for t, r in enumerate(rows):
                expect[:, r, :] = src[t].astype(dt)
            np.testing.assert_array_equal(read_tensor(cache), expect)
            write_tensor(tr, np.array([1, 3, 4, 6], np.int32))  # replay at new cells
            seq.run()
            for t, r in enumerate([1, 3, 4, 6]):
                expect[:, r, :] = src[t].astype(dt)
            np.testing.assert_array_equal(read_tensor(cache), expect)
    finally:
        for t in (cache, ts, tr):
            t.close()
