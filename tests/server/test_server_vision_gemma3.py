"""Gemma 3 images through `vkrt serve --mmproj`: /completion's multimodal_data answers as
llama.cpp did (tests/data/llama_vision_reference_gemma3.json), also with the prompt's text and
image reused from the slot's last request."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from models import tiny_model

from vision_cases import SETS, gemma3_mmproj_file, image_png

from .serverproc import serving

VS = SETS["gemma3"]
REFERENCE = json.loads((Path(__file__).parents[1] / "data" / VS.reference).read_text())


@pytest.fixture(scope="module")
def gemma3_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vision-gemma3-server")
    model, mmproj = tiny_model(VS.text_model, folder), gemma3_mmproj_file(folder)
    yield from serving(model, "--mmproj", mmproj, "-c", "512", "-np", "2", "-ub", "64")


def _complete(server, text: str, png: bytes, cache_prompt: bool) -> dict:
    status, raw = server.get("/props")
    assert status == 200
    mark = json.loads(raw)["media_marker"]
    body = {"prompt": {"prompt_string": text.replace("<__media__>", mark),
                       "multimodal_data": [base64.b64encode(png).decode()]},
            "n_predict": VS.n_predict, "temperature": 0, "return_tokens": True, "cache_prompt": cache_prompt,
            "n_probs": 5, "id_slot": 0}
    status, d = server.post("/completion", body)
    assert status == 200, d
    return d


def test_completion_matches_llama_cpp(gemma3_server):
    for (before, (h, w, seed), after), ref in zip(VS.cases, REFERENCE["cases"]):
        d = _complete(gemma3_server, before + "<__media__>" + after, image_png(h, w, seed), False)
        assert d["tokens"] == ref["tokens"]
        assert d["timings"]["prompt_n"] == ref["prompt_n"]
        for got, want in zip(d["completion_probabilities"], ref["top_logprobs"]):
            ours = {p["id"]: p["logprob"] for p in got["top_logprobs"]}
            assert got["top_logprobs"][0]["id"] == want[0][0]
            assert max(abs(ours[t] - lp) for t, lp in want if t in ours) < 0.01


def test_prompt_reuse_through_the_image(gemma3_server):
    """A prompt sharing the text and image of the slot's last one keeps them (the image's rows
    as they were read, attending each other) and answers as llama.cpp answered it afresh."""
    before, (h, w, seed), after = VS.cases[0]
    png, ref = image_png(h, w, seed), REFERENCE["cases"][0]
    _complete(gemma3_server, before + "<__media__>" + " something else entirely", png, True)
    d = _complete(gemma3_server, before + "<__media__>" + after, png, True)
    assert d["timings"]["cache_n"] > 16 + 6 and d["timings"]["cache_n"] + d["timings"]["prompt_n"] == ref["prompt_n"]
    assert d["tokens"] == ref["tokens"]
    for got, want in zip(d["completion_probabilities"], ref["top_logprobs"]):
        ours = {p["id"]: p["logprob"] for p in got["top_logprobs"]}
        assert max(abs(ours[t] - lp) for t, lp in want if t in ours) < 0.01
