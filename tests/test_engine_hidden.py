"""Engine.hidden_states: every token's normed final state, the input of the output matrix (the
logits the same engine computes are those states times the output weights), continued across
micro-batches and sequences like eval; the pooling and norms of vkrt.engine.pooling."""

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize
from models import tiny_model

from vkrt.engine.engine import Engine
from vkrt.engine.pooling import default_pooling, normalize, pool
from vkrt.model.loader import Model

PROMPT = list(range(3, 40))   # 37 tokens: a padded prompt step


def _output_matrix(path: str) -> np.ndarray:
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    t = tensors.get("output.weight", tensors["token_embd.weight"])
    return dequantize(t.data, t.tensor_type).astype(np.float64).reshape(int(t.shape[1]), int(t.shape[0]))


@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-qwen35"])
def test_hidden_states_are_the_output_matrix_input(device, tmp_path, name):
    path = tiny_model(name, tmp_path)
    with Model(device, path, progress=False) as m, Engine(m, n_ctx=256, n_ubatch=16, n_seq_max=2) as e:
        logits = e.eval(PROMPT, seq_id=0, all_logits=True)
        hidden = e.hidden_states(PROMPT, seq_id=1)   # 3 micro-batches of 16
        assert hidden.shape == (len(PROMPT), m.cfg.n_embd) and e.sequence_length(1) == len(PROMPT)
        assert np.isfinite(hidden).all() and np.abs(hidden).max() > 0.1
        want = hidden.astype(np.float64) @ _output_matrix(path).T
        np.testing.assert_allclose(logits, want, rtol=0, atol=2e-3 * np.abs(want).max())
        # continuing the sequence gives the states of the next tokens, as eval's logits
        more = e.hidden_states([5, 6], seq_id=1)
        e.reset(1)
        again = e.hidden_states(PROMPT + [5, 6], seq_id=1)
        np.testing.assert_allclose(again[-2:], more, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(again[:-2], hidden, rtol=1e-4, atol=1e-4)


def test_pooling_and_norms():
    rows = np.array([[3.0, 4.0], [1.0, -2.0], [0.0, 6.0]], np.float32)
    np.testing.assert_allclose(pool(rows, "mean"), [[4 / 3, 8 / 3]], rtol=1e-6)
    np.testing.assert_array_equal(pool(rows, "cls"), rows[:1])
    np.testing.assert_array_equal(pool(rows, "last"), rows[2:])
    np.testing.assert_array_equal(pool(rows, "none"), rows)
    with pytest.raises(ValueError, match="rank"):
        pool(rows, "rank")
    np.testing.assert_allclose(normalize(rows[0], 2), [0.6, 0.8], rtol=1e-6)
    np.testing.assert_allclose(normalize(rows[0], 1), [3 / 7, 4 / 7], rtol=1e-6)
    np.testing.assert_allclose(normalize(rows[0], -1), rows[0])
    np.testing.assert_allclose(normalize(rows[1], 0), [1 / 2 * 32760, -32760], rtol=1e-6)
    np.testing.assert_allclose(normalize(rows[0], 3), rows[0] / (27 + 64) ** (1 / 3), rtol=1e-6)
    np.testing.assert_array_equal(normalize(np.zeros(2), 2), [0, 0])
    assert default_pooling({"llama.pooling_type": 1}, "llama") == "mean"
    assert default_pooling({"qwen3.pooling_type": 3}, "qwen3") == "last"
    assert default_pooling({}, "llama") == "none"
