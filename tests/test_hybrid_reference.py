"""vkrt's logits for the tiny qwen35 / qwen35moe models against the float64 numpy forward pass of
hybrid_reference.py (llama.cpp's graph written out in numpy): one ubatch (the chunked delta rule),
many ubatches (conv and delta-rule state carried across), single-token decode steps after a
chunked prefill, two sequences side by side, and the engine's defaults (F16 KV cache).

vkrt dequantises weights exactly and computes in fp32, so with an F32 KV cache the only
differences from the float64 reference are fp32 rounding, Q8_0 models included: at most 2.6e-5 of
a position's largest |logit| here (the chunked form's worst); TIGHT leaves a margin of ~4x. The
default F16 KV cache rounds K and V (as llama.cpp's does): at most 3.7e-4; F16_KV leaves ~5x.
Each of these changes to the reference fails every test it touches, by 1e-2 to 1: pairing value
heads with key heads h // (Hv / Hk) instead of h % Hk, GQA by h % KV, RoPE on adjacent pairs or
on the whole head, dropping the attention gate, the 1/sqrt(D) of q, softplus or the conv's silu,
decaying S after reading it, sigmoid(z) for silu(z), unnormalised expert weights, an ungated
shared expert, and resetting the conv or delta-rule state every 16 or 64 tokens. Even a 1%
larger RoPE base or a 10x larger norm eps fails every long-prompt test under TIGHT.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import hybrid_reference
from models import HYBRID, tiny_model
from vkrt.engine.engine import Engine
from vkrt.memory import F32
from vkrt.model import delta_net_block
from vkrt.model.loader import Model

SHORT = "User: what is the weather like in Paris today?\nAssistant: sunny."     # 18 tokens
LONG = ("Once upon a time there was a small model that learned to count: one, two, three, 1 2 3 4 5. "
        "It read about the quick brown fox that jumps over the lazy dog, and then it wrote some code:\n"
        "def add(a, b):\n    return a + b\n\n"
        "User: what is the capital of France?\nAssistant: The capital of France is Paris.\n"
        "User: and the weather today?\nAssistant: sunny, with a light wind from the west.")  # 150 tokens
TIGHT = 1e-4     # normalised error per position, fp32 everywhere (F32 KV cache)
F16_KV = 2e-3    # the same with the default F16 KV cache


@pytest.fixture(scope="module")
def hybrid_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("hybrid-models")


@pytest.fixture(scope="module", params=HYBRID)
def hybrid(request, device, hybrid_dir):
    """(model, {prompt: (tokens, float64 reference logits)}) of one tiny hybrid model."""
    path = tiny_model(request.param, hybrid_dir)
    with Model(device, path, progress=False) as model:
        refs = {}
        for name, text in (("short", SHORT), ("long", LONG)):
            tokens = model.tokenizer.encode(text)
            refs[name] = tokens, hybrid_reference.forward(path, tokens)
        yield model, refs


@pytest.fixture
def delta_forms(device, monkeypatch):
    """The delta rule's chunked form from 64 tokens a sequence (GPUs' choice; lavapipe's tuning
    entry never takes it); returns the list of forms recorded (True: chunked)."""
    monkeypatch.setattr(device, "tuning", dataclasses.replace(device.tuning, gdn_chunk_min_tokens=64))
    forms, delta_net = [], delta_net_block.delta_net

    def spy(*args, **kwargs):
        forms.append(delta_net(*args, **kwargs))
        return forms[-1]

    monkeypatch.setattr(delta_net_block, "delta_net", spy)
    return forms


def expected_forms(n_tokens: int, n_ubatch: int) -> set[bool]:
    """Which forms of the delta rule the ubatches of one prompt take (chunked from 64 tokens)."""
    return {min(n_ubatch, n_tokens - u0) >= 64 for u0 in range(0, n_tokens, n_ubatch)}


def normalised_error(ours: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Per position: max |ours - ref| / max |ref|."""
    return np.abs(ours - ref).max(axis=-1) / np.abs(ref).max(axis=-1)


