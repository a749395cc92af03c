"""bench/vision_encoder.py at the tiny projector shape on the test device: vkrt's encoder times
and image tokens in the JSON and the table, the model files written once into --out-dir and
reused; llama-server's encoder time read from its log lines (each form a build prints), and
its rows from a stand-in for llama-server (the server never runs here)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import ClassVar

import pytest
from file_modules import ROOT, load, run_script


def _run(*args, timeout=300):
    return run_script("bench", "vision_encoder", *args, timeout=timeout)


def test_tiny_projector_json_and_table(tmp_path):
    proc = _run("--shape", "tiny", "--sizes", "64,128", "--reps", 2, "--no-llama", "--out-dir", tmp_path, "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)   # the whole of stdout is one JSON object
    assert out["shape"] == "tiny" and out["weight_type"] == "F16" and out["reps"] == 2 and out["warmups"] == 1
    assert out["device"] and out["files_kept"] is True and out["polaris_class"] is False
    assert out["tower"] == {"projector_type": "qwen3vl_merger", "n_embd": 32, "n_layer": 2, "n_head": 2, "n_ff": 64,
                            "patch_size": 16, "n_merge": 2, "proj_dim": 64, "min_pixels": 8 * 32 * 32,
                            "max_pixels": 4096 * 32 * 32, "weights_bytes": out["tower"]["weights_bytes"]}
    assert out["tower"]["weights_bytes"] > 0
    assert out["mmproj"] == str(tmp_path / "mmproj-tiny-f16.gguf") and out["text_model"] == str(tmp_path / "text-tiny.gguf")
    assert out["llama"] is None and out["llama_note"] == "--no-llama: llama.cpp not run"
    # 64 x 64 is below the 8 tokens' 8192 pixels: scaled up to 96 x 96 (9 tokens); 128 x 128 is read as it is
    assert [(r["size"], r["input_width"], r["input_height"], r["image_tokens"]) for r in out["rows"]] == \
        [(64, 96, 96, 9), (128, 128, 128, 16)]
    for r in out["rows"]:
        assert 0 < r["vkrt_encoder_ms_min"] <= r["vkrt_encoder_ms_per_image"] <= r["vkrt_encoder_ms_max"]
        assert r["vkrt_preprocess_ms_per_image"] > 0
        assert all(r[k] is None for k in ("llama_encoder_ms_per_image", "llama_image_tokens", "llama_method",
                                          "speedup_vs_llama"))
    assert "writing" in proc.stderr

    proc = _run("--shape", "tiny", "--sizes", 96, "--reps", 1, "--weight-type", "f32", "--no-llama", "--out-dir",
                tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"writing {tmp_path / 'mmproj-tiny-f32.gguf'}" in proc.stderr
    assert "text-tiny.gguf" not in proc.stderr   # the text model of the first run, reused
    lines = proc.stdout.splitlines()
    assert "projector tiny (qwen3vl_merger, random F32 weights): 2 layers 32 wide" in lines[1]
    assert lines[2] == "| size | image tokens | vkrt ms | llama.cpp ms | speedup_vs_llama |"
    assert lines[4].startswith("| 96x96 | 9 | ") and lines[4].endswith(" |  |  |")
    assert lines[-1] == "llama.cpp: not run (--no-llama: llama.cpp not run)"


def test_bad_arguments_are_one_line(tmp_path):
    for args, text in ((["--sizes", "1"], "--sizes: each side must be 2..8192 pixels"),
                       (["--sizes", "a,b"], "--sizes: a comma list of integers"),
                       (["--reps", "0"], "--reps must be at least 1"),
                       (["--no-llama", "--llama-server", tmp_path / "x"], "--no-llama and --llama-server together")):
        proc = _run(*args, timeout=60)
        assert proc.returncode == 2 and proc.stdout == "" and text in proc.stderr, (args, proc.stderr)


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))   # its own imports: common, llama_peer
    return load("bench", "vision_encoder")


TRACE_LOG = """\
0.01.715.510 I slot launch_slot_: id  0 | task 4 | processing task, is_child = 0
0.01.721.782 I slot process_mtmd: id  0 | task 4 | encoding mtmd batch from idx = 13, n_chunks = 1
0.01.893.616 I decoding image batch 1/2, n_tokens_batch = 512
0.01.900.000 W find_slot: non-consecutive token position 13 after 12 for sequence 0 with 512 new tokens
0.02.060.419 I image decoded (batch 1/2) in 167 ms
0.02.061.000 I decoding image batch 2/2, n_tokens_batch = 12
0.02.197.524 I slot      release: id  0 | task 4 | stop processing: n_tokens = 541, truncated = 0
"""


def test_llama_log_forms(bench):
    got = bench.parse_encode(TRACE_LOG)
    assert got["encoder_ms"] == pytest.approx(171.834) and got["image_tokens"] == 524
    assert got["method"] == bench.METHOD_TRACE
    across_minute = "1.59.999.500 I slot process_mtmd: encoding mtmd batch from idx = 5, n_chunks = 1\n" \
                    "2.00.001.250 I decoding image batch 1/1, n_tokens_batch = 16\n"
    assert bench.parse_encode(across_minute)["encoder_ms"] == pytest.approx(1.75)
    slice_log = "encoding image slice...\nimage slice encoded in 709 ms\ndecoding image batch 1/1, n_tokens_batch = 256\n"
    assert bench.parse_encode(slice_log) == {"encoder_ms": 709.0, "method": bench.METHOD_SLICE, "image_tokens": 256}
    assert bench.parse_encode("0.01.000.000 I slot release: stop processing\n") == \
        {"encoder_ms": None, "method": None, "image_tokens": None}
    with pytest.raises(RuntimeError, match="2 media chunks"):
        bench.parse_encode(TRACE_LOG.replace("n_chunks = 1", "n_chunks = 2"))


class FakeServer:
    """Stands in for llama-server: canned timings and log lines for each request, the flags kept."""
    started: ClassVar[list] = []
    log: str = TRACE_LOG
    fail: bool = False

    def __init__(self, binary, model, flags, env, port):
        if self.fail:
            raise RuntimeError("llama-server exited with 1; log: no such device\nmore")
        FakeServer.started.append((binary, model, flags, env))
        self.calls = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def props(self):
        return {"media_marker": "<__media__>", "build_info": "b10434-test"}

    def request(self, prompt, images):
        self.calls.append((prompt, len(images)))
        if images:   # 100, 101, 102, ... ms of prompt
            return {"prompt_n": 20, "prompt_ms": 99.0 + len(self.calls)}, self.log
        return {"prompt_n": len(prompt), "prompt_ms": 30.0}, "stop processing\n"


def test_llama_rows_from_a_stand_in(bench):
    files = bench.Files("/m/text.gguf", "/m/mmproj.gguf")
    images = {448: b"png448", 1024: b"png1024"}
    FakeServer.started, FakeServer.fail, FakeServer.log = [], False, TRACE_LOG
    server, rows, why = bench.llama_side("/x/llama-server", files, images, 3, {"GGML_VK_VISIBLE_DEVICES": "1"}, "auto",
                                         1280, server_cls=FakeServer)
    assert why is None and list(rows) == [448, 1024]
    flags = ["--mmproj", "/m/mmproj.gguf", "-ngl", "99", "-c", "1280", "-fa", "auto", "-lv", "4"]
    assert FakeServer.started == [("/x/llama-server", "/m/text.gguf", flags, {"GGML_VK_VISIBLE_DEVICES": "1"})]
    assert server == {"server": "/x/llama-server", "build": "b10434-test", "flags": flags,
                      "env": {"GGML_VK_VISIBLE_DEVICES": "1"}}
    r = rows[448]
    assert r["llama_encoder_ms_per_image"] == pytest.approx(171.834) and r["llama_image_tokens"] == 524
    assert r["llama_method"] == bench.METHOD_TRACE and r["llama_prompt_ms"] == 102.0   # 101..103: the warm-up's 100 out

    FakeServer.log = "stop processing\n"   # no per-image figure: the request less a text-only one of 20 tokens
    _, rows, why = bench.llama_side("/x/llama-server", files, {448: b"png"}, 3, {}, "on", 512, server_cls=FakeServer)
    r = rows[448]
    assert why is None and r["llama_method"] == bench.METHOD_TEXT
    assert (r["llama_encoder_ms_min"], r["llama_encoder_ms_per_image"], r["llama_encoder_ms_max"]) == (71.0, 72.0, 73.0)
    assert r["llama_image_tokens"] is None

    FakeServer.fail = True
    assert bench.llama_side("/x/llama-server", files, images, 1, {}, "auto", 512, server_cls=FakeServer) == \
        (None, {}, "llama-server failed: RuntimeError: llama-server exited with 1; log: no such device")


def test_llama_server_choice(bench, tmp_path, monkeypatch):
    assert bench.llama_server(bench.parse_args(["--no-llama"])) == (None, "--no-llama: llama.cpp not run")
    binary = tmp_path / "llama-server"
    binary.write_text("")
    assert bench.llama_server(bench.parse_args(["--llama-server", str(binary)])) == (str(binary), None)
    missing = Path(tmp_path / "nope")
    assert bench.llama_server(bench.parse_args(["--llama-server", str(missing)])) == \
        (None, f"no such llama-server: {missing}; llama.cpp not run")
    monkeypatch.setattr(sys.modules[bench.llama_server.__module__], "find_server", lambda path: path)   # no package
    path, why = bench.llama_server(bench.parse_args([]))
    assert path is None and why.startswith("no llama-server found: pass --llama-server PATH")
