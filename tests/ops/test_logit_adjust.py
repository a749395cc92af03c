"""GPU logit adjustments against the host's (vkrt/engine/logit_adjust.py), bit for bit."""

import numpy as np

from vkrt.commands import read_tensor, run_once, tensor_from_numpy
from vkrt.engine.logit_adjust import logit_adjustments
from vkrt.engine.sampler import SamplingParams
from vkrt.ops.logit_adjust import logit_adjust, pack_table


def test_matches_the_host_bit_for_bit(device):
    rng = np.random.default_rng(3)
    vocab, cap = 300, 40
    logits = rng.standard_normal((3, vocab)).astype(np.float32) * 4
    logits[0, :5] = [0.0, -0.0, 1e-30, -1e-30, 5.0]
    history = rng.integers(0, vocab, 30).tolist() + [0, 1, 2, 3, 0, 0]
    params = [SamplingParams(repeat_penalty=1.3, frequency_penalty=0.3, presence_penalty=0.7,
                             logit_bias=((4, -np.inf), (9, 2.5), (9, 0.25))),
              SamplingParams(repeat_penalty=0.9, repeat_last_n=8, logit_bias=((299, 1.0),)),
              SamplingParams()]
    dry = [{7: 1.5, 11: 0.75}, None, None]
    adjs = [logit_adjustments(p, history, d) for p, d in zip(params, dry)]
    assert adjs[2] is None and len(adjs[0]) > 20
    x = tensor_from_numpy(device, logits)
    t = tensor_from_numpy(device, pack_table(3, cap, [a.words() if a else None for a in adjs]).view(np.int32))
    try:
        run_once(device, lambda seq: logit_adjust(seq, x, t, cap))
        got = read_tensor(x)
    finally:
        x.close()
        t.close()
    for r in range(3):
        want = adjs[r].apply(logits[r]) if adjs[r] is not None else logits[r]
        np.testing.assert_array_equal(got[r].view(np.uint32), want.view(np.uint32))
    assert got[0, 4] == -np.inf and not np.array_equal(got[0], logits[0])
