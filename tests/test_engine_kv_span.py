"""The cells a step attends over: with flash attention a power of two (few graphs as a context
grows; the kernel stops at the live cells), with logits bit-identical to covering 256-cell
steps; the non-flash path keeps the 256-cell steps."""

import numpy as np

from models import tiny_model
from vkrt.engine.engine import Engine
from vkrt.engine.step_inputs import KV_STEP
from vkrt.model.loader import Model


def test_span_rule(device, tmp_path):
    with Model(device, tiny_model("tiny-llama", tmp_path), progress=False) as m:
        with Engine(m, n_ctx=2048, n_ubatch=128) as e:
            assert [e.kv_span(u) for u in (1, 256, 257, 513, 1500, 2047)] == [256, 256, 512, 1024, 2048, 2048]
        with Engine(m, n_ctx=2000, n_ubatch=128) as e:
            assert e.kv_span(1500) == 2000
        with Engine(m, n_ctx=2048, n_ubatch=128, flash_attn=False) as e:
            assert e.kv_span(513) == 768
        with Engine(m, n_ctx=8192, n_ubatch=128, n_seq_max=4) as e:   # a server: one span to 4096
            assert [e.kv_span(u) for u in (1, 3000, 5000)] == [4096, 4096, 8192]
            assert e.kv_span(300) == 4096
        with Engine(m, n_ctx=2048, n_ubatch=128, n_seq_max=4) as e:
            assert e.kv_span(300) == 2048


def test_power_of_two_span_keeps_logits_and_graphs(device, tmp_path, monkeypatch):
    path = tiny_model("tiny-qwen3", tmp_path)
    prompt = list(range(3, 240))
    runs = []
    for pow2 in (True, False):
        with Model(device, path, progress=False) as m, Engine(m, n_ctx=1024, n_ubatch=64) as e:
            if not pow2:
                monkeypatch.setattr(e.inputs, "kv_span", lambda used: -(-used // KV_STEP) * KV_STEP)
            rows = [e.eval(prompt)]
            token = int(rows[0].argmax())
            for _ in range(300):   # through cells 240..540: spans 256, 512, 1024 (or 256, 512, 768)
                rows.append(e.eval([token]))
                token = int(rows[-1].argmax())
            spans = sorted({key.n_kv for key in e.steps.graphs})
            runs.append((np.stack(rows), spans))
            monkeypatch.undo()
    assert runs[0][1] == [256, 512, 1024] and runs[1][1] == [256, 512, 768]   # the prompt at 256
    assert runs[0][0].shape[0] == 301 and len(set(runs[0][0].argmax(1))) > 1   # the tokens vary
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
