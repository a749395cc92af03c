"""Images from the command line and in the VRAM plan: `vkrt run --mmproj --image` answers as
llama.cpp did, one-line errors for a missing or mismatched projector and bad images, the
projector's VRAM in the estimate and under --vram-budget, and which mmproj file -hf picks."""

from __future__ import annotations

import io
import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from models import tiny_model
from vision_cases import CASES, N_PREDICT, TEXT_MODEL, image_png, mmproj_file
from vkrt.cli.main import cli
from vkrt.engine.options import EngineOptions, _plan_one, estimate_keywords
from vkrt.engine.placement import DoesNotFit, estimate
from vkrt.model.hub_files import pick_mmproj
from vkrt.model.image_input import MAX_SOURCE_PIXELS, ImageError, decode_image
from vkrt.model.mmproj_synthetic import MmprojSpec, write_mmproj
from vkrt.model.split_gguf import open_gguf
from vkrt.model.config import ModelConfig
from vkrt.model.vision_memory import encoder_vram

REFERENCE = json.loads((Path(__file__).parent / "data" / "llama_vision_reference.json").read_text())


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("vision-cli")
    (d / "a.png").write_bytes(image_png(64, 128, 1))
    (d / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    return {"model": tiny_model(TEXT_MODEL, d), "mmproj": mmproj_file(d), "png": str(d / "a.png"),
            "bad": str(d / "bad.png"), "narrow": write_mmproj(d / "mmproj-narrow.gguf", MmprojSpec(proj_dim=32)),
            "dir": d}


def run(*args):
    return CliRunner().invoke(cli, ["run", "-c", "256", *args])


def test_run_with_image_matches_llama_cpp(files):
    before, _, after = CASES[0]
    result = run("-m", files["model"], "--mmproj", files["mmproj"], "--image", files["png"], "-p",
                 before + "<__media__>" + after, "-n", str(N_PREDICT), "--temp", "0", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output.strip().splitlines()[-1])
    assert out["tokens"] == REFERENCE["cases"][0]["tokens"]
    assert out["timings"]["prompt_n"] == REFERENCE["cases"][0]["prompt_n"]


def test_run_image_before_prompt_without_marker(files):
    """Without a marker the image goes before the prompt (llama-mtmd-cli): 13 + 8 + 12 tokens more."""
    result = run("-m", files["model"], "--mmproj", files["mmproj"], "--image", files["png"], "-p", "What?",
                 "-n", "1", "--temp", "0", "--json")
    assert result.exit_code == 0, result.output
    text = run("-m", files["model"], "-p", "What?", "-n", "1", "--temp", "0", "--json")
    n = json.loads(text.output.strip().splitlines()[-1])["timings"]["prompt_n"]
    assert json.loads(result.output.strip().splitlines()[-1])["timings"]["prompt_n"] == n + 13 + 8 + 12


@pytest.mark.parametrize("args, message", [
    (["--image", "{png}"], "--image needs the model's vision projector: give --mmproj FILE"),
    (["--mmproj", "{mmproj}", "--no-mmproj"], "give --mmproj FILE or --no-mmproj, not both"),
    (["--mmproj", "{dir}/none.gguf"], "none.gguf: no such file"),
    (["--mmproj", "{narrow}", "--image", "{png}"], "mm.2.bias (the projection width) is 32 but the text model"),
    (["--mmproj", "{model}", "--image", "{png}"], "general.architecture is 'qwen35', expected 'clip'"),
    (["--mmproj", "{mmproj}", "--image", "{bad}"], "bad.png: not an image vkrt decodes"),
    (["--mmproj", "{mmproj}", "--image", "{png}", "-p", "<__media__><__media__>"],
     "the prompt has 2 media marker(s) '<__media__>' for 1 image(s)"),
    (["--mmproj", "{mmproj}", "--image", "{png}", "--spec-type", "ngram"], "--image does not go with --spec-type ngram"),
])
def test_run_refusals(files, args, message):
    result = run("-m", files["model"], "-n", "1", *[a.format(**files) for a in args])
    assert result.exit_code != 0
    assert message in result.output, result.output
    assert "Traceback" not in result.output


def _png_header(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height (its data is one empty row): refused unread."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0")) + chunk(b"IEND", b"")


