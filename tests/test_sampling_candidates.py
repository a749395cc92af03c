"""Top-k sampling from the best logits the GPU picks (Engine.candidates): the same candidates as
the whole row, and the same draws as the host sampler over the whole row for the same seed."""

import numpy as np
import pytest

from models import tiny_model
from vkrt.engine import generate as generate_mod
from vkrt.engine.engine import Engine
from vkrt.engine.readback import CANDIDATES
from vkrt.engine.generate import generate
from vkrt.engine.sampler import Sampler, SamplingParams
from vkrt.errors import VkrtError
from vkrt.model.loader import Model

PROMPT = [5, 9, 2, 11, 3, 7, 1, 4]


def best(row: np.ndarray, k: int) -> np.ndarray:
    """The ids of the k largest logits of a row, best first (ties: the lower id)."""
    return np.lexsort((np.arange(row.size), -row.astype(np.float64)))[:k]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen35moe"])
def test_candidates_are_the_best_of_the_row(device, tmp_path, name):
    path = tiny_model(name, tmp_path)
    with Model(device, path, progress=False) as m, Engine(m, n_ctx=128, n_ubatch=16) as e:
        e.eval(PROMPT[:-1])
        values, ids = e.candidates(PROMPT[-1])
        e.reset()
        row = e.eval(PROMPT)
        k = min(CANDIDATES, row.size)
        order = best(row, k)
        assert ids.tolist() == order.tolist()
        np.testing.assert_array_equal(values, row[order])


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gemma3", "tiny-qwen35"])
def test_generation_draws_as_the_host_sampler(device, tmp_path, monkeypatch, name):
    path = tiny_model(name, tmp_path)
    params = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, min_p=0.02, seed=7)
    with Model(device, path, progress=False) as m, Engine(m, n_ctx=128, n_ubatch=16) as e:
        steps = e.stats.steps
        gpu = generate(e, PROMPT, 12, params)
        assert any(key.top for key in e.steps.graphs), "the candidates path was not taken"
        e.reset()
        monkeypatch.setattr(generate_mod, "CANDIDATES", 0)   # the whole row on the host
        host = generate(e, PROMPT, 12, params)
        assert gpu.tokens == host.tokens and len(gpu.tokens) == 12
        assert e.stats.steps > steps


def test_sampler_refuses_what_candidates_cannot_give():
    greedy = Sampler(SamplingParams(temperature=0.0))
    assert greedy.takes_candidates(64) and greedy.sample_top(np.array([3.0, 3.0], np.float32), np.array([9, 4])) == 9
    for params in (SamplingParams(top_k=0), SamplingParams(top_k=65), SamplingParams(repeat_penalty=1.1),
                   SamplingParams(temperature=0.0, repeat_penalty=1.1)):
        s = Sampler(params)
        assert not s.takes_candidates(64)
        with pytest.raises(VkrtError, match="candidates"):
            s.sample_top(np.zeros(64, np.float32), np.arange(64))


@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-qwen35"])
def test_batched_candidates_match_batched_rows(device, tmp_path, name):
    """decode_candidates (the server's batched step) gives each sequence the best logits of the
    row decode() would have returned."""
    path = tiny_model(name, tmp_path)
    with Model(device, path, progress=False) as m, Engine(m, n_ctx=128, n_ubatch=16, n_seq_max=3) as e:
        outs = []
        for candidates in (False, True):
            e.reset()
            for s in range(3):
                e.eval(PROMPT[s:], seq_id=s)
            batch = [(0, 3), (1, 8), (2, 5)]
            outs.append(e.decode_candidates(batch) if candidates else e.decode(batch))
        rows, (values, ids) = outs
        for r in range(3):
            k = ids.shape[1]
            order = best(rows[r], k)
            assert ids[r].tolist() == order.tolist()
            np.testing.assert_array_equal(values[r], rows[r][order])
        with pytest.raises(VkrtError, match="decode_candidates takes"):
            e.decode_candidates([])


def test_adjusted_candidates_match_the_adjusted_row(device, tmp_path):
    """decode_candidates with logit bias / penalties / DRY applied on the GPU gives the best of the
    row the host adjusts, bit for bit; a row without adjustments in the same batch is untouched."""
    from vkrt.engine.logit_adjust import logit_adjustments

    path = tiny_model("tiny-qwen3", tmp_path)
    params = SamplingParams(repeat_penalty=1.4, frequency_penalty=0.5, presence_penalty=0.3,
                            logit_bias=((5, -np.inf), (6, 3.0)))
    history = [5, 9, 2, 11, 3, 7, 1, 4, 9, 9, 6]
    adjust = [logit_adjustments(params, history, {12: 0.75}), None]
    with Model(device, path, progress=False) as m, Engine(m, n_ctx=128, n_ubatch=16, n_seq_max=2) as e:
        outs = []
        for candidates in (False, True):
            e.reset()
            for s in range(2):
                e.eval(PROMPT[s:], seq_id=s)
            batch = [(0, 3), (1, 8)]
            outs.append(e.decode_candidates(batch, adjust) if candidates else e.decode(batch))
        assert any(key.adjust for key in e.steps.graphs)
        rows, (values, ids) = outs
        for r in range(2):
            row = adjust[r].apply(rows[r]) if adjust[r] is not None else rows[r]
            order = best(row, ids.shape[1])
            assert ids[r].tolist() == order.tolist()
            np.testing.assert_array_equal(values[r], row[order])
        assert 5 not in ids[0].tolist()


def test_penalised_generation_draws_as_the_host_sampler(device, tmp_path, monkeypatch):
    """Sampling with penalties, logit bias and DRY takes the GPU candidates (adjusted there) and
    draws what the host sampler draws from whole rows."""
    path = tiny_model("tiny-llama", tmp_path)
    params = SamplingParams(temperature=0.8, top_k=20, repeat_penalty=1.2, presence_penalty=0.4,
                            logit_bias=((3, -2.0),), dry_multiplier=0.8, seed=11)
    with Model(device, path, progress=False) as m, Engine(m, n_ctx=128, n_ubatch=16) as e:
        gpu = generate(e, PROMPT, 16, params)
        assert any(key.adjust for key in e.steps.graphs), "the adjusted candidates path was not taken"
        e.reset()
        monkeypatch.setattr(generate_mod, "CANDIDATES", 0)
        host = generate(e, PROMPT, 16, params)
        assert gpu.tokens == host.tokens and len(gpu.tokens) == 16
