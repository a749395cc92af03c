"""bench/speculative.py in a quick mode: the verify-step costs of each placement (the MoE and
recurrent tiny-qwen35moe in VRAM and with its experts in host memory) and the generation with
and without n-gram speculation; a dense model's host placement skipped with a note; a missing
model file refused in one line. The llama.cpp peer never runs here: --no-llama and a missing
server give "llama": null with a note, and its rows come from a stand-in for llama-server."""

from __future__ import annotations

import json
import sys

import pytest

from file_modules import ROOT, load, run_script
from models import tiny_model


def _run(*args, timeout=120):
    return run_script("bench", "speculative", *args, timeout=timeout)


def test_verify_costs_and_generation_on_moe_recurrent(tmp_path):
    path = tiny_model("tiny-qwen35moe", tmp_path)
    proc = _run(path, "--placements", "vram,host", "--depth", 32, "--reps", 2, "-n", 16, "--ks", "2,4", "--no-llama",
                "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)   # the whole of stdout is one JSON object
    assert out["model"] == "tiny-qwen35moe.gguf" and out["n_expert"] == 8 and out["recurrent"] is True
    assert out["depth"] == 32 and out["reps"] == 2 and out["ks"] == [2, 4] and out["device"]
    assert [v["placement"] for v in out["verify"]] == ["vram", "host"]
    for v in out["verify"]:
        assert v["skipped"] is None
        assert v["host_experts"] is (v["placement"] == "host")
        assert v["decode_ms"] > 0
        assert [r["k"] for r in v["rows"]] == [2, 4] and [r["drafts"] for r in v["rows"]] == [1, 3]
        for r in v["rows"]:
            assert r["ms"] > 0 and r["cost_vs_decode"] > 0
            assert r["cost_vs_decode"] == pytest.approx(r["ms"] / v["decode_ms"])
            e = (1 - 0.75 ** r["k"]) / (1 - 0.75)
            assert r["expected_tokens_per_step"] == pytest.approx(e)
            assert r["expected_speedup"] == pytest.approx(e / r["cost_vs_decode"])
            assert r["target_cost_vs_decode"] == {2: 1.2, 4: 1.4}[r["k"]]
            assert r["meets_target"] == (r["cost_vs_decode"] <= r["target_cost_vs_decode"])
    g = out["generation"]
    assert g["placement"] == "vram" and g["n_predict"] == 16 and g["draft_max"] == 16 and g["prompt_tokens"] > 100
    assert g["plain_predicted_n"] == g["spec_predicted_n"] == 16   # the EOS does not stop it
    assert g["plain_tokens_per_second"] > 0 and g["spec_tokens_per_second"] > 0
    assert g["speedup"] == pytest.approx(g["spec_tokens_per_second"] / g["plain_tokens_per_second"])
    assert 0 <= g["accepted"] <= g["drafted"]
    assert g["acceptance"] == (g["accepted"] / g["drafted"] if g["drafted"] else None)
    assert g["same_tokens"] is True
    assert g["llama"] is None and g["llama_note"] == "--no-llama: llama.cpp not run"
    assert "WARNING" not in proc.stderr


def test_missing_llama_server_is_noted_in_the_table(tmp_path):
    path = tiny_model("tiny-llama", tmp_path)
    server = tmp_path / "no-llama-server"
    proc = _run(path, "--skip-verify", "-n", 4, "--llama-server", server)
    assert proc.returncode == 0, proc.stderr
    assert any(line.startswith("| vkrt plain | ") for line in proc.stdout.splitlines())
    assert f"llama.cpp: not run (no such llama-server: {server}; llama.cpp not run)" in proc.stdout
    assert f"no such llama-server: {server}" in proc.stderr


def _bench(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))   # its own imports: common, llama_peer
    return load("bench", "speculative")


class FakeServer:
    """Stands in for llama-server: canned /completion answers, the flags it was started with kept."""
    started: list = []
    fail: set = set()   # "plain" / "spec": the server of that kind does not start

    def __init__(self, binary, model, flags, env, port):
        kind = "spec" if "--spec-type" in flags else "plain"
        if kind in self.fail:
            raise RuntimeError(f"llama-server exited with 1; log: {kind} broke\nmore")
        self.kind, self.calls = kind, 0
        FakeServer.started.append((binary, model, flags, env))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def build(self):
        return "b10434-test"

    def generate(self, prompt, n):
        self.calls += 1
        rate = {"plain": 10.0, "spec": 20.0}[self.kind] + self.calls   # the warm-up's 11 / 21 left out
        return {"tokens": [1, 2, 3, 9], "tokens_per_second": rate, "predicted_n": n, "predicted_ms": 1e3 * n / rate,
                "drafted": 8 if self.kind == "spec" else 0, "accepted": 6 if self.kind == "spec" else 0}


