"""Image prompts end to end against llama.cpp (tests/data/llama_vision_reference.json, recorded by
scripts/record_llama_vision.py from llama-server b10434 --mmproj): the tiny qwen35 model and its
tiny qwen3vl_merger projector, the image rows in the text model at Qwen's M-RoPE positions.

vkrt's greedy tokens equal llama.cpp's, and its log-probabilities of llama.cpp's top 5 at each
step are within 4e-3 of them (TOL leaves ~3x). TOL is tighter than the text tests' 0.05 on
purpose: exchanging the image's row and column position streams moves them by 0.03-0.045,
sequential positions for image tokens (or text after the image at start + n_tokens instead of
start + max(grid)) by 0.6-0.95, the antialiased position-table resize or Pillow's bicubic image
resize (the encoder's former choices) by 0.9-1.2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from models import tiny_model
from scripts_sha import sha256
from vision_cases import CASES, TEXT_MODEL, case_prompt, follow_reference, image_png, mmproj_file
from vkrt.engine.engine import Engine
from vkrt.engine.generate import generate
from vkrt.engine.media import eval_prompt
from vkrt.engine.sampler import GREEDY
from vkrt.model.loader import Model
from vkrt.model.media_prompt import MARKER, MediaPromptError
from vkrt.model.vision import Vision

REFERENCE = json.loads((Path(__file__).parent / "data" / "llama_vision_reference.json").read_text())
TOL = 0.01


@pytest.fixture(scope="module")
def loaded(device, tmp_path_factory):
    folder = tmp_path_factory.mktemp("vision")
    path, mmproj = tiny_model(TEXT_MODEL, folder), mmproj_file(folder)
    assert sha256(path) == REFERENCE["model_sha256"], "the text model differs from the one llama.cpp answered"
    assert sha256(mmproj) == REFERENCE["mmproj_sha256"], "the projector differs from the one llama.cpp read"
    with Model(device, path, progress=False) as model:
        yield model, path, mmproj


def _prompt(vision, model, case):
    return case_prompt(vision, model, case, MARKER)


@pytest.mark.parametrize("flash", [True, False])
def test_image_prompts_match_llama_cpp(device, loaded, flash):
    """Teacher-forced along llama.cpp's greedy path: our best token is its token at every step
    and our log-probabilities of its top 5 are within TOL."""
    model, path, mmproj = loaded
    vision = Vision(device, mmproj, model.cfg, path)
    with Engine(model, n_ctx=512, n_ubatch=32, flash_attn=flash, vision=vision) as engine:
        for case, ref in zip(CASES, REFERENCE["cases"]):
            engine.reset()
            prompt = _prompt(vision, model, case)
            assert len(prompt) == ref["prompt_n"]
            worst = follow_reference(engine, eval_prompt(engine, prompt), ref, case[0])
            assert worst < TOL, f"{case[0]!r}: log-probabilities differ from llama.cpp's by up to {worst:.4f}"


def test_greedy_generation_matches_llama_cpp(device, loaded):
    """generate() with a MediaPrompt, the image split over micro-batches of 4 rows."""
    model, path, mmproj = loaded
    vision = Vision(device, mmproj, model.cfg, path)
    with Engine(model, n_ctx=512, n_ubatch=4, vision=vision) as engine:
        for case, ref in zip(CASES, REFERENCE["cases"]):
            engine.reset()
            gen = generate(engine, _prompt(vision, model, case), len(ref["tokens"]), GREEDY)
            assert gen.tokens == ref["tokens"], case[0]


def test_prefix_reuse_and_other_image(device, loaded):
    """A sequence holding the prompt up to the middle of the image goes on from there (the rows'
    positions come from the image's start) and gives the whole prompt's logits (the recurrent
    state cannot be cut back: the prefix is read first); another image
    gives other placeholder ids, so a common prefix stops where the images differ."""
    model, path, mmproj = loaded
    vision = Vision(device, mmproj, model.cfg, path)
    with Engine(model, n_ctx=512, n_ubatch=32, vision=vision) as engine:
        prompt = _prompt(vision, model, CASES[0])
        whole = eval_prompt(engine, prompt)
        start, img = prompt.images[0]
        engine.reset()
        eval_prompt(engine, prompt.prefix(start + 3))
        assert engine.sequence_length(0) == start + 3
        np.testing.assert_allclose(eval_prompt(engine, prompt), whole, atol=1e-4 * np.abs(whole).max())
        other = vision.prompt(model.tokenizer, CASES[0][0] + MARKER + CASES[0][2], [image_png(64, 128, 7)], MARKER)
        assert other.tokens[:start] == prompt.tokens[:start] and other.tokens[start] != prompt.tokens[start]
        assert other.tokens[start:start + img.n_tokens] == other.images[0][1].placeholders()
        assert all(t < 0 for t in other.tokens[start:start + img.n_tokens])


def test_marker_count_must_match(device, loaded):
    model, path, mmproj = loaded
    vision = Vision(device, mmproj, model.cfg, path)
    try:
        with pytest.raises(MediaPromptError, match=r"the prompt has 2 media marker\(s\) '<__media__>' for 1 image"):
            vision.prompt(model.tokenizer, MARKER + "a" + MARKER, [image_png(64, 64, 1)], MARKER)
    finally:
        vision.close()


def test_layer_split_reads_images_alike(loaded):
    """Over two logical devices (a layer split: the first embeds the rows, the second receives the
    residual stream) an image prompt gives the one-device logits."""
    from vkrt.device.group import DeviceGroup, parse_device_list
    from vkrt.engine.options import EngineOptions, open_engine
    model0, path, mmproj = loaded
    outs = []
    for spec in ("0", "0,0"):
        with DeviceGroup(parse_device_list(spec)) as group:
            model, engine = open_engine(list(group), path, EngineOptions(n_ctx=256, n_ubatch=16, mmproj=mmproj,
                                                                         progress=False))
            try:
                assert engine.split == (spec == "0,0")
                outs.append(eval_prompt(engine, _prompt(engine.vision, model, CASES[0])))
            finally:
                engine.close()
                model.close()
    np.testing.assert_allclose(outs[1], outs[0], atol=1e-5 * np.abs(outs[0]).max())
