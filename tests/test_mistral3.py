"""Ministral 3 / Mistral Small 3.x text (GGUF `mistral3`): llama's layers with the queries'
attention temperature by position and the file's YaRN betas. tiny-mistral3 is recorded against
llama.cpp (tests/test_model_reference.py checks its log-probabilities at every position); here:
what the file's metadata becomes, that the recording notices each feature gone, and clear errors."""

import json
from pathlib import Path

import numpy as np
import pytest
from models import tiny_model

from vkrt.engine.engine import Engine
from vkrt.model.config import ConfigMissing, ModelConfig
from vkrt.model.loader import Model

REFERENCE = json.loads((Path(__file__).parent / "data" / "llama_reference.json").read_text())["tiny-mistral3.gguf"]


def _meta(path: str) -> dict:
    import gguf
    return {k: f.contents() for k, f in gguf.GGUFReader(path).fields.items() if not k.startswith("GGUF.")}


def test_metadata(tmp_path):
    """The temperature's scale and floor (rope.scaling.original_context_length), YaRN with the
    file's betas and llama.cpp's generic magnitude, attention.scale where the file sets it."""
    meta = _meta(tiny_model("tiny-mistral3", tmp_path))
    cfg = ModelConfig.from_metadata(meta, "m.gguf")
    assert (cfg.attn_temp_scale, cfg.attn_temp_floor) == (pytest.approx(0.1), 16)
    assert (cfg.yarn_beta_fast, cfg.yarn_beta_slow, cfg.rope_ext_factor, cfg.rope_scale) == (16.0, 2.0, 1.0, 0.25)
    assert cfg.rope_attn_factor == 1.0 and cfg.attn_scale == pytest.approx(1 / 4)   # head size 16
    assert ModelConfig.from_metadata({**meta, "mistral3.attention.scale": 0.5}, "m.gguf").attn_scale == 0.5
    plain = {k: v for k, v in meta.items() if "temperature" not in k}
    assert ModelConfig.from_metadata(plain, "m.gguf").attn_temp_scale == 0.0
    without_orig = {k: v for k, v in meta.items() if "original_context_length" not in k}
    with pytest.raises(ConfigMissing, match="mistral3.attention.temperature_scale=0.1.* needs "
                                            "mistral3.rope.scaling.original_context_length"):
        ModelConfig.from_metadata(without_orig, "m.gguf")


def _worst(device, path, monkeypatch, change) -> float:
    """The largest difference from llama.cpp's recorded top log-probabilities, every position of
    every recorded completion, with `change` applied to the RoPE fields the config reads."""
    import vkrt.model.config as config
    read = config._rope_scaling
    monkeypatch.setattr(config, "_rope_scaling", lambda *a, **k: change(read(*a, **k)))
    worst = 0.0
    with Model(device, path, progress=False) as model, Engine(model, n_ctx=512, n_ubatch=32) as engine:
        for comp in REFERENCE["completions"]:
            engine.reset()
            n = len(comp["prompt_tokens"])
            logits = engine.eval(comp["prompt_tokens"] + comp["tokens"][:-1], all_logits=True)[n - 1:]
            x = logits.astype(np.float64)
            lp = x - x.max(-1, keepdims=True)
            lp -= np.log(np.exp(lp).sum(-1, keepdims=True))
            for i, tops in enumerate(comp["top_logprobs"]):
                ids, ref = [t for t, _ in tops], np.array([v for _, v in tops])
                worst = max(worst, float(np.abs(lp[i, ids] - ref).max()))
    return worst


def test_the_recording_notices_each_feature(device, tmp_path, monkeypatch):
    """Within a hair of llama.cpp as read; far from it without the temperature or with YaRN's
    default betas (the recorded prompts run past position 16, the temperature's first step)."""
    path = tiny_model("tiny-mistral3", tmp_path)
    assert max(len(c["prompt_tokens"]) + len(c["tokens"]) for c in REFERENCE["completions"]) > 17
    assert _worst(device, path, monkeypatch, lambda f: f) < 0.02
    assert _worst(device, path, monkeypatch, lambda f: {**f, "attn_temp_scale": 0.0}) > 0.2
    assert _worst(device, path, monkeypatch, lambda f: {**f, "yarn_beta_fast": 32.0, "yarn_beta_slow": 1.0}) > 1.0