def test_huge_and_tiny_images(files):
    side = int(MAX_SOURCE_PIXELS ** 0.5) + 16
    with pytest.raises(ImageError, match=rf"image 0: {side}x{side} pixels is more than"):
        decode_image(_png_header(side, side), "image 0")
    buf = io.BytesIO()
    Image.fromarray(np.zeros((1, 40, 3), np.uint8)).save(buf, format="PNG")
    (files["dir"] / "line.png").write_bytes(buf.getvalue())
    line = str(files["dir"] / "line.png")
    result = run("-m", files["model"], "--mmproj", files["mmproj"], "--image", line, "-n", "1")
    assert result.exit_code != 0 and "the image is 40x1 pixels: at least 2x2 are needed" in result.output


def test_vram_estimate_counts_the_encoder(files, device, monkeypatch):
    """The tower's weights and its largest image's activations join the main device's estimate;
    a budget that fits the text model alone refuses it with the projector, naming its share."""
    monkeypatch.setattr(device, "vram_budget", device.vram_budget)   # _plan_one sets it: restored after
    o = EngineOptions(n_ctx=256, mmproj=files["mmproj"])
    enc = encoder_vram(files["mmproj"])
    with open_gguf(files["model"], progress=False) as f:
        cfg, tensors = ModelConfig.from_metadata(f.metadata, files["model"]), dict(f.tensors)
        kw = estimate_keywords(o, device)
        assert kw["encoder"] == enc > 100_000
        with_enc = estimate(cfg, tensors, n_cpu_moe=0, **kw)
        without = estimate(cfg, tensors, n_cpu_moe=0, **{**kw, "encoder": 0})
    assert with_enc.total - without.total >= enc and "vision encoder" in with_enc.describe()
    budget = without.total + enc // 2
    assert _plan_one(device, files["model"], EngineOptions(n_ctx=256), budget) == 0
    with pytest.raises(DoesNotFit, match="vision encoder"):
        _plan_one(device, files["model"], o, budget)


def test_pick_mmproj():
    files = ["README.md", "model-Q4_K_M.gguf", "model-Q8_0.gguf", "mmproj-model-Q8_0.gguf", "mmproj-model-F16.gguf",
             "sub/mmproj-F32.gguf", "imatrix.gguf"]
    assert pick_mmproj(files, "model-Q4_K_M.gguf") == "mmproj-model-F16.gguf"
    assert pick_mmproj(files, "sub/model-Q4_K_M.gguf") == "sub/mmproj-F32.gguf"
    assert pick_mmproj(["a-Q4_K_M.gguf"], "a-Q4_K_M.gguf") is None
    assert pick_mmproj(["mmproj-BF16.gguf", "mmproj-f32.gguf"], "x.gguf") == "mmproj-BF16.gguf"


def test_python_api_images(files):
    """vkrt.load(..., mmproj=) and generate(..., images=): llama.cpp's greedy answer; without a
    projector, a ConfigError naming mmproj."""
    import vkrt
    from vkrt.errors import ConfigError
    before, _, after = CASES[0]
    with vkrt.load(files["model"], mmproj=files["mmproj"], n_ctx=256) as llm:
        text = llm.generate(before + "<__media__>" + after, N_PREDICT, images=[files["png"]], temperature=0)
        assert text == llm.detokenize(REFERENCE["cases"][0]["tokens"])
    with vkrt.load(files["model"], n_ctx=256) as llm:
        with pytest.raises(ConfigError, match="mmproj="):
            llm.generate("hi", 1, images=[files["png"]])


def test_run_with_image_and_mtp_drafts_the_same_tokens(files):
    """vkrt run --image --spec-type mtp: the MTP head drafts through the image (its rows at the
    trunk's positions) and the greedy tokens are those of the run without speculation."""
    import dataclasses

    from models import TINY
    from vkrt.model.synthetic import write_model
    path = str(write_model(files["dir"] / "mtp.gguf", dataclasses.replace(TINY[TEXT_MODEL], n_nextn=1)))
    before, _, after = CASES[0]
    args = ("-m", path, "--mmproj", files["mmproj"], "--image", files["png"], "-p", before + "<__media__>" + after,
            "-n", str(N_PREDICT), "--temp", "0", "--json")
    plain = run(*args)
    spec = run(*args, "--spec-type", "mtp", "--draft-p-min", "0", "--draft-max", "4")
    assert plain.exit_code == 0 and spec.exit_code == 0, plain.output + spec.output
    a, b = (json.loads(r.output.strip().splitlines()[-1]) for r in (plain, spec))
    assert a["tokens"] == b["tokens"]
    assert b["timings"]["draft_n"] > 0
