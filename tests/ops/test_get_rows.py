"""Embedding row gather for plain and quantised tables, ids from a tensor, chunked bindings."""

import numpy as np
import pytest
from quant_data import IQ, TQ, assert_same_bits, flushed_elements, random_blocks, reference
from gguf.quants import quantize
from gguf.constants import GGMLQuantizationType as Q

from vkrt.commands import CommandSequence, read_tensor, tensor_from_numpy, write_tensor
from vkrt.memory import Tensor


@pytest.mark.parametrize("typ", ["F32", "F16", "Q8_0", "Q4_1", "Q4_K", "Q6_K", *IQ, *TQ])
def test_get_rows_matches_gguf_dequantize(device, typ):
    from vkrt.ops.get_rows import get_rows
    rng = np.random.default_rng(5)
    ne0, n_rows = 256, 37
    x = rng.standard_normal((n_rows, ne0)).astype(np.float32)
    qt = Q[typ]
    if typ in IQ + TQ:
        raw = random_blocks(typ, n_rows, ne0, rng)
    elif typ in ("Q4_K", "Q6_K"):
        from vkrt.model.random_weights import _random_blocks
        raw = _random_blocks(rng, qt, n_rows, ne0)
    elif typ == "F16":
        raw = x.astype(np.float16).view(np.uint8)
    elif typ == "F32":
        raw = x.view(np.uint8)
    else:
        raw = quantize(x, qt)
    ref = reference(typ, raw).reshape(n_rows, ne0).astype(np.float32)
    flushed = flushed_elements(typ, raw, device) if typ in IQ + TQ else None
    table = Tensor.empty(device, typ, (ne0, n_rows))
    ids = np.array([3, 0, 36, 3, 17], np.int32)
    tid = tensor_from_numpy(device, ids)
    out = Tensor.empty(device, "F32", (ne0, len(ids)))
    try:
        write_tensor(table, raw.view(table.type.dtype).reshape(n_rows, ne0) if table.type.dtype is not None
                     else raw.reshape(1, 1, n_rows, -1))
        with CommandSequence(device) as seq:
            with seq.record():
                get_rows(seq, table, tid, out, max_binding=10 * table.nb[1])  # forces 4 row ranges
            seq.run()
            assert_same_bits(read_tensor(out), ref[ids], None if flushed is None else flushed[ids])
            write_tensor(tid, np.array([1, 2, 35, 34, 9], np.int32))  # replay with new ids
            seq.run()
            again = [1, 2, 35, 34, 9]
            assert_same_bits(read_tensor(out), ref[again], None if flushed is None else flushed[again])
    finally:
        for t in (table, tid, out):
            t.close()
