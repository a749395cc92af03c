"""Prompt steps padded to a multiple of PAD_STEP tokens: the padding sees nothing and is seen by
nothing, so logits (bit for bit on lavapipe) and the greedy continuation match the unpadded run,
and prompts of new lengths in one bucket reuse one recorded graph; no padding where it would have
side effects."""

import numpy as np
from models import tiny_model

from vkrt.engine.engine import Engine
from vkrt.engine.step_inputs import PAD_STEP
from vkrt.model.loader import Model


def _run(m, prompts, pad: bool, **kw):
    with Engine(m, n_ctx=1024, n_ubatch=128, n_seq_max=2, **kw) as e:
        if not pad:
            e.inputs.pads = False   # prompt steps run at their length
        out = []
        for k, prompt in enumerate(prompts):
            rows = e.eval(prompt, seq_id=k % 2, all_logits=True)
            token, follow = int(rows[-1].argmax()), []
            for _ in range(4):
                follow.append(token)
                token = int(e.eval([token], seq_id=k % 2).argmax())
            out.append((rows, follow))
        return out, {key.n_tokens for key in e.steps.graphs}


def test_padding_keeps_results_and_shares_graphs(device, tmp_path):
    with Model(device, tiny_model("tiny-qwen3", tmp_path), progress=False) as m:
        prompts = [list(range(3, 40)), list(range(7, 57)), list(range(11, 20)) * 10]   # 37, 50, 90 tokens
        padded, shapes = _run(m, prompts, pad=True)
        exact, exact_shapes = _run(m, prompts, pad=False)
        assert {37, 50, 90} <= exact_shapes and shapes.isdisjoint({37, 50, 90})
        assert {PAD_STEP, 2 * PAD_STEP} <= shapes
        for (rows, follow), (rows_x, follow_x) in zip(padded, exact):
            assert rows.shape == rows_x.shape
            np.testing.assert_array_equal(rows, rows_x)
            assert follow == follow_x


def test_no_padding_where_it_has_side_effects(device, tmp_path):
    with Model(device, tiny_model("tiny-llama", tmp_path), progress=False) as m:
        with Engine(m, n_ctx=256, n_ubatch=128) as e:
            assert [e.padded_tokens(n) for n in (1, 16, 17, 64, 65, 128)] == [1, 16, 64, 64, 128, 128]
        with Engine(m, n_ctx=256, n_ubatch=100) as e:
            assert e.padded_tokens(90) == 100
        with Engine(m, n_ctx=256, n_ubatch=128, flash_attn=False) as e:
            assert e.padded_tokens(17) == 17
        for n_ctx, shape in ((40, 64), (37, 37)):   # the padding shares one free cell; none left: no padding
            with Engine(m, n_ctx=n_ctx, n_ubatch=64) as e:
                e.eval(list(range(3, 40)))
                assert e.sequence_length(0) == 37 and {key.n_tokens for key in e.steps.graphs} == {shape}
    with Model(device, tiny_model("tiny-qwen35", tmp_path), progress=False) as m, \
            Engine(m, n_ctx=256, n_ubatch=128) as e:
        assert e.padded_tokens(40) == 40   # a recurrent state would take the padding in
