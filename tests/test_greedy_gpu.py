"""Greedy decoding with the argmax on the GPU (Engine.greedy): the same tokens as the host's argmax
over the logits, pipelined (the next step submitted before a token is read) and not; stopping
early leaves the KV cache (and a recurrent state) holding exactly the evaluated tokens."""

import numpy as np
import pytest

from models import tiny_model
from vkrt.engine.engine import Engine
from vkrt.engine import generate as generate_mod
from vkrt.engine.generate import generate
from vkrt.engine.sampler import GREEDY, SamplingParams
from vkrt.errors import VkrtError
from vkrt.model.loader import Model

PROMPT = [5, 9, 2, 11, 3, 7, 1, 4]


def host_greedy(e, n):
    logits = e.eval(PROMPT)
    out = []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = e.eval([out[-1]])
    return out


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gemma3", "tiny-qwen3moe", "tiny-qwen35moe"])
def test_gpu_greedy_matches_host_argmax(device, tmp_path, name):
    path = tiny_model(name, tmp_path)
    with Model(device, path, progress=False) as m, Engine(m, n_ctx=320, n_ubatch=16) as e:
        want = host_greedy(e, 12)
        for pipeline in ((False, True) if not e.recurrent else (False,)):
            e.reset()
            first = int(np.argmax(e.eval(PROMPT)))
            got = [first, *e.greedy(first, 0, 11, pipeline=pipeline)]
            assert got == want, f"pipeline={pipeline}"
            assert e.sequence_length(0) == len(PROMPT) + 11
        if e.recurrent:
            with pytest.raises(VkrtError, match="cannot be rewound"):
                next(e.greedy(first, 0, 2, pipeline=True))


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen35"])
def test_generate_stops_with_the_cache_holding_what_was_evaluated(device, tmp_path, name):
    """generate() takes the GPU path for greedy sampling; stopped at the 4th token, the cache
    holds the prompt and the 3 tokens before it, and decoding resumes as if never interrupted;
    at a stop token, the cache holds every token before it."""
    path = tiny_model(name, tmp_path)
    with Model(device, path, progress=False) as m, Engine(m, n_ctx=320, n_ubatch=16) as e:
        want = host_greedy(e, 8)
        e.reset()
        seen = []
        gen = generate(e, PROMPT, 8, GREEDY, on_token=lambda t: seen.append(t) or len(seen) == 4)
        assert gen.tokens == want[:4] and gen.stop_reason == "stop"
        assert e.sequence_length(0) == len(PROMPT) + 3
        rest = list(e.greedy(want[3], 0, 4))
        assert rest == want[4:8]
        e.reset()
        stop = next(i for i in range(1, 8) if want[i] not in want[:i])   # the first token not seen before
        gen = generate(e, PROMPT, 8, GREEDY, stop_tokens=[want[stop]])
        assert gen.tokens == want[:stop] and gen.stop_reason == "eos"
        assert e.sequence_length(0) == len(PROMPT) + stop   # the token before the stop was evaluated


def test_repetition_penalty_is_applied_before_the_candidates(device, tmp_path, monkeypatch):
    """A penalty changes the row before the argmax: generate() takes no GPU argmax chain; the GPU
    applies the penalty to the row before picking candidates, with the tokens host sampling over
    whole rows gives."""
    path = tiny_model("tiny-llama", tmp_path)
    params = SamplingParams(temperature=0.0, repeat_penalty=1.3)
    with Model(device, path, progress=False) as m, Engine(m, n_ctx=320, n_ubatch=16) as e:
        steps = e.stats.steps
        gpu = generate(e, PROMPT, 4, params)
        graphs = list(e.steps.graphs)
        assert not any(key.chain for key in graphs) and any(key.adjust for key in graphs)
        assert e.stats.steps - steps == 4
        e.reset()
        monkeypatch.setattr(generate_mod, "CANDIDATES", 0)   # whole rows on the host
        assert generate(e, PROMPT, 4, params).tokens == gpu.tokens


@pytest.mark.parametrize("extra", [{"logit_bias": None}, {"presence_penalty": 1.5}, {"dry_multiplier": 2.0}])
def test_greedy_with_row_changes_skips_the_gpu_argmax(device, tmp_path, extra):
    """Logit bias, presence penalty and DRY change the row before the argmax, so greedy
    generate() does not take the GPU's argmax (the candidates are picked from the adjusted row):
    a banned token never comes."""
    path = tiny_model("tiny-llama", tmp_path)
    with Model(device, path, progress=False) as m, Engine(m, n_ctx=320, n_ubatch=16) as e:
        want = host_greedy(e, 4)
        e.reset()
        if "logit_bias" in extra:
            extra = {"logit_bias": ((want[0], float("-inf")),)}
        gen = generate(e, PROMPT, 4, SamplingParams(temperature=0.0, **extra))
        assert not any(key.chain for key in e.steps.graphs)   # no chained argmax step
        if "logit_bias" in extra:
            assert want[0] not in gen.tokens
