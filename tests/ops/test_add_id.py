"""add_id (a bias chosen per row by an expert id: gpt-oss's expert biases) against numpy."""

import numpy as np
import pytest

from vkrt.commands import read_tensor, run_once, tensor_from_numpy
from vkrt.errors import OutOfRange
from vkrt.memory import Tensor
from vkrt.ops.add_id import add_id


@pytest.mark.parametrize("n, n_expert, n_used, n_tokens, in_place", [(33, 8, 2, 5, False), (64, 32, 4, 3, True),
                                                                     (7, 4, 4, 1, False)])
def test_add_id(device, n, n_expert, n_used, n_tokens, in_place):
    rng = np.random.default_rng(n)
    a = rng.standard_normal((n_tokens, n_used, n)).astype(np.float32)
    b = rng.standard_normal((n_expert, n)).astype(np.float32)
    ids = np.stack([rng.permutation(n_expert)[:n_used] for _ in range(n_tokens)]).astype(np.int32)
    ta, tb, ti = tensor_from_numpy(device, a), tensor_from_numpy(device, b), tensor_from_numpy(device, ids)
    to = ta if in_place else Tensor.empty(device, "F32", (n, n_used, n_tokens))
    try:
        run_once(device, lambda s: add_id(s, ta, tb, ti, to))
        np.testing.assert_array_equal(read_tensor(to), a + b[ids])
        with pytest.raises(OutOfRange, match="b must be"):
            run_once(device, lambda s: add_id(s, ta, tb.view((n - 1,)), ti, to))
    finally:
        for t in {id(x): x for x in (ta, tb, ti, to)}.values():
            t.close()
