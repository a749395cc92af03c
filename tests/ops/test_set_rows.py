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


QUANT = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL"]


@pytest.mark.parametrize("head_dim", [64, 32])
@pytest.mark.parametrize("cache_type", QUANT)
def test_set_rows_quantised(device, cache_type, head_dim):
    """Quantised rows, byte for byte as gguf.quants (IQ4_NL: ggml's reference, kv_quant_reference),
    at the cells given, the other cells untouched (head 32: rows of one 2-byte aligned block share
    words with their neighbours); rows with ties, zeros and one large value."""
    from kv_quant_reference import quantize_rows

    from vkrt.ops.set_rows import set_rows
    rng = np.random.default_rng(7)
    n_head, n_tok, n_cells = 2, 5, 8
    src = rng.standard_normal((n_tok, n_head, head_dim)).astype(np.float32)
    src[1, 0, :32] = 0.0                                      # a zero block
    src[2, 1, :32] = np.float32(0.5) * np.sign(src[2, 1, :32])  # equal magnitudes: the first is the max
    src[3, 0, 5] = 40.0                                        # one outlier
    src[4] = np.round(src[4] * 8) / 8                          # values on the quantisation grid
    rows = np.array([6, 0, 3, 7, 1], np.int32)
    cache = Tensor.empty(device, cache_type, (head_dim, n_cells, n_head))
    ts, tr = tensor_from_numpy(device, src), tensor_from_numpy(device, rows)
    try:
        before = np.random.default_rng(1).integers(0, 256, (n_head, n_cells, cache.nb[1]), np.uint8)
        write_tensor(cache, before)
        with CommandSequence(device) as seq:
            with seq.record():
                set_rows(seq, ts, tr, cache)
            seq.run()
        got = read_tensor(cache).reshape(n_head, n_cells, -1)
        expect = before.copy()
        for t, r in enumerate(rows):
            expect[:, r, :] = quantize_rows(src[t], cache_type)
        np.testing.assert_array_equal(got, expect)
    finally:
        for t in (cache, ts, tr):
            t.close()
