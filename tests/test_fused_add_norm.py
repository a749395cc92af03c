"""Fusing each block's residual add into the next RMS norm is lossless: logits bit for bit equal
with VKRT_FUSE_ADD_NORM=0 (add, then norm) on every architecture, and two commands fewer a layer."""

import numpy as np
import pytest

from models import tiny_model
from vkrt.engine.engine import Engine
from vkrt.model.loader import Model

PROMPT = [5, 9, 2, 11, 3, 7, 1, 4]


def run(device, path, monkeypatch, fuse: bool):
    monkeypatch.setenv("VKRT_FUSE_ADD_NORM", "1" if fuse else "0")
    with Model(device, path, progress=False) as m, Engine(m, n_ctx=64, n_ubatch=16) as e:
        prefill = e.eval(PROMPT, all_logits=True)
        decode = [e.eval([int(np.argmax(prefill[-1]))])]
        decode.append(e.eval([int(np.argmax(decode[-1]))]))
        dispatches = sum(s.dispatch_count for g in e._graphs.values() for s in g.seqs)
        return np.concatenate([prefill.reshape(-1), *decode]), dispatches, m.cfg.n_layer


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-gemma3", "tiny-qwen3moe",
                                  "tiny-qwen2moe"])
def test_fused_add_norm_is_bit_identical(device, tmp_path, monkeypatch, name):
    path = tiny_model(name, tmp_path)
    fused, n_fused, n_layer = run(device, path, monkeypatch, True)
    plain, n_plain, _ = run(device, path, monkeypatch, False)
    np.testing.assert_array_equal(fused.view(np.uint32), plain.view(np.uint32))
    assert n_plain - n_fused == 2 * n_layer * 2   # two graphs (prefill, decode), one add per block
