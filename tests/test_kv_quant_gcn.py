"""Flash attention of every KV cache type on the RX 580's compiler (Mesa's null Polaris device,
bench/gcn_shader_stats.py --kv): no spills; the decode kernels at 2 waves a SIMD or more (one
query's grid puts 2 a SIMD: the GCN table's fa_ahead_max_bytes comment), and a quantised tile (in
shared memory, each thread's share of the next held as whole blocks' words, 2 rows a thread up to
head 128: fa_pack_rows_by_type, fa_pack_o_regs) within 104 VGPRs at heads 64 and 128, 96 at 256,
with the fa_rope prologue's rotations and quantised stores too."""

import json
import subprocess
import sys

from test_gcn_shader_stats import ROOT, SCRIPT, _null_polaris_env

TYPES = ["f32", "f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"]


def test_quantised_decode_attention_on_polaris():
    env = _null_polaris_env()
    proc = subprocess.run([sys.executable, str(SCRIPT), "--json", "--kv", ",".join(TYPES)], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr
    rows = [r for r in json.loads(proc.stdout)["kernels"] if r["kernel"] == "flash_attn"]
    stats = {}
    for r in rows:
        kv = next(w.rsplit("K/V ", 1)[1].split()[0] for w in r["used_by"] if "K/V " in w)
        d = r["defines"]
        phase = "decode" if d["LOADS_FIRST"] else "prefill"
        stats[(d["HSK"], phase, "NORM_ROPE_IN" in d, kv)] = (d["LOADS_FIRST"], r["statistics"])
    want = {(hs, phase, False, t.upper()) for hs in (64, 128, 256) for phase in ("prefill", "decode") for t in TYPES}
    # the fa_rope prologue: every type but IQ4_NL (its quantiser would cost a wave)
    want |= {(hs, "decode", True, t.upper()) for hs in (64, 128, 256) for t in TYPES if t != "iq4_nl"}
    assert set(stats) == want
    for key, (_, s) in stats.items():
        assert s["Spilled VGPRs"] == 0 and s["Spilled SGPRs"] == 0, (key, s)
        if key[1] == "decode":
            assert s["Subgroups per SIMD"] >= 2, (key, s)
    # a thread's tile share past 128 bytes holds one tile, not two (f32 at head 256: 256 VGPRs and 59 spilled)
    ahead = {(hs, kv) for (hs, phase, pro, kv), (first, _) in stats.items() if phase == "decode" and first == 2}
    assert ahead == {(64, "F16"), (128, "F16"), (64, "F32")}
    # quantised tiles are dequantised once a workgroup into shared memory
    shared = {(hs, kv) for (hs, phase, pro, kv), (first, _) in stats.items() if phase == "decode" and first == 3}
    assert shared == {(hs, t.upper()) for hs in (64, 128, 256) for t in TYPES[2:]}
    # a thread's share of the next tile is whole blocks as loaded (5-9 words and the block's place),
    # 2 rows a thread up to head 128, 1 at 256 (fa_pack_o_regs; a vec4 a thread and one row: 104-136
    # VGPRs at 256), the output rotated back (V stored rotated) inside
    for (hs, phase, pro, kv), (first, s) in stats.items():
        if phase == "decode" and kv not in ("F16", "F32"):
            assert s["VGPRs"] <= (96 if hs == 256 else 104), (hs, kv, s)
    rows_by_head = {(r["defines"]["HSK"], r["defines"]["BR"]) for r in rows if r["defines"]["LOADS_FIRST"] == 3}
    assert rows_by_head == {(64, 8), (128, 8), (256, 4)}
    assert {r["defines"].get("OUT_ROT") for r in rows if r["defines"]["LOADS_FIRST"] == 3} == {64}
