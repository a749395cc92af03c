"""Gemma 3 image prompts end to end against llama.cpp (tests/data/llama_vision_reference_gemma3.json,
recorded by scripts/record_llama_vision.py --set gemma3 from llama-server b10434 --mmproj): the
tiny gemma3 model and its tiny SigLIP projector, each image framed by <start_of_image> and
<end_of_image> (text in the tiny vocabulary), its 16 rows read with attention among all of them.

vkrt's greedy tokens equal llama.cpp's and its log-probabilities of llama.cpp's top 5 at each
step are within 1.3e-3 of them (TOL leaves ~8x). Reading the rows causally instead moves them by
0.25-0.45, resizing the images without keeping their aspect (stretched) by 1.0-1.7, clip's other
bilinear resize (corners not aligned) by 0.24-0.33; the tiny model repeats one token, so the
log-probabilities carry the comparison."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from models import tiny_model
from scripts_sha import sha256
from vision_cases import SETS, case_prompt, follow_reference, gemma3_mmproj_file, image_png
from vkrt.engine.engine import Engine
from vkrt.engine.generate import generate
from vkrt.engine.kv_cache import CellTable
from vkrt.engine.media import eval_prompt
from vkrt.engine.sampler import GREEDY
from vkrt.model.loader import Model
from vkrt.model.media_prompt import MARKER
from vkrt.model.mmproj_synthetic import MmprojSpec, write_mmproj
from vkrt.model.vision import Vision

VS = SETS["gemma3"]
REFERENCE = json.loads((Path(__file__).parent / "data" / VS.reference).read_text())
TOL = 0.01


@pytest.fixture(scope="module")
def loaded(device, tmp_path_factory):
    folder = tmp_path_factory.mktemp("vision-gemma3")
    path, mmproj = tiny_model(VS.text_model, folder), gemma3_mmproj_file(folder)
    assert sha256(path) == REFERENCE["model_sha256"], "the text model differs from the one llama.cpp answered"
    assert sha256(mmproj) == REFERENCE["mmproj_sha256"], "the projector differs from the one llama.cpp read"
    with Model(device, path, progress=False) as model:
        yield model, path, mmproj, folder


def _prompt(vision, model, case):
    return case_prompt(vision, model, case, MARKER)


@pytest.mark.parametrize("flash", [True, False])
def test_image_prompts_match_llama_cpp(device, loaded, flash):
    """Teacher-forced along llama.cpp's greedy path: our best token is its token at every step
    and our log-probabilities of its top 5 are within TOL."""
    model, path, mmproj, _ = loaded
    vision = Vision(device, mmproj, model.cfg, path)
    with Engine(model, n_ctx=512, n_ubatch=32, flash_attn=flash, vision=vision) as engine:
        for case, ref in zip(VS.cases, REFERENCE["cases"]):
            engine.reset()
            prompt = _prompt(vision, model, case)
            assert len(prompt) == ref["prompt_n"]
            assert prompt.images[0][1].n_tokens == 16
            worst = follow_reference(engine, eval_prompt(engine, prompt), ref, case[0])
            assert worst < TOL, f"{case[0]!r}: log-probabilities differ from llama.cpp's by up to {worst:.4f}"


def test_greedy_generation_matches_llama_cpp(device, loaded):
    model, path, mmproj, _ = loaded
    vision = Vision(device, mmproj, model.cfg, path)
    with Engine(model, n_ctx=512, n_ubatch=16, vision=vision) as engine:
        for case, ref in zip(VS.cases, REFERENCE["cases"]):
            engine.reset()
            assert generate(engine, _prompt(vision, model, case), len(ref["tokens"]), GREEDY).tokens == ref["tokens"]


def test_bidirectional_mask():
    """CellTable.mask with causal off: a sequence's later cells are visible too; the window
    bounds the past only (llama.cpp's is_masked_swa: p1 - p0 >= n_swa), other sequences stay hidden."""
    cells = CellTable(8)
    cells.allocate(0, np.arange(6, dtype=np.int32))
    cells.allocate(1, np.arange(2, dtype=np.int32))
    seqs, pos = np.array([0, 0, 0], np.int32), np.array([3, 4, 5], np.int32)
    seen = lambda m: (m == 0).astype(int).tolist()   # noqa: E731
    assert seen(cells.mask(seqs, pos, 8, 3)) == [[1, 1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 0, 0, 0],
                                                 [1, 1, 1, 1, 1, 1, 0, 0]]
    assert seen(cells.mask(seqs, pos, 8, 3, causal=False)) == [[1, 1, 1, 1, 1, 1, 0, 0]] * 3
    assert seen(cells.mask(seqs, pos, 8, 4, window=2, causal=False)) == [
        [0, 0, 1, 1, 1, 1, 0, 0], [0, 0, 0, 1, 1, 1, 0, 0], [0, 0, 0, 0, 1, 1, 0, 0], [0] * 8]


def test_prefix_inside_image_reads_it_whole(device, loaded):
    """A sequence holding the prompt up to the middle of the image is cut back to the image's
    start and reads the image whole (its rows must see each other): the whole prompt's logits."""
    model, path, mmproj, _ = loaded
    vision = Vision(device, mmproj, model.cfg, path)
    with Engine(model, n_ctx=512, n_ubatch=32, vision=vision) as engine:
        prompt = _prompt(vision, model, VS.cases[0])
        whole = eval_prompt(engine, prompt)
        start, img = prompt.images[0]
        engine.reset()
        eval_prompt(engine, prompt.prefix(start + 5))
        assert engine.sequence_length(0) == start + 5
        np.testing.assert_allclose(eval_prompt(engine, prompt), whole, atol=1e-4 * np.abs(whole).max())
        assert engine.sequence_length(0) == len(prompt)


def test_image_over_micro_batches(device, loaded, caplog):
    """An image longer than the micro-batch is read as llama.cpp reads it then: each micro-batch's
    rows see each other and those before, not the later ones (a warning says so): the logits of
    two embeds of 8 rows each in an engine that takes the image whole."""
    model, path, mmproj, _ = loaded
    vision = Vision(device, mmproj, model.cfg, path)
    prompt = _prompt(vision, model, VS.cases[0])
    start, img = prompt.images[0]
    with Engine(model, n_ctx=512, n_ubatch=8, vision=vision) as engine, caplog.at_level(logging.WARNING, "vkrt"):
        split = eval_prompt(engine, prompt)
    assert "an image of 16 rows is read in micro-batches of 8" in caplog.text
    with Engine(model, n_ctx=512, n_ubatch=32, vision=vision) as engine:
        whole = eval_prompt(engine, prompt)
        engine.reset()
        engine.eval(prompt.tokens[:start])
        rope, after = img.positions(start, False)
        for a in (0, 8):
            engine.embed(img.rows[a:a + 8], rope[a:a + 8], after[a:a + 8], causal=False)
        two = engine.eval(prompt.tokens[start + 16:])
    scale = np.abs(whole).max()
    np.testing.assert_allclose(split, two, atol=1e-4 * scale)
    assert np.abs(split - whole).max() > 1e-2 * scale


def _run(*args):
    from vkrt.cli.main import cli
    return CliRunner().invoke(cli, ["run", "-c", "256", *args])


def test_cli_run_with_image(loaded):
    """`vkrt run --mmproj --image` with the gemma3 pair answers as llama-server did; a projector of
    the other kind of model is refused in one line."""
    _, path, mmproj, folder = loaded
    png = folder / "a.png"
    before, (h, w, seed), after = VS.cases[1]
    png.write_bytes(image_png(h, w, seed))
    result = _run("-m", path, "--mmproj", mmproj, "--image", str(png), "-p", before + MARKER + after,
                  "-n", str(VS.n_predict), "--temp", "0", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output.strip().splitlines()[-1])
    assert out["tokens"] == REFERENCE["cases"][1]["tokens"]
    assert out["timings"]["prompt_n"] == REFERENCE["cases"][1]["prompt_n"]
    qwen_text, qwen_mmproj = tiny_model("tiny-qwen35", folder), write_mmproj(folder / "mmproj-q.gguf", MmprojSpec())
    for model, projector, message in ((qwen_text, mmproj, "a gemma3 vision projector goes with a Gemma 3 text model"),
                                      (path, qwen_mmproj, "a qwen3vl_merger vision projector goes with a Qwen-VL")):
        result = _run("-m", model, "--mmproj", projector, "--image", str(png), "-n", "1")
        assert result.exit_code != 0 and message in result.output, result.output
        assert "Traceback" not in result.output


def test_python_api(loaded):
    import vkrt
    _, path, mmproj, _ = loaded
    before, (h, w, seed), after = VS.cases[2]
    with vkrt.load(path, mmproj=mmproj, n_ctx=256) as llm:
        text = llm.generate(before + MARKER + after, VS.n_predict, images=[image_png(h, w, seed)], temperature=0)
        assert text == llm.detokenize(REFERENCE["cases"][2]["tokens"])
