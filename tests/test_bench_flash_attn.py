"""bench/flash_attn.py on the test device: a prefill row for each --kv type, each timing the
kernel with mask_opt off and on."""

from __future__ import annotations

import json
import subprocess
import sys

from file_modules import ROOT

SCRIPT = ROOT / "bench" / "flash_attn.py"


def test_a_row_for_each_kv_type():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--ubatch", "16", "--depth", "48", "--heads", "64:2:1",
                           "--kv", "f16,q4_0", "--repeats", "1", "--json"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["rows"]
    assert [r["kv"] for r in rows] == ["f16", "q4_0"]
    assert all(r["n_kv"] == 64 and r["ms_off"] > 0 and r["ms_on"] > 0 for r in rows)


def test_an_unknown_kv_type_is_refused():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--ubatch", "16", "--depth", "48", "--heads", "64:2:1",
                           "--kv", "q3_x", "--repeats", "1", "--json"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode != 0 and "q3_x" in proc.stderr and "Traceback" not in proc.stderr
