"""Images through `vkrt serve --mmproj`: llama-server's /completion multimodal_data answers as
llama.cpp did (tests/data/llama_vision_reference.json), the openai client's data-URL image_url
parts, the modality in /props and /v1/models, prompt reuse by the image's hash, and the
refusals (a server without a projector, http URLs, corrupt or non-image data, marker counts)."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import openai
import pytest
from models import tiny_model

from vision_cases import CASES, N_PREDICT, TEXT_MODEL, image_png, mmproj_file

from .serverproc import API_KEY, serving, wait_idle

REFERENCE = json.loads((Path(__file__).parents[1] / "data" / "llama_vision_reference.json").read_text())


@pytest.fixture(scope="module")
def vision_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vision-server")
    model, mmproj = tiny_model(TEXT_MODEL, folder), mmproj_file(folder)
    yield from serving(model, "--mmproj", mmproj, "-c", "512", "-np", "2", "-ub", "64", "--body-limit", str(1 << 20))


def data_url(png: bytes, kind: str = "image/png") -> str:
    return f"data:{kind};base64," + base64.b64encode(png).decode()


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


def marker(server) -> str:
    status, raw = server.get("/props")
    assert status == 200
    props = json.loads(raw)
    assert props["modalities"] == {"vision": True, "audio": False}
    return props["media_marker"]


def test_completion_multimodal_data_matches_llama_cpp(vision_server):
    """/completion with llama-server's prompt object: the greedy tokens and top log-probabilities
    of llama.cpp's recorded answers."""
    mark = marker(vision_server)
    for (before, (h, w, seed), after), ref in zip(CASES, REFERENCE["cases"]):
        body = {"prompt": {"prompt_string": before + mark + after,
                           "multimodal_data": [base64.b64encode(image_png(h, w, seed)).decode()]},
                "n_predict": N_PREDICT, "temperature": 0, "return_tokens": True, "cache_prompt": False,
                "n_probs": 5}
        status, d = vision_server.post("/completion", body)
        assert status == 200, d
        assert d["tokens"] == ref["tokens"]
        assert d["timings"]["prompt_n"] == ref["prompt_n"]
        for got, want in zip(d["completion_probabilities"], ref["top_logprobs"]):
            ours = {p["id"]: p["logprob"] for p in got["top_logprobs"]}
            assert [p["id"] for p in got["top_logprobs"]][:1] == [want[0][0]]
            assert max(abs(ours[t] - lp) for t, lp in want if t in ours) < 0.01


def test_openai_chat_with_data_url_image(vision_server):
    """The openai client's image_url part: the image's 8 tokens and its frame count in the prompt,
    and the answer is the same asked twice (greedy)."""
    oai = client(vision_server)

    def ask(content):
        return oai.chat.completions.create(model="x", max_tokens=4, temperature=0,
                                           messages=[{"role": "user", "content": content}])
    text = ask("What is this?")
    part = {"type": "image_url", "image_url": {"url": data_url(image_png(64, 128, 1))}}
    first = ask([{"type": "text", "text": "What is this?"}, part])
    frame = 13 + 12   # <|vision_start|> and <|vision_end|> as text in the tiny vocabulary
    assert first.usage.prompt_tokens == text.usage.prompt_tokens + 8 + frame
    assert first.choices[0].message.content
    wait_idle(vision_server)
    again = ask([{"type": "text", "text": "What is this?"}, part])
    assert again.choices[0].message.content == first.choices[0].message.content


def _completion(server, png: bytes, text: str) -> dict:
    mark = marker(server)
    body = {"prompt": {"prompt_string": "Look: " + mark + text, "multimodal_data": [base64.b64encode(png).decode()]},
            "n_predict": 1, "temperature": 0}
    status, d = server.post("/completion", body)
    assert status == 200, d
    wait_idle(server)
    return d["timings"]


def test_prompt_reuse_by_image_hash(vision_server):
    """A prompt extending one with the same image resumes after it (44 tokens: the recurrent
    state saved at that prompt's end); with another image of the same size it shares only the
    text before the image, where no state was saved, and is read whole."""
    png, other = image_png(64, 128, 1), image_png(64, 128, 5)
    _completion(vision_server, png, " what is it?")
    same = _completion(vision_server, png, " what is it? More?")
    assert same["cache_n"] == 44 and same["prompt_n"] > 0
    changed = _completion(vision_server, other, " what is it? More?")
    assert changed["cache_n"] == 0 and changed["prompt_n"] == same["cache_n"] + same["prompt_n"]


@pytest.mark.parametrize("url, why", [
    ("https://example.com/cat.png", "does not fetch image URLs"),
    ("data:image/png;base64,iVBORw0KGgo=", "not an image vkrt decodes|corrupt"),
    ("data:text/plain;base64,aGVsbG8=", "holds 'text/plain'"),
    ("data:image/png;base64,@@@", "not valid base64"),
    ("not a url", "must be a base64 data URL"),
])
def test_bad_image_parts(vision_server, url, why):
    oai = client(vision_server)
    with pytest.raises(openai.BadRequestError) as err:
        oai.chat.completions.create(model="x", max_tokens=2, messages=[
            {"role": "user", "content": [{"type": "text", "text": "hi"},
                                         {"type": "image_url", "image_url": {"url": url}}]}])
    body = err.value.body
    assert err.value.status_code == 400
    assert body["param"] == "messages[0].content[1].image_url.url"
    assert re.search(why, body["message"]), body["message"]


def test_marker_count_refused(vision_server):
    status, d = vision_server.post("/completion", {"prompt": {"prompt_string": "no marker here",
                                                              "multimodal_data": ["aGVsbG8="]}, "n_predict": 1})
    assert status == 400
    assert "media marker" in d["error"]["message"] and d["error"]["param"] == "prompt.prompt_string"


def test_models_report_multimodal(vision_server):
    status, raw = vision_server.get("/v1/models")
    assert status == 200
    assert "multimodal" in json.loads(raw)["data"][0]["capabilities"]


def test_text_server_refuses_images(server):
    """The session's text-only server (tiny-qwen3, no --mmproj): a 400 naming the part and --mmproj."""
    oai = client(server)
    with pytest.raises(openai.BadRequestError) as err:
        oai.chat.completions.create(model="x", max_tokens=2, messages=[
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(image_png(32, 32, 1))}}]}])
    assert err.value.body["param"] == "messages[0].content[0].image_url.url"
    assert "--mmproj" in err.value.body["message"]
    status, raw = server.get("/props")
    assert json.loads(raw)["modalities"]["vision"] is False
