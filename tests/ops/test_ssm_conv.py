"""ssm_conv (causal depthwise conv1d with state, fused SiLU) against a float64 numpy reference."""

import dataclasses

import numpy as np
import pytest

from vkrt.commands import read_tensor, run_once, tensor_from_numpy, write_tensor
from vkrt.device import TABLE, Arch
from vkrt.errors import GGMLTypeError, OutOfRange
from vkrt.ops.ssm_conv import ssm_conv

K = 4


def conv_ref(x, w, state, slots, n_seqs):
    """x: (T, C); w: (C, K); state: (n_slots, K-1, C), advanced in place. Returns out (T, C)."""
    seq_len = x.shape[0] // n_seqs
    out = np.empty(x.shape, np.float64)
    for q, slot in enumerate(slots):
        window = np.concatenate([state[slot], x[q * seq_len:(q + 1) * seq_len]]).astype(np.float64)
        for i in range(seq_len):
            s = (window[i:i + w.shape[1]] * w.T.astype(np.float64)).sum(axis=0)
            out[q * seq_len + i] = s / (1 + np.exp(-s))
        state[slot] = window[-(w.shape[1] - 1):]
    return out


class ConvCase:
    """Device tensors for one channel count: x as a view with padded columns, the states of
    n_slots sequences as a view into per-slot blocks (another layer's taps and padding around)."""

    def __init__(self, device, rng, channels, n_tokens, n_slots, n_kernel=K, pad=5):
        self.c, self.k = channels, n_kernel
        self.x_rows = (rng.standard_normal((n_tokens, channels + pad)) * 2).astype(np.float32)
        self.w = rng.standard_normal((channels, n_kernel)).astype(np.float32)
        self.tap_stride = channels + 3
        self.first = 2 * self.tap_stride + 1                   # element offset of this layer's taps
        self.block = self.first + (n_kernel - 1) * self.tap_stride + 7
        self.blocks = rng.standard_normal((n_slots, self.block)).astype(np.float32)
        self.tx = tensor_from_numpy(device, self.x_rows)
        self.tw = tensor_from_numpy(device, self.w)
        self.ts = tensor_from_numpy(device, self.blocks)
        self.to = tensor_from_numpy(device, np.zeros((n_tokens, channels), np.float32))
        self.tensors = [self.tx, self.tw, self.ts, self.to]

    def x(self, start, stop):
        return self.tx.view((self.c, stop - start), nb=(4, self.x_rows.shape[1] * 4),
                            offset=start * self.x_rows.shape[1] * 4)

    def out(self, start, stop):
        return self.to.view((self.c, stop - start), offset=start * self.c * 4)

    def state_view(self):
        return self.ts.view((self.c, self.k - 1, self.blocks.shape[0]), nb=(4, self.tap_stride * 4, self.block * 4),
                            offset=self.first * 4)

    def tap_index(self):
        """(K-1, C) element indices of the taps inside a slot's block."""
        return self.first + np.arange(self.k - 1)[:, None] * self.tap_stride + np.arange(self.c)[None, :]

    def state_of(self, blocks):
        """(n_slots, K-1, C) taps held in `blocks` (n_slots, block)."""
        return blocks[:, self.tap_index()]

    def with_state(self, blocks, taps):
        blocks = blocks.copy()
        blocks[:, self.tap_index()] = taps
        return blocks

    def run(self, device, slots, start, stop, n_seqs):
        tq = tensor_from_numpy(device, np.asarray(slots, np.int32))
        try:
            run_once(device, lambda seq: ssm_conv(seq, self.x(start, stop), self.tw.view((self.k, self.c)),
                                                  self.state_view(), tq, self.out(start, stop), n_seqs=n_seqs))
        finally:
            tq.close()

    def check(self, device, slots, start, stop, n_seqs):
        """Run tokens start..stop-1 and compare out and every state block with the reference."""
        taps = self.state_of(self.blocks)
        want = conv_ref(self.x_rows[start:stop, :self.c], self.w, taps, slots, n_seqs)
        self.run(device, slots, start, stop, n_seqs)
        np.testing.assert_allclose(read_tensor(self.to)[start:stop], want, rtol=1e-5, atol=1e-5)
        self.blocks = self.with_state(self.blocks, taps)
        np.testing.assert_array_equal(read_tensor(self.ts), self.blocks)   # other slots, padding untouched

    def close(self):
        for t in self.tensors:
            t.close()


