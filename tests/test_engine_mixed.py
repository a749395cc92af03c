"""Engine.mixed: decode tokens of some sequences and prompt chunks of others in one step give each
part the logits (and candidates) it gets when run alone, the KV cache ends the same, and the
logits rows a step computes come in a few sizes."""

import numpy as np
import pytest
from models import tiny_model

from vkrt.engine.engine import Engine
from vkrt.engine.readback import CANDIDATES
from vkrt.errors import VkrtError
from vkrt.model.loader import Model

PROMPTS = [list(range(3, 40)), list(range(7, 17)), list(range(11, 20)) * 3]   # 37, 10, 27 tokens


def _alone(m):
    """Each prompt evaluated on its own, then one decode step of all three sequences."""
    with Engine(m, n_ctx=1024, n_ubatch=128, n_seq_max=3) as e:
        last = np.stack([e.eval(p, seq_id=k) for k, p in enumerate(PROMPTS)])
        nxt = [int(r.argmax()) for r in last]
        step = e.decode([(k, t) for k, t in enumerate(nxt)])
        return last, nxt, step


@pytest.fixture(scope="module")
def qwen3(device, tmp_path_factory):
    with Model(device, tiny_model("tiny-qwen3", tmp_path_factory.mktemp("mixed")), progress=False) as m:
        yield m


def close(got, want):
    """Equal to float rounding: a part alone may take the mat-vec where the step takes the GEMM."""
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)
    assert got.argmax() == want.argmax()


def test_mixed_step_matches_separate_steps(qwen3):
    last, nxt, step = _alone(qwen3)
    with Engine(qwen3, n_ctx=1024, n_ubatch=128, n_seq_max=3) as e:
        # sequence 0 reads its prompt first; then one step holds its decode token and the other
        # two prompts (one of them in two chunks: the second rides with the decode step)
        close(e.mixed([(0, PROMPTS[0])])[0], last[0])
        rows = e.mixed([(0, [nxt[0]]), (1, PROMPTS[1]), (2, PROMPTS[2][:20])])
        assert rows.shape == (3, qwen3.cfg.vocab_size)
        close(rows[0], step[0])
        close(rows[1], last[1])
        rows = e.mixed([(1, [nxt[1]]), (2, PROMPTS[2][20:])])
        close(rows[0], step[1])
        close(rows[1], last[2])
        assert [e.sequence_length(k) for k in range(3)] == [38, 11, 27]
        values, ids = e.mixed([(2, [nxt[2]])], top=True)
        assert ids.shape == (1, CANDIDATES) and ids[0, 0] == step[2].argmax()
        np.testing.assert_allclose(values[0], np.sort(step[2])[::-1][:CANDIDATES], rtol=1e-4, atol=1e-4)


def test_out_rows_buckets():
    assert [Engine.out_rows(n, 64) for n in (1, 2, 3, 5, 9, 16, 17, 33, 64)] == [1, 2, 4, 8, 16, 16, 32, 48, 64]
    assert Engine.out_rows(17, 20) == 20 and Engine.out_rows(40, 20) == 40


def test_mixed_steps_share_graphs(qwen3):
    """Steps of new lengths and part counts inside one bucket replay one graph."""
    with Engine(qwen3, n_ctx=1024, n_ubatch=128, n_seq_max=4) as e:
        e.mixed([(0, list(range(3, 30))), (1, list(range(3, 25)))])
        n = len(e.steps.graphs)
        e.mixed([(2, list(range(3, 33))), (3, list(range(5, 35)))])
        assert len(e.steps.graphs) == n


def test_mixed_refuses_bad_steps(qwen3, device, tmp_path):
    with Engine(qwen3, n_ctx=256, n_ubatch=32, n_seq_max=2) as e:
        for parts, what in (([], "at least one"), ([(0, [1]), (0, [2])], "one part per sequence"),
                            ([(0, list(range(33)))], "1 to 32 tokens"), ([(0, [])], "at least one a part"),
                            ([(0, [10 ** 7])], "token ids")):
            with pytest.raises(VkrtError, match=what):
                e.mixed(parts)
        assert e.sequence_length(0) == 0
    with Model(device, tiny_model("tiny-qwen35", tmp_path), progress=False) as m, \
            Engine(m, n_ctx=256, n_ubatch=32, n_seq_max=2) as e:
        with pytest.raises(VkrtError, match="recurrent state"):
            e.mixed([(0, [1, 2]), (1, [3])])
        rows = e.mixed([(0, [1]), (1, [3])])   # one token a part: a decode step
        assert rows.shape == (2, m.cfg.vocab_size)
