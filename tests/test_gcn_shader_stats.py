"""Compiler statistics: Device(capture_statistics=True, queues=False), pipeline_statistics,
pipeline_representations, and bench/gcn_shader_stats.py (with its main-loop counts,
bench/isa_loop.py) on Mesa's null Polaris device (RADV without hardware, ACO compiling)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vkrt.device import Device
from vkrt.errors import UnsupportedDevice, VkrtError
from vkrt.ops.norm import ADD_RMS_PUSH, RMS_PUSH
from vkrt.pipeline import kernel, pipeline_representations, pipeline_statistics

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gcn_shader_stats.py"
ICDS = Path("/usr/share/vulkan/icd.d")
RADV_ICD = ICDS / "radeon_icd.x86_64.json"
LVP_ICD = ICDS / "lvp_icd.x86_64.json"
EXTENSION = "VK_KHR_pipeline_executable_properties"
PROBE = ("from vkrt.device import Instance\n"
         "with Instance(validate=False) as inst:\n"
         f"    print(any(p.architecture.value == 'AMD_GCN' and {EXTENSION!r} in p.extensions\n"
         "              for p in inst.profiles()))\n")


def rms_norm_kernel(dev, add: bool = False):
    push, defines = (ADD_RMS_PUSH, {"ADD": 1}) if add else (RMS_PUSH, {})
    return kernel(dev, "rms_norm", defines=defines, push=push, workgroup=(dev.tuning.reduce_wg,))


def _env(icd: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("VKRT_DEVICE", "VKRT_ARCH", "VK_DRIVER_FILES")}
    return {**env, "VK_ICD_FILENAMES": str(icd), **extra}


def _null_polaris_env() -> dict:
    if not RADV_ICD.exists():
        pytest.skip(f"no RADV ({RADV_ICD} is missing)")
    env = _env(RADV_ICD, RADV_FORCE_FAMILY="polaris10")
    probe = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, cwd=ROOT,
                           timeout=60)
    if probe.stdout.strip() != "True":
        pytest.skip(f"RADV's null Polaris device with {EXTENSION} is not available here")
    return env


def test_statistics_need_capture(device):
    with pytest.raises(VkrtError, match="capture_statistics=True"):
        pipeline_statistics(rms_norm_kernel(device))


def test_representations_need_capture(device):
    with pytest.raises(VkrtError, match="capture_disassembly=True"):
        pipeline_representations(rms_norm_kernel(device))


def test_capture_statistics_needs_the_extension(device):
    if EXTENSION in device.profile.extensions:
        with Device(capture_statistics=True) as dev:
            assert pipeline_statistics(rms_norm_kernel(dev))
    else:
        with pytest.raises(UnsupportedDevice, match=EXTENSION):
            Device(capture_statistics=True)


def test_device_without_queues_builds_kernels(device):
    with Device(queues=False) as dev:
        assert dev.compute is None and dev.transfer is None and not dev.has_transfer_queue
        k = rms_norm_kernel(dev, add=True)
        assert k.defines == {"ADD": 1} and k.workgroup[0] == dev.tuning.reduce_wg
        dev.wait_idle()
    assert k.closed


def test_script_refuses_a_device_without_statistics():
    if not LVP_ICD.exists():
        pytest.skip(f"no lavapipe ({LVP_ICD} is missing)")
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=_env(LVP_ICD),
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("gcn_shader_stats: ") and "RADV_FORCE_FAMILY" in last
    assert "Traceback" not in proc.stderr


def test_script_any_device_still_needs_statistics():
    if not LVP_ICD.exists():
        pytest.skip(f"no lavapipe ({LVP_ICD} is missing)")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--any-device", "--kv", "f16"], capture_output=True, text=True,
                          env=_env(LVP_ICD), cwd=ROOT, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert EXTENSION in proc.stderr and "Traceback" not in proc.stderr


def test_script_names_a_table_the_device_cannot_build():
    """VKRT_ARCH naming another GPU's table on the null Polaris device: the NVIDIA table's fused
    norms need 32-lane subgroups, so a kernel it asks for cannot be built; one line, no traceback."""
    env = {**_null_polaris_env(), "VKRT_ARCH": "nvidia"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--any-device", "--weights", "Q4_0"], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("gcn_shader_stats: ") and "NVIDIA table" in last and "mat_vec_kernel" in last
    assert "Traceback" not in proc.stderr


def test_table_of_another_drivers_statistics(capsys):
    """A driver that names its statistics otherwise than RADV (NVIDIA's) gets a column each."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import gcn_shader_stats
    finally:
        sys.path.remove(str(SCRIPT.parent))
    tuning = {f: 1 for f in ("mm_bm", "mm_bn", "mm_bk", "mm_tm", "mm_tn", "mm_big_bm", "mm_big_bn", "mv_wg",
                             "mv_rows", "fa_wg")}
    kernels = [dict(kernel="flash_attn", variant="HSK=128 wg 128", used_by=["decode"],
                    statistics={"Register Count": 119, "Shared Memory Size": 2308}),
               dict(kernel="rms_norm", variant="wg 1024", used_by=["norm"], statistics={"Register Count": 16})]
    gcn_shader_stats.print_table(dict(device="NVIDIA H100", driver="580", architecture="NVIDIA", tune="",
                                      tuning=tuning, kernels=kernels))
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "| kernel | variant | used by | Register Count | Shared Memory Size |"
    assert lines[3] == "| flash_attn | HSK=128 wg 128 | decode | 119 | 2308 |"
    assert lines[4] == "| rms_norm | wg 1024 | norm | 16 | ? |"


def test_gcn_shader_stats_on_null_polaris():
    env = _null_polaris_env()
    # the default weight types and two IQ types whose mat-vecs take the most registers (ACO: 64)
    weights = ["Q4_0", "Q4_K", "Q6_K", "IQ4_XS", "IQ1_S"]
    proc = subprocess.run([sys.executable, str(SCRIPT), "--json", "--loop", "--weights", ",".join(weights)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["architecture"] == "AMD_GCN" and "POLARIS10" in result["device"]
    rows = result["kernels"]
    assert {r["kernel"] for r in rows} >= {"mul_mm", "mul_mv", "mul_mv_id", "mul_mv_id_sum", "mul_mv_route",
                                           "flash_attn", "fa_mask_opt", "rms_norm", "rope", "moe_router"}
    for r in rows:
        assert r["statistics"]["VGPRs"] > 0, r
        assert r["statistics"]["Subgroups per SIMD"] > 0, r
    gemms = [r for r in rows if r["kernel"] == "mul_mm"]
    assert {(t, "MUL_MAT_ID" in r["defines"]) for r in gemms for t in weights
            if f"QTYPE_{t}" in r["defines"]} == {(t, mmid) for t in weights for mmid in (False, True)}
    for r in gemms:
        assert r["statistics"]["Spilled VGPRs"] == 0, r
    heads = {r["defines"]["HSK"] for r in rows if r["kernel"] == "flash_attn"}
    assert heads == {128, 256}
    summed = [r for r in rows if r["kernel"] == "mul_mv_id_sum"]
    assert len(summed) == len(weights)   # one a weight type
    below = set()
    for r in rows:   # decode reads each weight (and DeltaNet state) once: enough waves to hide memory
        if r["kernel"].startswith("mul_mv") or r["kernel"] == "gdn_recurrent":
            assert r["statistics"]["Spilled VGPRs"] == 0, r
            # a server's run of several columns holds x for each (Q4_K at 4 columns: 200 VGPRs,
            # one wave): what is left to do for decode steps of several slots on GCN
            if r["defines"].get("NC", 1) == 1 and r["statistics"]["Subgroups per SIMD"] < 4:
                weight_rows = r["defines"]["NR"] * (2 if "GATE_UP" in r["defines"] else 1)
                below.add((r["kernel"], next(k for k in r["defines"] if k.startswith("QTYPE_")), "QWIDE" in r["defines"],
                           weight_rows, r["statistics"]["Subgroups per SIMD"]))
    # Q4_K's 16-byte loads over 4 weight rows a group took 84 VGPRs (3 waves): one column now takes
    # 2 (mv_rows_one_column_by_type), 64 VGPRs
    assert not below, below
    # decode attention with its K/V tile in shared memory (fa_loads_first=3, one row a thread), with and without the
    # prologue: 4 waves, where the tables' 2 (a tile ahead in registers) leave 2
    shared_kv = [r["statistics"] for r in rows if r["kernel"] == "flash_attn" and r["defines"].get("LOADS_FIRST") == 3]
    assert len(shared_kv) == 2 and all(s["Subgroups per SIMD"] >= 4 and s["Spilled VGPRs"] == 0 for s in shared_kv)
    assert any(r["kernel"] == "mul_mv" and r["defines"].get("NC", 1) > 1 for r in rows)
    # --loop: the main loop of each kernel from ACO's assembly; the tiled GEMM's and prompt
    # attention's are mostly multiply-adds, the f16 attention converts its K and V halves
    for r in rows:
        if r["kernel"] == "mul_mm" or (r["kernel"] == "flash_attn" and r["defines"]["LOADS_FIRST"] == 0):
            lp = r["loop"]
            assert 0 < lp["fma"] <= lp["valu"] <= lp["instructions"], r
            assert max(x["instructions"] for x in r["loops"]) == lp["instructions"], r
            if r["kernel"] == "flash_attn" and r["defines"].get("K_F16"):
                assert lp["cvt"] > 0, r


def test_isa_loop_counts_the_longest_backward_branch():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from isa_loop import loop_counts, loops
    finally:
        sys.path.remove(str(SCRIPT.parent))
    asm = ("BB0:\n\ts_mov_b32 s0, 0 ; be800080\n"
           "BB1:\n\tv_mov_b32_e32 v0, 0 ; 7e000280\n\ts_cbranch_scc0 BB1 ; bf84fffe\n"          # a short loop
           "BB2:\n\tbuffer_load_dwordx2 v[0:1], v2, s[4:7], 0 offen ; e0541000\n\ts_waitcnt vmcnt(0) ; bf8c0f70\n"
           "\tv_cvt_f32_f16_e32 v3, v0 ; 7e061700\n\tv_mac_f32_e32 v4, v3, v5 ; 2c080b03\n"
           "\ts_cbranch_execz BB3 ; bf880001\n\tv_mul_f32_e32 v4, v4, v6 ; 0a080d04\n"
           "BB3:\n\tds_swizzle_b32 v7, v4 offset:swizzle(SWAP,4) ; d87a8004\n\ts_branch BB2 ; bf82fff7\n"
           "BB4:\n\ts_endpgm ; bf810000\n")
    assert loop_counts(asm) == dict(instructions=8, valu=3, fma=1, cvt=1, mov=0, lds=1, vmem=1, waitcnt=1)
    assert [(lp["label"], lp["instructions"]) for lp in loops(asm)] == [("BB1", 2), ("BB2", 8)]
    assert loop_counts("BB0:\n\ts_endpgm ; bf810000\n") is None and loops("BB0:\n") == []
