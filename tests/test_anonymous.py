"""File regions copied into page-aligned anonymous memory."""

import numpy as np
import pytest

from vkrt.errors import OutOfRange
from vkrt.memory.anonymous import PAGE, AnonymousRegion


def test_reads_region_page_aligned(tmp_path):
    data = np.random.default_rng(0).integers(0, 256, 100_003, dtype=np.uint8)
    path = tmp_path / "blob.bin"
    path.write_bytes(data.tobytes())
    seen = []
    with AnonymousRegion(path, 7, 90_001, chunk=4096, progress=seen.append) as region:
        assert region.address % PAGE == 0
        np.testing.assert_array_equal(region.array, data[7:7 + 90_001])
        assert sum(seen) == 90_001
    with pytest.raises(OutOfRange, match="outside the file"):
        AnonymousRegion(path, 100_000, 10)
