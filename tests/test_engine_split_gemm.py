"""The split-K GEMM inside a model (vkrt issue 16): a prompt short enough for one token tile,
through matrices whose row tiles do not fill the device, is cut along K and summed by
split_sum; its logits match the unsplit GEMM's to fp32 rounding and pick the same tokens."""

import dataclasses

import numpy as np
from models import tiny_model

from vkrt.device import Device
from vkrt.engine.engine import Engine
from vkrt.model.loader import Model

PROMPT = [3, 17, 5, 29, 11, 2, 41, 7, 13, 19, 23, 31, 37, 43, 47, 53, 59, 61, 67, 71]


def prompt_logits(path: str, split: bool) -> tuple[np.ndarray, bool]:
    """(every prompt position's logits, whether the split-K partial tiles' buffer was made)."""
    with Device() as dev:
        dev.tuning = dataclasses.replace(dev.tuning, mv_chunk_n=0, mv_max_n=1, mm_split_min_steps=1,
                                         mm_split_groups=1000 if split else 0)
        with Model(dev, path, progress=False) as m, Engine(m, n_ctx=128, n_ubatch=32) as e:
            logits = e.eval(PROMPT, all_logits=True)
            made = any(key == "GEMM split-K partials" for key in e.scratch.work._current)
        return logits, made


def test_split_gemm_prompt_matches_the_unsplit_one(tmp_path):
    path = tiny_model("tiny-llama", tmp_path)
    split, made = prompt_logits(path, True)
    plain, made_plain = prompt_logits(path, False)
    assert made and not made_plain
    assert split.shape == plain.shape == (len(PROMPT), split.shape[1])
    assert not np.array_equal(split, plain)   # other sums: the split ran
    np.testing.assert_allclose(split, plain, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(split.argmax(1), plain.argmax(1))
