"""The quantised KV cache's flash attention on the RX 580's compiler (Mesa's null Polaris device,
bench/gcn_shader_stats.py --kv): no spills, and the decode kernels, which hold a tile of K and V in
registers, no more VGPRs than f16's (a quantised tile is kept as the words loaded)."""

import json
import subprocess
import sys

from test_gcn_shader_stats import ROOT, SCRIPT, _null_polaris_env

TYPES = ["f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"]


def test_quantised_decode_attention_on_polaris():
    env = _null_polaris_env()
    proc = subprocess.run([sys.executable, str(SCRIPT), "--json", "--kv", ",".join(TYPES)], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr
    rows = [r for r in json.loads(proc.stdout)["kernels"] if r["kernel"] == "flash_attn"]
    stats = {}
    for r in rows:
        kv = next(w.rsplit("K/V ", 1)[1].split()[0] for w in r["used_by"] if "K/V " in w)
        stats[(r["defines"]["HSK"], r["defines"]["LOADS_FIRST"] > 0, kv)] = r["statistics"]
    assert {(hs, kv) for hs, _, kv in stats} == {(hs, t.upper()) for hs in (64, 128, 256) for t in TYPES}
    for key, s in stats.items():
        assert s["Spilled VGPRs"] == 0 and s["Spilled SGPRs"] == 0, (key, s)
    for hs in (64, 128, 256):
        f16 = stats[(hs, True, "F16")]
        for t in TYPES[1:]:
            got = stats[(hs, True, t.upper())]
            if hs == 64:   # a quarter block a lane: 3-5 words against f16's 4 (64-84 VGPRs against 64)
                assert got["Subgroups per SIMD"] >= 3, (hs, t, got, f16)
            else:          # half or whole blocks: fewer words than f16's (dequantised: 172-256 VGPRs)
                assert got["VGPRs"] <= f16["VGPRs"], (hs, t, got, f16)
