"""Slot files of slots holding an image (POST /slots/{id}?action=save|restore, vkrt/server/slot_files.py):
a slot that read an image saves, is erased and restored, and a follow-up question about the image
resumes from the file (its cached tokens cover the image: the placeholder ids compare as the
image's hash, the cells keep their M-RoPE positions) with a cold run's answer; a format 1 file
(text only) still loads; damaged positions or ids are refused with a 400 naming why."""

from __future__ import annotations

import base64
import json
import os
import struct

import numpy as np
import pytest
from models import tiny_model

from vision_cases import TEXT_MODEL, image_png, mmproj_file

from .serverproc import serving, wait_idle

_HEAD = struct.Struct("<8sII")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return str(tmp_path_factory.mktemp("image-slot-files"))


@pytest.fixture(scope="module")
def srv(tmp_path_factory, folder):
    """One slot of tiny qwen35 (a recurrent state too) with the tiny projector, no prompt cache
    (what a restore gives is all there is), slot files in `folder`."""
    d = tmp_path_factory.mktemp("image-slot-model")
    yield from serving(tiny_model(TEXT_MODEL, d), "--mmproj", mmproj_file(d), "-c", "512", "-np", "1", "-b", "64",
                       "-ub", "64", "--cache-ram", "0", "--slot-save-path", folder, "--body-limit", str(1 << 20))


def question(text: str = "What is in this picture?") -> list[dict]:
    url = "data:image/png;base64," + base64.b64encode(image_png(64, 128, 1)).decode()
    return [{"role": "user", "content": [{"type": "text", "text": text},
                                         {"type": "image_url", "image_url": {"url": url}}]}]


def chat(srv, messages, cache: bool = True) -> tuple[str, dict, list[float]]:
    """The answer, the usage and each answer token's log-probability."""
    status, reply = srv.post("/v1/chat/completions", {"messages": messages, "temperature": 0, "max_tokens": 8,
                                                      "cache_prompt": cache, "logprobs": True})
    assert status == 200, reply
    wait_idle(srv)
    choice = reply["choices"][0]
    return choice["message"]["content"], reply["usage"], [t["logprob"] for t in choice["logprobs"]["content"]]


def action(srv, what: str, filename: str | None = None):
    return srv.post(f"/slots/0?action={what}", {} if filename is None else {"filename": filename})


def n_cached(srv) -> int:
    return wait_idle(srv)[0]["n_cached"]


def parse(path: str) -> tuple[int, dict, int]:
    """(format, header, where the tokens start) of a slot file."""
    with open(path, "rb") as f:
        data = f.read()
    _, fmt, size = _HEAD.unpack_from(data)
    return fmt, json.loads(data[_HEAD.size:_HEAD.size + size]), _HEAD.size + size


def rewrite(path: str, out: str, fmt: int, header: dict, patch=None) -> None:
    """`path` with another format number and header; patch(bytearray of the rest) may change the rest."""
    with open(path, "rb") as f:
        data = f.read()
    _, _, at = parse(path)
    rest = bytearray(data[at:])
    if patch is not None:
        patch(rest)
    raw = json.dumps(header).encode()
    with open(out, "wb") as f:
        f.write(_HEAD.pack(b"VKRTSLOT", fmt, len(raw)) + raw + bytes(rest))


def test_image_slot_saves_and_resumes(srv, folder):
    first = question()
    answer, usage, _ = chat(srv, first)
    held = n_cached(srv)
    status, saved = action(srv, "save", "image.slot")
    assert status == 200 and saved["n_saved"] == held, saved
    fmt, header, _ = parse(os.path.join(folder, "image.slot"))
    assert fmt == 2 and header["rope"] is True and header["state"] is True
    assert action(srv, "erase")[1]["n_erased"] == held and n_cached(srv) == 0
    status, restored = action(srv, "restore", "image.slot")
    assert status == 200 and restored["n_restored"] == held and n_cached(srv) == held, restored
    follow = first + [{"role": "assistant", "content": answer}, {"role": "user", "content": "What colour is it?"}]
    resumed, resumed_usage, resumed_lp = chat(srv, follow)
    assert resumed_usage["prompt_tokens_details"]["cached_tokens"] >= usage["prompt_tokens"]   # the image too
    cold, cold_usage, cold_lp = chat(srv, follow, cache=False)
    assert cold_usage["prompt_tokens_details"]["cached_tokens"] == 0 and resumed == cold
    # the text after the image at the image's M-RoPE `after`, not at its index: the same numbers
    np.testing.assert_allclose(resumed_lp, cold_lp, rtol=0, atol=1e-3)


def test_text_slot_of_format_1_still_loads(srv, folder):
    chat(srv, [{"role": "user", "content": "Hello there, how are you today?"}])
    held = n_cached(srv)
    assert action(srv, "save", "text.slot")[0] == 200
    _, header, _ = parse(os.path.join(folder, "text.slot"))
    assert header["rope"] is False   # a text slot's positions are its indices
    del header["rope"]
    rewrite(os.path.join(folder, "text.slot"), os.path.join(folder, "old.slot"), 1, header)
    action(srv, "erase")
    status, restored = action(srv, "restore", "old.slot")
    assert status == 200 and restored["n_restored"] == held and n_cached(srv) == held, restored


def test_damaged_image_files_are_refused(srv, folder):
    chat(srv, question("Describe it."))
    assert action(srv, "save", "good.slot")[0] == 200
    good = os.path.join(folder, "good.slot")
    _, header, _ = parse(good)
    n = header["n_tokens"]
    kv = sum(h * n * (k + v) for k, v, h in header["layout"]["layers"].values())

    def bad_rope(rest: bytearray) -> None:
        rest[4 * n + kv:4 * n + kv + 12] = np.full(3, -5, np.int32).tobytes()

    def bad_id(rest: bytearray) -> None:
        ids = np.frombuffer(bytes(rest[:4 * n]), np.int32).copy()
        ids[np.flatnonzero(ids < 0)[0]] = -(1 << 31)
        rest[:4 * n] = ids.tobytes()
    rewrite(good, os.path.join(folder, "bad-rope.slot"), 2, header, bad_rope)
    rewrite(good, os.path.join(folder, "bad-id.slot"), 2, header, bad_id)
    rewrite(good, os.path.join(folder, "image-as-1.slot"), 1, {k: v for k, v in header.items() if k != "rope"},
            lambda rest: rest.__delitem__(slice(4 * n + kv, 4 * n + kv + 16 * n)))
    rewrite(good, os.path.join(folder, "bad-header.slot"), 2, {**header, "rope": "yes"})
    rewrite(good, os.path.join(folder, "format-9.slot"), 9, header)
    for name, why in (("bad-rope.slot", "rotary positions are damaged"),
                      ("bad-id.slot", "outside this model's vocabulary"),
                      ("image-as-1.slot", "outside this model's vocabulary"),   # format 1 held text only
                      ("bad-header.slot", "header is damaged"),
                      ("format-9.slot", "reads formats 1, 2")):
        status, reply = action(srv, "restore", name)
        assert status == 400 and why in reply["error"]["message"], (name, reply)
    assert n_cached(srv) > 0   # a refused restore leaves the slot as it was
