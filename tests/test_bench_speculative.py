"""bench/speculative.py in a quick mode: the verify-step costs of each placement (the MoE and
recurrent tiny-qwen35moe in VRAM and with its experts in host memory) and the generation with
and without n-gram speculation; a dense model's host placement skipped with a note; a missing
model file refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from models import tiny_model

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "speculative.py"


def _run(*args, timeout=120):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def test_verify_costs_and_generation_on_moe_recurrent(tmp_path):
    path = tiny_model("tiny-qwen35moe", tmp_path)
    proc = _run(path, "--placements", "vram,host", "--depth", 32, "--reps", 2, "-n", 16, "--ks", "2,4", "--json")
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
    assert "WARNING" not in proc.stderr


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
