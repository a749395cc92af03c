"""Flash attention's mask_opt inside a model: layers attending through the same mask share one
pre-pass, and the logits are bit-identical with mask_opt forced off."""

import numpy as np

from models import tiny_model
from vkrt.engine.engine import Engine
from vkrt.model.loader import Model


def test_shared_pre_pass_and_bit_identical_logits(device, tmp_path, device_env):
    path = tiny_model("tiny-gemma3", tmp_path)  # 5 sliding-window layers + 1 global: two masks
    prompt = list(range(3, 250)) * 2
    logits = []
    for flag in ("0", "1"):
        device_env("VKRT_FA_MASK_OPT", flag)
        with Model(device, path, progress=False) as m, Engine(m, n_ctx=1024, n_ubatch=256) as e:
            logits.append(e.eval(prompt, all_logits=True))
            graph = next(iter(e._graphs.values()))
            owners = [k for k in graph.keep if k.mask_opt and k._shared is None]
            sharing = [k for k in graph.keep if k._shared is not None]
            if flag == "1":
                assert len(owners) == 2 and len(sharing) == 4
            else:
                assert not owners and not sharing
    np.testing.assert_array_equal(logits[0], logits[1])
