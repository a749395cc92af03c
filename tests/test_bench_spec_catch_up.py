"""bench/spec_catch_up.py in a quick mode: on the tiny recurrent MoE model, partly rejected
speculative steps brought forward by the DeltaNet catch-up feed fewer tokens than replay, both
generating the plain run's tokens; a model without DeltaNet layers is refused in one line."""

from __future__ import annotations

import json

from file_modules import run_script
from models import tiny_model


def _run(*args):
    return run_script("bench", "spec_catch_up", *args)


def test_catch_up_feeds_fewer_tokens_than_replay(tmp_path):
    proc = _run(tiny_model("tiny-qwen35moe", tmp_path), "-n", 32, "--wrong", 3, "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    catch_up, replay = out["results"]
    assert (catch_up["way"], replay["way"]) == ("catch-up", "replay")
    assert catch_up["same_tokens"] and replay["same_tokens"] and catch_up["generated"] == 32
    assert 0 < catch_up["accepted"] < catch_up["drafted"]   # some drafts rejected
    assert catch_up["tokens_fed"] < replay["tokens_fed"] and out["tokens_fed_vs_replay"] < 1
    assert catch_up["catch_ups"] > 0 and catch_up["first_catch_up_host_ms"] > 0 and replay["catch_ups"] == 0


def test_a_model_without_delta_net_is_refused(tmp_path):
    proc = _run(tiny_model("tiny-llama", tmp_path), "-n", 8)
    assert proc.returncode == 2 and proc.stderr.strip().endswith("no DeltaNet layers, nothing to catch up")