def test_llama_peer_rows_from_a_stand_in(monkeypatch):
    bench = _bench(monkeypatch)
    FakeServer.started, FakeServer.fail = [], set()
    vkrt = {"plain_tokens_per_second": 6.0, "spec_tokens_per_second": 9.0}
    llama, why = bench.llama_generation("/x/llama-server", "/m.gguf", [5, 6, 7], 4, 16, 3, "ngram-simple", 512, 2048,
                                        512, {"A": "1"}, vkrt, [1, 2, 4, 4], server_cls=FakeServer)
    assert why is None
    (b0, m0, plain_flags, env0), (_, _, spec_flags, _) = FakeServer.started
    assert (b0, m0, env0) == ("/x/llama-server", "/m.gguf", {"A": "1"})
    assert plain_flags == ["-ngl", "99", "-c", "512", "-b", "2048", "-ub", "512", "-fa", "on", "--no-warmup"]
    assert spec_flags == plain_flags + ["--spec-type", "ngram-simple", "--spec-draft-n-max", "16"]
    assert llama["plain_tokens_per_second"] == 13.0 and llama["spec_tokens_per_second"] == 23.0   # medians of 12..14
    assert llama["speedup"] == pytest.approx(23 / 13) and llama["acceptance"] == 0.75
    assert llama["vkrt_vs_llama_plain"] == pytest.approx(6 / 13) and llama["vkrt_vs_llama_spec"] == pytest.approx(9 / 23)
    assert llama["same_tokens_as_llama"] is False and llama["agreeing_tokens"] == 2 and llama["same_tokens"] is True
    assert llama["build"] == "b10434-test" and llama["spec_error"] is None
    g = {"n_predict": 4, "prompt_tokens": 3, "prompt_kind": "chat template", "placement": "vram", "reps": 3,
         "draft_max": 16, "plain_tokens_per_second": 6.0, "spec_tokens_per_second": 9.0, "drafted": 10, "accepted": 5,
         "acceptance": 0.5, "speedup": 1.5, "same_tokens": True, "llama": llama, "llama_note": None}
    text = bench.table({"device": "dev", "model": "m.gguf", "architecture": "llama", "n_layer": 2, "n_expert": 0,
                        "n_ctx": 512, "n_ubatch": 512, "verify": [], "generation": g})
    assert "| vkrt plain | 6.00 | | | | 1.00x | 0.46x |" in text
    assert "| vkrt n-gram, draft-max 16 | 9.00 | 10 | 5 | 50% | 1.50x | 0.39x |" in text
    assert "| llama.cpp plain | 13.00 | | | | 1.00x | |" in text
    assert "| llama.cpp ngram-simple, spec-draft-n-max 16 | 23.00 | 8 | 6 | 75% | 1.77x | |" in text
    assert "the first 2 of 4 agree" in text

    FakeServer.fail = {"spec"}   # its speculative server failing: the plain figures kept, the failure said
    llama, why = bench.llama_generation("/x/llama-server", "/m.gguf", [5], 4, 16, 1, "ngram-simple", 512, 2048, 512,
                                        {}, vkrt, [1, 2, 3, 9], server_cls=FakeServer)
    assert why is None and llama["same_tokens_as_llama"] is True and llama["agreeing_tokens"] == 4
    assert llama["spec_tokens_per_second"] is None and llama["vkrt_vs_llama_spec"] is None
    assert llama["spec_error"] == "llama-server failed (ngram-simple): RuntimeError: llama-server exited with 1; " \
                                  "log: spec broke"
    FakeServer.fail = {"plain"}   # its plain server failing: no llama object, a note
    llama, why = bench.llama_generation("/x/llama-server", "/m.gguf", [5], 4, 16, 1, "ngram-simple", 512, 2048, 512,
                                        {}, vkrt, [1, 2, 3, 9], server_cls=FakeServer)
    assert llama is None and why == "llama-server failed (plain): RuntimeError: llama-server exited with 1; log: plain broke"


def test_llama_server_choice(monkeypatch, tmp_path):
    bench = _bench(monkeypatch)
    assert bench.llama_server(bench.parse_args(["--no-llama"])) == (None, "--no-llama: llama.cpp not run")
    binary = tmp_path / "llama-server"
    binary.write_text("")
    assert bench.llama_server(bench.parse_args(["--llama-server", str(binary)])) == (str(binary), None)
    monkeypatch.setattr(sys.modules[bench.llama_server.__module__], "find_server", lambda path: path)   # no package
    path, why = bench.llama_server(bench.parse_args([]))
    assert path is None and why.startswith("no llama-server found: pass --llama-server PATH")
    with pytest.raises(SystemExit):
        bench.parse_args(["--no-llama", "--llama-server", str(binary)])


def test_dense_model_skips_host_placements_in_the_table(tmp_path):
    path = tiny_model("tiny-llama", tmp_path)
    proc = _run(path, "--placements", "vram,host-x1", "--depth", 16, "--reps", 1, "--ks", 2, "--skip-gen")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert any(line.startswith("| vram | 2 | ") for line in lines)
    assert "| host-x1 | skipped: dense model: no MoE experts to keep in host memory |" in proc.stdout
    assert "greedy generation" not in proc.stdout


def test_missing_model_is_one_line(tmp_path):
    proc = _run(tmp_path / "nope.gguf", "--json", timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == f"speculative: no such model file: {tmp_path / 'nope.gguf'}"