@pytest.fixture
def chunk(device, monkeypatch, request):
    """Tokens an invocation walks (the tuning field), so short prompts span several chunks."""
    monkeypatch.setattr(device, "tuning", dataclasses.replace(device.tuning, ssm_conv_chunk=request.param))
    return request.param


@pytest.mark.parametrize("chunk", [3, 5, 64], indirect=True)
@pytest.mark.parametrize("n_seqs,n_tokens", [(1, 1), (1, 2), (1, 13), (3, 21), (5, 5)])
def test_sequences_in_distinct_slots(device, chunk, n_seqs, n_tokens):
    """Prefill-like runs (one sequence, also shorter than K-1), several sequences and decode (one
    token each), in slots that are not the identity; the slots not named stay as they were."""
    rng = np.random.default_rng(n_seqs * 100 + n_tokens)
    case = ConvCase(device, rng, channels=37, n_tokens=n_tokens, n_slots=7)
    try:
        slots = [6, 2, 0, 5, 3][:n_seqs]
        case.check(device, slots, 0, n_tokens, n_seqs)
    finally:
        case.close()


@pytest.mark.parametrize("chunk", [3, 16], indirect=True)
@pytest.mark.parametrize("n_kernel", [2, 4])
def test_continuing_a_sequence_equals_one_call(device, chunk, n_kernel):
    """Prompt in pieces of 7, 1, 2 and 30 tokens (through the state) vs the whole prompt at once."""
    rng = np.random.default_rng(n_kernel)
    case = ConvCase(device, rng, channels=19, n_tokens=40, n_slots=3, n_kernel=n_kernel)
    try:
        start_blocks = case.blocks.copy()
        for start, stop in ((0, 7), (7, 8), (8, 10), (10, 40)):
            case.check(device, [1], start, stop, 1)
        pieces, end_blocks = read_tensor(case.to), read_tensor(case.ts)
        write_tensor(case.ts, start_blocks)
        case.run(device, [1], 0, 40, 1)
        np.testing.assert_array_equal(read_tensor(case.to), pieces)
        np.testing.assert_array_equal(read_tensor(case.ts), end_blocks)
    finally:
        case.close()


def test_model_sized_prefill_and_decode(device):
    """C = 8192 (the 35B model's conv_dim): a 48-token prompt, then 4 sequences decoding a token each."""
    rng = np.random.default_rng(8192)
    case = ConvCase(device, rng, channels=8192, n_tokens=52, n_slots=4)
    try:
        case.check(device, [2], 0, 48, 1)
        case.check(device, [3, 1, 0, 2], 48, 52, 4)
    finally:
        case.close()


def test_under_gcn_tuning(device, monkeypatch):
    """Polaris's table entry: 256-invocation workgroups, its own chunk length."""
    monkeypatch.setattr(device, "tuning", TABLE[Arch.AMD_GCN].resolved(device.profile))
    rng = np.random.default_rng(580)
    case = ConvCase(device, rng, channels=300, n_tokens=40, n_slots=3)
    try:
        case.check(device, [2], 0, 37, 1)
        case.check(device, [0, 2, 1], 37, 40, 3)
    finally:
        case.close()


def test_bad_operands(device):
    rng = np.random.default_rng(1)
    case = ConvCase(device, rng, channels=8, n_tokens=6, n_slots=2)
    tq = tensor_from_numpy(device, np.zeros(2, np.int32))
    tf = tensor_from_numpy(device, np.zeros(2, np.float32))
    w = case.tw.view((K, 8))

    def conv(x=None, weight=w, slots=tq, out=None, n_seqs=2):
        run_once(device, lambda seq: ssm_conv(seq, case.x(0, 6) if x is None else x, weight, case.state_view(),
                                              slots, case.out(0, 6) if out is None else out, n_seqs=n_seqs))
    try:
        with pytest.raises(OutOfRange, match="do not split"):
            conv(n_seqs=4)
        with pytest.raises(GGMLTypeError, match="slots"):
            conv(slots=tf)
        with pytest.raises(OutOfRange, match="weight"):
            conv(weight=case.tw.view((2, 16)))
        with pytest.raises(OutOfRange, match="overlaps"):
            conv(out=case.x(0, 6))
        with pytest.raises(OutOfRange, match="shapes differ"):
            conv(out=case.out(0, 5))
    finally:
        tq.close()
        tf.close()
        case.close()
