"""The prompt cache in host RAM (--cache-ram) and slot files (--slot-save-path, POST /slots/{id}):
a session whose slot other sessions took resumes from host memory with the text of a cold run;
a slot saved, erased and restored from a file resumes the same way; file names stay inside the
folder and files of another model or layout are refused with a 400 naming why."""

from __future__ import annotations

import json
import os
import struct
import threading
import time

import numpy as np
import pytest
from models import tiny_model

from vkrt.engine.kv_transfer import KVBlock
from vkrt.server.prompt_cache import PromptCache, SavedPrefix

from .serverproc import serving, wait_idle

SESSIONS = ["Hello, world! The capital of France is Paris. Once upon a time there was a fox",
            "def add(a, b): return a + b  # write tests for this function please",
            "List three prime numbers and explain why each of them is prime.",
            "What is the weather like on the moon during the lunar night?"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("prompt-cache")
    return {n: tiny_model(n, d) for n in ("tiny-qwen3", "tiny-qwen35moe")}


@pytest.fixture(scope="module", params=["tiny-qwen3", "tiny-qwen35moe"])
def cached_server(request, models):
    """One slot, the default --cache-ram; tiny-qwen3 without --slot-save-path."""
    yield from serving(models[request.param], "-c", "1024", "-np", "1", "-b", "256", "-ub", "64")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return str(tmp_path_factory.mktemp("slot-files"))


@pytest.fixture(scope="module")
def files_server(models, folder):
    """One slot, no prompt cache (what a restore gives is all there is), slot files in `folder`."""
    yield from serving(models["tiny-qwen35moe"], "-c", "1024", "-np", "1", "-b", "256", "-ub", "64",
                       "--cache-ram", "0", "--slot-save-path", folder)


def chat(srv, messages, cache: bool = True, max_tokens: int = 8) -> tuple[str, int, dict]:
    body = {"messages": messages, "temperature": 0, "max_tokens": max_tokens, "cache_prompt": cache}
    status, reply = srv.post("/v1/chat/completions", body)
    assert status == 200, reply
    wait_idle(srv)
    usage, timings = reply["usage"], reply["timings"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert timings["cache_n"] == cached and timings["prompt_n"] == usage["prompt_tokens"] - cached
    return reply["choices"][0]["message"]["content"], cached, usage


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def three_other_sessions(srv) -> None:
    for text in SESSIONS[1:]:
        chat(srv, user(text))


def resume_after_others(srv) -> tuple[int, int, str, str]:
    """Session 0's first prompt's tokens, its follow-up's cached tokens after 3 other sessions
    took the one slot, and the follow-up's text resumed and cold."""
    first = user(SESSIONS[0])
    answer, _, usage = chat(srv, first)
    three_other_sessions(srv)
    follow = first + [{"role": "assistant", "content": answer}, {"role": "user", "content": "and then?"}]
    resumed, cached, _ = chat(srv, follow)
    cold, cold_cached, _ = chat(srv, follow, cache=False)
    assert cold_cached == 0
    return usage["prompt_tokens"], cached, resumed, cold


def test_session_resumes_from_host_memory(cached_server):
    n_first, cached, resumed, cold = resume_after_others(cached_server)
    assert cached >= n_first
    assert resumed == cold
    assert "tokens from the prompt cache" in cached_server.log


def test_without_the_cache_the_session_is_read_again(files_server):
    n_first, cached, resumed, cold = resume_after_others(files_server)
    assert cached < n_first
    assert resumed == cold


def test_slot_actions_need_a_folder(cached_server):
    for action in ("save", "restore", "erase"):
        status, reply = cached_server.post(f"/slots/0?action={action}", {"filename": "x.slot"})
        assert status == 501 and "--slot-save-path" in reply["error"]["message"], reply


def slot_action(srv, action: str, body=None, id_slot=0):
    return srv.post(f"/slots/{id_slot}?action={action}", body if body is not None else {})


def n_cached(srv) -> int:
    return wait_idle(srv)[0]["n_cached"]


def test_save_erase_restore_resumes(files_server, folder):
    first = user(SESSIONS[0])
    answer, _, usage = chat(files_server, first)
    held = n_cached(files_server)
    status, saved = slot_action(files_server, "save", {"filename": "session.slot"})
    assert status == 200, saved
    path = os.path.join(folder, "session.slot")
    assert saved["id_slot"] == 0 and saved["filename"] == "session.slot" and saved["n_saved"] == held
    assert saved["n_written"] == os.path.getsize(path) and saved["timings"]["save_ms"] >= 0
    status, erased = slot_action(files_server, "erase")
    assert status == 200 and erased == {"id_slot": 0, "n_erased": held}
    assert n_cached(files_server) == 0
    status, restored = slot_action(files_server, "restore", {"filename": "session.slot"})
    assert status == 200, restored
    assert restored["n_restored"] == held and restored["n_read"] == os.path.getsize(path)
    assert restored["timings"]["restore_ms"] >= 0 and n_cached(files_server) == held
    follow = first + [{"role": "assistant", "content": answer}, {"role": "user", "content": "and then?"}]
    resumed, cached, _ = chat(files_server, follow)
    cold, _, _ = chat(files_server, follow, cache=False)
    assert cached >= usage["prompt_tokens"] and resumed == cold


@pytest.mark.parametrize("name", ["../x.slot", "/etc/passwd", "a/b.slot", "..", ".", "x\u0000y", " x", "x.",
                                  "a\\b", ""])
def test_file_names_stay_in_the_folder(files_server, folder, name):
    for action in ("save", "restore"):
        status, reply = slot_action(files_server, action, {"filename": name})
        assert status == 400 and "Invalid filename" in reply["error"]["message"], reply
    assert not os.path.exists(os.path.join(os.path.dirname(folder), "x.slot"))


def test_links_out_of_the_folder_are_refused(files_server, folder, tmp_path):
    chat(files_server, user(SESSIONS[1]))
    outside = tmp_path / "victim.txt"
    outside.write_text("the user's own file")
    os.symlink(outside, os.path.join(folder, "link.slot"))
    for action in ("save", "restore"):
        status, reply = slot_action(files_server, action, {"filename": "link.slot"})
        assert status == 400 and "outside" in reply["error"]["message"], reply
    assert outside.read_text() == "the user's own file"


def rewrite_header(path: str, out: str, change) -> None:
    with open(path, "rb") as f:
        data = f.read()
    magic, fmt, size = struct.unpack_from("<8sII", data)
    header = json.loads(data[16:16 + size])
    change(header)
    raw = json.dumps(header).encode()
    with open(out, "wb") as f:
        f.write(struct.pack("<8sII", magic, fmt, len(raw)) + raw + data[16 + size:])


def test_foreign_and_damaged_files_are_refused(files_server, folder):
    chat(files_server, user(SESSIONS[2]))
    status, _ = slot_action(files_server, "save", {"filename": "good.slot"})
    assert status == 200
    good = os.path.join(folder, "good.slot")

    def model_name(h):
        h["model"]["name"] = "another model"

    def kv_type(h):
        h["layout"]["kv_type"] = "F32"

    def rotated(h):
        h["layout"]["kv_rotation"] = [64, 64]

    def unrecorded(h):   # files from before the rotation: not rotated
        assert h["layout"].pop("kv_rotation") == [0, 0]
    rewrite_header(good, os.path.join(folder, "other-model.slot"), model_name)
    rewrite_header(good, os.path.join(folder, "other-kv.slot"), kv_type)
    rewrite_header(good, os.path.join(folder, "rotated.slot"), rotated)
    rewrite_header(good, os.path.join(folder, "older.slot"), unrecorded)
    with open(os.path.join(folder, "garbage.slot"), "wb") as f:
        f.write(b"not a slot file at all, just text")
    with open(good, "rb") as f:
        whole = f.read()
    with open(os.path.join(folder, "short.slot"), "wb") as f:
        f.write(whole[:-100])
    for name, why in (("other-model.slot", "saved from model 'another model'"), ("other-kv.slot", "KV cache type"),
                      ("rotated.slot", "rotated in runs [64, 64]"),
                      ("garbage.slot", "not a vkrt slot file"), ("short.slot", "truncated"),
                      ("missing.slot", "no file 'missing.slot'")):
        status, reply = slot_action(files_server, "restore", {"filename": name})
        assert status == 400 and why in reply["error"]["message"], (name, reply)
    assert n_cached(files_server) > 0   # a refused restore leaves the slot as it was
    status, reply = slot_action(files_server, "restore", {"filename": "older.slot"})
    assert status == 200, reply


def test_bad_requests(files_server):
    status, reply = slot_action(files_server, "compress", {"filename": "x.slot"})
    assert status == 400 and "Invalid action" in reply["error"]["message"]
    for id_slot in ("7", "x", "-1"):
        status, reply = slot_action(files_server, "erase", id_slot=id_slot)
        assert status == 400 and "Invalid slot ID" in reply["error"]["message"], reply
    status, reply = slot_action(files_server, "save", {})
    assert status == 400 and "filename" in reply["error"]["message"]


def test_busy_slot_is_refused(files_server):
    body = {"messages": user(SESSIONS[3]), "max_tokens": 400, "ignore_eos": True, "temperature": 0}
    done = threading.Thread(target=files_server.post, args=("/v1/chat/completions", body))
    done.start()
    try:
        deadline = time.monotonic() + 30
        while not json.loads(files_server.get("/slots")[1])[0]["is_processing"]:
            assert time.monotonic() < deadline, "the request never took the slot"
            time.sleep(0.01)
        status, reply = slot_action(files_server, "save", {"filename": "busy.slot"})
        assert status == 409 and "processing a request" in reply["error"]["message"], reply
    finally:
        done.join()


# -- the cache itself (host memory only) -----------------------------------------------------------
def entry(tokens: list[int], states=()) -> SavedPrefix:
    kv = KVBlock(len(tokens), {0: (np.zeros((2, len(tokens), 8), np.uint8), np.zeros((2, len(tokens), 8), np.uint8))})
    return SavedPrefix(list(tokens), kv, {n: [np.zeros(100, np.uint8)] for n in states})


def test_least_recently_used_go_first():
    one = entry(range(10)).nbytes
    cache = PromptCache(3 * one)
    a, b, c, d = (entry(range(k * 100, k * 100 + 10)) for k in range(4))
    for e in (a, b, c):
        assert cache.add(e)
    assert cache.find(list(range(20)), False) == (a, 10)
    a.used = 99   # a resumed a prompt (PromptCache._load): b is now the least recently used
    cache.add(d)
    assert b not in cache.entries and {a, c, d} <= set(cache.entries) and cache.nbytes <= 3 * one
    assert not cache.add(entry(range(1000)))   # alone over the limit
    assert cache.find([5, 6, 7], False) is None
    assert not PromptCache(0).enabled


def test_prefixes_fold_into_the_entries_extending_them():
    cache = PromptCache(None)
    cache.add(entry(range(10), states=(4, 10)))
    longer = entry(range(30), states=(30,))
    cache.add(longer)
    assert cache.entries == [longer] and sorted(longer.states) == [4, 10, 30]
    # a recurrent prefix resumes at a saved state inside the shared part only
    assert cache.find(list(range(25)) + [999], True) == (longer, 10)
    assert cache.find(list(range(3)) + [999], True) is None
