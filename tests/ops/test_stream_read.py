"""The bandwidth probe (stream_read) against numpy: each invocation's xor of its grid-strided
uvec4s, over lengths that end inside and past an unrolled step."""

import numpy as np
import pytest

from vkrt.commands import download, run_once, upload
from vkrt.errors import OutOfRange
from vkrt.memory import Buffer
from vkrt.ops.stream_read import UNROLL, stream_read


def expected(words: np.ndarray, total: int) -> np.ndarray:
    vec = words.reshape(-1, 4)
    out = np.zeros(total, np.uint32)
    for t in range(total):
        out[t] = np.bitwise_xor.reduce(vec[t::total].reshape(-1)) if t < len(vec) else 0
    return out


@pytest.mark.parametrize("groups,vec4s", [(1, 1), (2, 100), (3, 64 * 3 * UNROLL + 5), (4, 4099)])
def test_stream_read_matches_numpy(device, groups, vec4s):
    rng = np.random.default_rng(vec4s)
    words = rng.integers(0, 1 << 32, vec4s * 4, dtype=np.uint32)
    total = groups * device.tuning.wg_size
    with Buffer(device, words.nbytes, label="src") as src, Buffer(device, 4 * total, label="dst") as dst:
        upload(device, src.range(0, words.nbytes), words)
        got_total = run_once(device, lambda s: stream_read(s, src.range(0, words.nbytes), dst.range(0, 4 * total),
                                                           groups=groups))
        assert got_total == total
        np.testing.assert_array_equal(download(device, dst.range(0, 4 * total), np.uint32), expected(words, total))


def test_stream_read_refuses_a_short_destination(device):
    with Buffer(device, 64, label="src") as src, Buffer(device, 4, label="dst") as dst:
        with pytest.raises(OutOfRange, match="destination holds 4"):
            run_once(device, lambda s: stream_read(s, src.range(0, 64), dst.range(0, 4), groups=1))
