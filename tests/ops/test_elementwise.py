"""fill and add against numpy for odd sizes."""

import numpy as np
import pytest

from vkrt.commands import CommandSequence, download, upload
from vkrt.memory import allocate
from vkrt.ops.elementwise import add, fill

SIZES = [1, 31, 33, 1000, 4097]


@pytest.mark.parametrize("n", SIZES)
def test_add_matches_numpy(device, n):
    rng = np.random.default_rng(n)
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    ra, rb, ro = (allocate(device, 4 * n + 64, label=x) for x in "abo")
    try:
        upload(device, ra, a)
        upload(device, rb, b)
        upload(device, ro, np.full(n + 16, 77, np.float32))
        with CommandSequence(device) as seq:
            with seq.record():
                add(seq, ra, rb, ro, n)
            seq.run()
        out = download(device, ro, np.float32)
        np.testing.assert_array_equal(out[:n], a + b)
        np.testing.assert_array_equal(out[n:], 77)  # nothing written past n
    finally:
        for r in (ra, rb, ro):
            r.close()


@pytest.mark.parametrize("n", SIZES)
def test_fill_matches_numpy(device, n):
    r = allocate(device, 4 * n + 16, label="fill")
    try:
        upload(device, r, np.zeros(n + 4, np.uint32))
        with CommandSequence(device) as seq:
            with seq.record():
                fill(seq, r, n, 0xDEADBEEF)
            seq.run()
        out = download(device, r, np.uint32)
        assert (out[:n] == 0xDEADBEEF).all() and (out[n:] == 0).all()
    finally:
        r.close()
