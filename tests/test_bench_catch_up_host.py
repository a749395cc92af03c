"""bench/catch_up_host.py in a quick mode: two slots' catch-ups over varied server-like rounds on
the tiny recurrent MoE model, one per slot a round, timed on the host; a model without DeltaNet
layers is refused in one line."""

from __future__ import annotations

import json

from file_modules import run_script
from models import tiny_model


def _run(*args):
    return run_script("bench", "catch_up_host", *args)


def test_catch_ups_of_varied_rounds_are_timed(tmp_path):
    proc = _run(tiny_model("tiny-qwen35moe", tmp_path), "--slots", 2, "--rounds", 6, "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert (out["slots"], out["catch_ups"], out["delta_net_layers"]) == (2, 12, 3)
    assert 0 < out["host_ms_median"] and 0 < out["host_ms_mean_last_half"]


def test_a_model_without_delta_net_is_refused(tmp_path):
    proc = _run(tiny_model("tiny-llama", tmp_path), "--rounds", 2)
    assert proc.returncode == 2 and proc.stderr.strip().endswith("no DeltaNet layers, nothing to catch up")
