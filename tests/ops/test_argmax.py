"""argmax (greedy sampling on the GPU) against numpy's argmax: first index on ties, NaN never wins."""

import numpy as np
import pytest

from vkrt.commands import read_tensor, run_once, tensor_from_numpy
from vkrt.errors import UnsupportedShape
from vkrt.memory import Tensor
from vkrt.ops.argmax import MAX_PARTS, argmax


def gpu_argmax(device, row: np.ndarray) -> tuple[int, int]:
    x = tensor_from_numpy(device, row.astype(np.float32))
    part = Tensor.empty(device, "I32", (2 * MAX_PARTS,))
    out, out2 = Tensor.empty(device, "I32", (3,)), Tensor.empty(device, "I32", (2,))
    try:
        run_once(device, lambda seq: argmax(seq, x, part, out.slice(0, 1, 2), out2.slice(0, 1, 2)))
        return int(read_tensor(out)[1]), int(read_tensor(out2)[1])
    finally:
        for t in (x, part, out, out2):
            t.close()


@pytest.mark.parametrize("n", [1, 7, 1000, 49152, 262144 + 3])
def test_matches_numpy(device, n):
    rng = np.random.default_rng(n)
    row = rng.standard_normal(n).astype(np.float32)
    assert gpu_argmax(device, row) == (int(np.argmax(row)),) * 2


def test_ties_nan_and_inf(device):
    row = np.full(5000, -np.inf, np.float32)
    assert gpu_argmax(device, row)[0] == 0          # all -inf: the first
    row[[17, 4000, 4500]] = 3.0                      # ties across partial workgroups: the first
    row[10] = np.nan
    assert gpu_argmax(device, row)[0] == 17
    row[4999] = np.inf
    assert gpu_argmax(device, row)[0] == 4999


def test_bad_operands_are_refused(device):
    x = Tensor.empty(device, "F32", (8, 2))
    part = Tensor.empty(device, "I32", (4,))
    out = Tensor.empty(device, "I32", (1,))
    try:
        with pytest.raises(UnsupportedShape, match="contiguous F32 vector"):
            run_once(device, lambda seq: argmax(seq, x, part, out))
        with pytest.raises(UnsupportedShape, match="scratch"):
            run_once(device, lambda seq: argmax(seq, x.slice(1, 0, 1).view((8,)), part, out))
    finally:
        for t in (x, part, out):
            t.close()
