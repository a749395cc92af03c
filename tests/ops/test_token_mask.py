"""GPU token masks against the host's (vkrt/ops/token_mask.py apply_mask_host), bit for bit."""

import numpy as np

from vkrt.commands import read_tensor, run_once, tensor_from_numpy
from vkrt.ops.token_mask import apply_mask_host, mask_words, pack_masks, token_mask


def test_matches_the_host_bit_for_bit(device):
    rng = np.random.default_rng(5)
    vocab, rows = 1000, 4   # not a multiple of 32: the last word's high bits name no token
    logits = rng.standard_normal((rows, vocab)).astype(np.float32) * 4
    words = mask_words(vocab)
    sparse = np.zeros(words, np.uint32)
    sparse[[0, 7, words - 1]] = [0b1011, 1 << 31, 0xFFFFFFFF]
    dense = rng.integers(0, 2 ** 32, words, dtype=np.uint64).astype(np.uint32)
    dense[3] = 0xFFFFFFFF
    masks = [sparse, None, dense, np.full(words, 0xFFFFFFFF, np.uint32)]
    x = tensor_from_numpy(device, logits)
    t = tensor_from_numpy(device, pack_masks(rows, vocab, masks).view(np.int32))
    try:
        run_once(device, lambda seq: token_mask(seq, x, t))
        got = read_tensor(x)
    finally:
        x.close()
        t.close()
    for r in range(rows):
        want = logits[r] if masks[r] is None else apply_mask_host(logits[r], masks[r])
        np.testing.assert_array_equal(got[r].view(np.uint32), want.view(np.uint32))
    assert np.flatnonzero(np.isfinite(got[0])).tolist() == [0, 1, 3, 7 * 32 + 31] + list(range(992, 1000))
    np.testing.assert_array_equal(got[1], logits[1])
    np.testing.assert_array_equal(got[3], logits[3])
