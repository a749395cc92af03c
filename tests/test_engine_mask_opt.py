"""Flash attention's mask_opt inside a model: layers attending through the same mask share one
pre-pass, and the logits are bit-identical with mask_opt forced off."""

import numpy as np

from models import tiny_model
from vkrt.engine.engine import Engine
from vkrt.model.loader import Model


def test_shared_pre_pass_and_bit_identical_logits(device, tmp_path, device_env):
    path = tiny_model("tiny-gemma3", tmp_path)  # 5 sliding-window layers + 1 global: two masks
    prompt = list(range(3, 250)) * 2
    logits, dispatches = [], []
    for flag in ("0", "1"):
        device_env("VKRT_FA_MASK_OPT", flag)
        with Model(device, path, progress=False) as m, Engine(m, n_ctx=1024, n_ubatch=256) as e:
            logits.append(e.eval(prompt, all_logits=True))
            graph = next(iter(e.steps.graphs.values()))
            dispatches.append(sum(seq.dispatch_count for seq in graph.seqs))
            classified = [key for key in e.scratch.work._current if key[0] == "mask_opt blocks"]
            assert len(classified) == (2 if flag == "1" else 0)   # one block table a mask
    assert dispatches[1] - dispatches[0] == 2   # a pre-pass a mask, not one a layer
    np.testing.assert_array_equal(logits[0], logits[1])
