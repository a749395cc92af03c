"""bench/flash_attn_decode.py on the test device: one query gets the decode attention with the
fa_rope prologue timed beside the plain packed kernel and the one a mask-zero step runs (a
quantised cache's stores rotated and quantised), several queries none (the prologue takes one
token; the row says why, as where the tuning turns it down); --cold times each run after an
untimed cache flush; an F16 cache's attention without flash is timed beside them."""

from __future__ import annotations

import json
import subprocess
import sys

from file_modules import ROOT

SCRIPT = ROOT / "bench" / "flash_attn_decode.py"


def test_one_query_times_the_prologue():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--queries", "1,4", "--depth", "100", "--heads", "64:4:1",
                           "--splits", "", "--kv", "q8_0", "--repeats", "1", "--json"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    rows = {r["queries"]: r for r in json.loads(proc.stdout)["rows"]}
    one, four = rows[1], rows[4]
    assert one["kv"] == "q8_0" and one["us_with_prologue"] > 0
    # one sequence's decode runs flagged mask-zero, with the prologue too: its cost is over that
    assert one["us_mask_zero"] > 0 and abs(one["speedup_mask_zero"] - one["us_packed"] / one["us_mask_zero"]) < 1e-9
    assert abs(one["prologue_cost"] - one["us_with_prologue"] / one["us_mask_zero"]) < 1e-9
    assert four["us_with_prologue"] is None and four["prologue_cost"] is None
    assert four["us_mask_zero"] is None and four["speedup_mask_zero"] is None
    assert one["prologue_refused"] is None and four["prologue_refused"] == "more than one query token"
    assert one["us_without_flash"] is None   # (a quantised cache has no attention without flash)
    assert all(v["variant"] not in ("packed, norm_rope in its prologue", "packed, mask flagged zero")
               for r in rows.values() for v in r["variants"])


def test_a_prologue_the_tuning_turns_down_says_why():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--queries", "1", "--depth", "100", "--heads", "64:4:1",
                           "--splits", "", "--kv", "f16", "--repeats", "1", "--set", "fa_prologue_max_head=32"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "| – (head 64 is past the tuning's fa_prologue_max_head (32)) |" in proc.stdout


def test_cold_runs_time_the_attention_alone():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--queries", "1", "--depth", "100", "--heads", "64:4:1",
                           "--splits", "", "--kv", "f16", "--repeats", "1", "--cold", "4", "--json"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["cold_mib"] == 4
    (row,) = result["rows"]
    assert [v["variant"] for v in row["variants"]] == ["unpacked, padded", "packed, live cells",
                                                        "packed, loads where used"]
    assert all(v["us"] > 0 for v in row["variants"]) and row["us_with_prologue"] > 0
    assert row["us_without_flash"] > 0
    assert abs(row["speedup_vs_without_flash"] - row["us_without_flash"] / row["us_packed"]) < 1e-9
