"""vkrt bench at a depth (vkrt/engine/bench.py run_test): the depth is filled once and each later
run starts from it again -- the cells past it forgotten, a recurrent state rewound to its
snapshot there -- which is the state filling it gives, bit for bit: a run's logits after the
return equal the first run's (a KV cache, and qwen35's DeltaNet state)."""

import numpy as np
import pytest

from models import tiny_model
from vkrt.engine.bench import BenchTest, DepthFill, decode_tokens, run_test
from vkrt.engine.engine import Engine
from vkrt.engine.generate import random_tokens
from vkrt.model.loader import Model

DEPTH = 24


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen35"])
def test_each_run_starts_from_the_depth_filled_once(device, tmp_path, name):
    with Model(device, tiny_model(name, tmp_path), progress=False) as m, \
            Engine(m, n_ctx=96, n_ubatch=16) as e:
        vocab = m.cfg.vocab_size
        calls, cuts = [], []
        fill, cut = e.eval, e.truncate
        e.eval = lambda tokens, *a, **k: (calls.append((len(tokens), e.sequence_length(0))), fill(tokens, *a, **k))[1]
        e.truncate = lambda seq, n: (cuts.append((seq, n)), cut(seq, n))[1]
        result = run_test(e, BenchTest(n_prompt=4, n_gen=3, n_depth=DEPTH), repetitions=3)
        assert len(result.samples_ns) == 3
        # the depth once into an empty cache, then each run's prompt right after the depth
        assert calls == [(DEPTH, 0)] + [(4, DEPTH)] * 4 and cuts == [(0, DEPTH)] * 3
        assert e.sequence_length(0) == 0   # reset after the runs
        e.eval, e.truncate = fill, cut

        e.eval(random_tokens(DEPTH, vocab, 1000))
        e.snapshot(0)
        tokens = random_tokens(5, vocab, 7)
        first = [e.eval(tokens[:3])[-1].copy()]
        decode_tokens(e, tokens[3:])
        first.append(e.eval([tokens[0]])[-1].copy())
        for _ in range(2):
            assert e.truncate(0, DEPTH) == DEPTH
            again = [e.eval(tokens[:3])[-1].copy()]
            decode_tokens(e, tokens[3:])
            again.append(e.eval([tokens[0]])[-1].copy())
            for a, b in zip(first, again):
                np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen35"])
def test_a_deeper_test_adds_only_the_tokens_past_the_last_depth(device, tmp_path, name):
    """With a DepthFill the depth stays in the engine after a test, and a deeper test evaluates only
    the tokens past it (each depth is a prefix of the seeded stream: the state is the deeper fill's,
    up to the batching's rounding); a shallower one starts again from an empty cache."""
    with Model(device, tiny_model(name, tmp_path), progress=False) as m, \
            Engine(m, n_ctx=128, n_ubatch=16) as e:
        vocab = m.cfg.vocab_size
        calls = []
        fill_eval = e.eval
        e.eval = lambda tokens, *a, **k: (calls.append((len(tokens), e.sequence_length(0))),
                                          fill_eval(tokens, *a, **k))[1]
        fill = DepthFill()
        run_test(e, BenchTest(n_prompt=0, n_gen=2, n_depth=16), 1, fill=fill)
        assert fill.held == 16 and e.sequence_length(0) == 16
        run_test(e, BenchTest(n_prompt=4, n_gen=0, n_depth=40), 1, fill=fill)
        assert calls == [(16, 0), (24, 16), (4, 40), (4, 40)] and e.sequence_length(0) == 40
        e.eval = fill_eval

        tokens = random_tokens(3, vocab, 9)
        extended = e.eval(tokens)[-1].copy()
        e.reset()
        e.eval(random_tokens(40, vocab, 1000))
        np.testing.assert_allclose(e.eval(tokens)[-1], extended, rtol=1e-3, atol=1e-3)

        e.eval = lambda tokens, *a, **k: (calls.append((len(tokens), e.sequence_length(0))),
                                          fill_eval(tokens, *a, **k))[1]
        calls.clear()
        run_test(e, BenchTest(n_prompt=0, n_gen=2, n_depth=8), 1, fill=fill)
        assert calls == [(8, 0)] and fill.held == 8
        run_test(e, BenchTest(n_prompt=0, n_gen=2), 1, fill=fill)
        assert fill.held == 0 and e.sequence_length(0) == 0


def test_vkrt_bench_fills_each_depth_from_the_last(device, tmp_path, monkeypatch):
    """vkrt bench -d 8,24 -p 4 -n 2: the pp and tg tests share an engine, the depth-8 stream is
    filled once for both, and depth 24 adds its 16 tokens past it; rows as before."""
    import json

    from click.testing import CliRunner

    from vkrt.cli.main import cli
    from vkrt.engine import engine as engine_module
    path = tiny_model("tiny-qwen35", tmp_path)
    calls, made = [], []
    real_eval, real_init = engine_module.Engine.eval, engine_module.Engine.__init__

    def spy_eval(self, tokens, *a, **k):
        calls.append(len(tokens))
        return real_eval(self, tokens, *a, **k)

    def spy_init(self, *a, **k):
        made.append(k.get("n_ctx"))
        real_init(self, *a, **k)
    monkeypatch.setattr(engine_module.Engine, "eval", spy_eval)
    monkeypatch.setattr(engine_module.Engine, "__init__", spy_init)
    result = CliRunner().invoke(cli, ["bench", "-m", path, "-d", "8,24", "-p", "4", "-n", "2", "-r", "1", "-o", "json"])
    assert result.exit_code == 0, result.output
    recs = json.loads(result.output)
    assert [(r["n_depth"], r["n_prompt"], r["n_gen"]) for r in recs] == [(8, 4, 0), (8, 0, 2), (24, 4, 0), (24, 0, 2)]
    assert made == [256] and calls == [8, 4, 4, 16, 4, 4]
