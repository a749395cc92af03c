"""`vkrt serve --spec-type mtp --mmproj`: image requests draft with the model's MTP head (its
entries at an image's positions read the image's rows at the trunk's M-RoPE positions) and get
the answers of a server without speculation: an image chat and its follow-up (which resumes the
slot's prefix, image included), and two image prompts on two slots at once (greedy tokens)."""

from __future__ import annotations

import base64
import concurrent.futures
import dataclasses
import json
from contextlib import contextmanager

import pytest
from models import TINY

from vision_cases import CASES, TEXT_MODEL, image_png, mmproj_file

from .serverproc import serving, wait_idle

served = contextmanager(serving)
# -ub 16: the head's micro-batch is 16, so the drafter makes its entries while a prompt streams in
# (past 32 states), the image's among them, as well as at a draft
ARGS = ("-c", "1024", "-np", "2", "-b", "64", "-ub", "16", "--body-limit", str(1 << 20))
MTP = ("--spec-type", "mtp", "--draft-p-min", "0", "--draft-max", "4")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from vkrt.model.synthetic import write_model
    folder = tmp_path_factory.mktemp("vision-mtp")
    path = write_model(folder / "mtp.gguf", dataclasses.replace(TINY[TEXT_MODEL], n_nextn=1))
    return str(path), mmproj_file(folder)


def _image_part(png: bytes) -> dict:
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()}}


def _chat(srv, messages) -> dict:
    status, reply = srv.post("/v1/chat/completions", {"messages": messages, "temperature": 0, "max_tokens": 12})
    assert status == 200, reply
    wait_idle(srv)
    return reply


def _conversation(srv) -> list[dict]:
    """An image question, then a follow-up about it."""
    first = [{"role": "user", "content": [{"type": "text", "text": "What is in this picture?"},
                                          _image_part(image_png(64, 128, 1))]}]
    a = _chat(srv, first)
    follow = first + [{"role": "assistant", "content": a["choices"][0]["message"]["content"]},
                      {"role": "user", "content": "And what colour is it?"}]
    return [a, _chat(srv, follow)]


def _completion(srv, mark: str, case) -> dict:
    before, (h, w, seed), after = case
    status, reply = srv.post("/completion", {
        "prompt": {"prompt_string": before + mark + after, "multimodal_data": [base64.b64encode(image_png(h, w, seed))
                                                                               .decode()]},
        "n_predict": 16, "temperature": 0, "cache_prompt": False, "return_tokens": True})
    assert status == 200, reply
    return reply


def _together(srv) -> list[dict]:
    mark = json.loads(srv.get("/props")[1])["media_marker"]
    with concurrent.futures.ThreadPoolExecutor(len(CASES)) as pool:
        return list(pool.map(lambda c: _completion(srv, mark, c), CASES))


def test_image_requests_draft_with_mtp_and_answer_as_without(files):
    path, mmproj = files
    with served(path, "--mmproj", mmproj, *ARGS) as srv:
        plain = _conversation(srv)
        plain_tokens = [r["tokens"] for r in _together(srv)]
    with served(path, "--mmproj", mmproj, *ARGS, *MTP) as srv:
        chats = _conversation(srv)
        assert [c["choices"][0]["message"]["content"] for c in chats] == \
            [c["choices"][0]["message"]["content"] for c in plain]
        assert all(c["timings"]["draft_n"] > 0 for c in chats)
        first, follow = (c["usage"] for c in chats)
        # the follow-up resumed the slot's prefix past the image (its 8 rows)
        assert follow["prompt_tokens_details"]["cached_tokens"] >= first["prompt_tokens"]
        together = _together(srv)
        assert [r["tokens"] for r in together] == plain_tokens
        assert all(r["timings"]["draft_n"] > 0 for r in together)
        assert "drafts accepted)" in srv.log
        slots = wait_idle(srv)
        assert all(s["speculative"] for s in slots)