def check_logits(ours: np.ndarray, ref: np.ndarray, tol: float, what: str) -> None:
    """Every position within `tol`, and the same top token wherever the reference's lead over
    its runner-up is wider than the error allows."""
    assert ours.shape == ref.shape, what
    err = normalised_error(ours, ref)
    worst = int(err.argmax())
    assert err[worst] < tol, f"{what}: position {worst} is off by {err[worst]:.2e} of its largest logit (tol {tol})"
    top2 = np.sort(ref, axis=-1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 2 * tol * np.abs(ref).max(axis=-1)
    assert clear.mean() >= 0.5, f"{what}: the reference's top token is too close to call at most positions"
    mismatch = np.flatnonzero(clear & (ours.argmax(-1) != ref.argmax(-1)))
    assert mismatch.size == 0, f"{what}: top token differs at positions {mismatch.tolist()}"


@pytest.mark.parametrize("n_ubatch", [256, 64, 16])
@pytest.mark.parametrize("prompt", ["short", "long"])
def test_prompt_logits(hybrid, delta_forms, prompt, n_ubatch):
    """Every position's logits of one prompt. Long prompt: 256, one ubatch (the chunked delta
    rule: 64, 64 and 22 tokens); 64, chunks continuing from a carried state, then a recurrent
    tail; 16, recurrent ubatches. The short prompt (18 tokens) is recurrent throughout."""
    model, refs = hybrid
    tokens, ref = refs[prompt]
    with Engine(model, n_ctx=256, n_ubatch=n_ubatch, kv_type=F32) as engine:
        ours = engine.eval(tokens, all_logits=True)
    assert set(delta_forms) == expected_forms(len(tokens), n_ubatch)
    check_logits(ours, ref, TIGHT, f"{prompt} prompt, n_ubatch {n_ubatch}")


def test_decode_after_chunked_prefill(hybrid, delta_forms):
    """A 140-token prefill in one ubatch (chunked), then ten single-token steps reading its state."""
    model, refs = hybrid
    tokens, ref = refs["long"]
    n = 140
    with Engine(model, n_ctx=256, n_ubatch=256, kv_type=F32) as engine:
        prefill = engine.eval(tokens[:n], all_logits=True)
        steps = np.stack([engine.eval([t]) for t in tokens[n:]])
    n_linear = len(model.cfg.linear_layers)   # forms are recorded per layer, once per graph shape
    assert all(delta_forms[:n_linear]) and delta_forms[n_linear:] and not any(delta_forms[n_linear:])
    check_logits(prefill, ref[:n], TIGHT, "prefill")
    check_logits(steps, ref[n:], TIGHT, "decode steps")


def test_two_sequences(hybrid, delta_forms):
    """Two sequences in one engine keep separate states: prompts evaluated one after the other
    (the long one in chunked ubatches of 64 and a recurrent tail), then a decode step of both."""
    model, refs = hybrid
    (short, short_ref), (long, long_ref) = refs["short"], refs["long"]
    with Engine(model, n_ctx=256, n_ubatch=64, kv_type=F32, n_seq_max=2) as engine:
        first = engine.eval(long[:-1], seq_id=0, all_logits=True)
        second = engine.eval(short[:-1], seq_id=1, all_logits=True)
        both = engine.decode([(0, long[-1]), (1, short[-1])])
    assert set(delta_forms) == {True, False}
    check_logits(first, long_ref[:-1], TIGHT, "sequence 0")
    check_logits(second, short_ref[:-1], TIGHT, "sequence 1")
    check_logits(both, np.stack([long_ref[-1], short_ref[-1]]), TIGHT, "decode of both")


def test_default_f16_kv_cache(hybrid):
    """The engine's defaults (F16 KV cache, as llama.cpp's) on the long prompt in one ubatch."""
    model, refs = hybrid
    tokens, ref = refs["long"]
    with Engine(model, n_ctx=256, n_ubatch=256) as engine:
        ours = engine.eval(tokens, all_logits=True)
    check_logits(ours, ref, F16_KV, "F16 KV cache")
