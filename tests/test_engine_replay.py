"""Replay: a step of a shape seen before runs its recorded graphs again; nothing is re-recorded
(Engine.stats.graphs_recorded), and the logits are the same bits as the first time."""

import numpy as np
import pytest

from models import tiny_model
from vkrt.engine.engine import Engine
from vkrt.model.loader import Model

PROMPT = [5, 9, 2, 11, 3, 7, 1, 4, 8, 6, 10, 12, 13, 14, 15, 16, 17, 18, 19, 20]


def steps(e) -> np.ndarray:
    """From an empty cache: a prompt in two ubatches (a full one, a padded rest), decode steps
    one token at a time, greedy chained steps, then candidates of one step."""
    e.reset()
    rows = [e.eval(PROMPT, all_logits=True)]
    token = int(rows[0][-1].argmax())
    for _ in range(4):
        rows.append(e.eval([token])[None])
        token = int(rows[-1][-1].argmax())
    chained = list(e.greedy(token, n=4))
    values, ids = e.candidates(chained[-1])
    return np.concatenate([np.concatenate(rows).reshape(-1), np.array(chained, np.float32), ids.astype(np.float32),
                           values.reshape(-1)])


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3moe"])
def test_replaying_a_step_records_no_graph(device, tmp_path, name):
    path = tiny_model(name, tmp_path)
    with Model(device, path, progress=False) as m, Engine(m, n_ctx=128, n_ubatch=16) as e:
        first = steps(e)
        recorded = e.stats.graphs_recorded
        assert recorded >= 4   # prompt ubatches, decode, two chained parities, candidates
        second = steps(e)
        assert e.stats.graphs_recorded == recorded, "a step of a recorded shape recorded its graphs again"
        np.testing.assert_array_equal(first.view(np.uint32), second.view(np.uint32))


def test_without_replay_every_step_records(device, tmp_path):
    """The counter the test above relies on: replay=False records each step afresh."""
    path = tiny_model("tiny-llama", tmp_path)
    with Model(device, path, progress=False) as m, Engine(m, n_ctx=128, n_ubatch=16, replay=False) as e:
        steps(e)
        recorded = e.stats.graphs_recorded
        steps(e)
        assert e.stats.graphs_recorded >= 2 * recorded - 1 and e.stats.graphs_recorded > recorded + 4
