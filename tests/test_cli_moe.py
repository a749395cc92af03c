"""The MoE options on the command line: --expert-cache on `vkrt run` (same tokens with the
cache off, automatic or tiny; a bad size is one clear error) and -ncmoe on `vkrt bench`."""

import json

import pytest
from click.testing import CliRunner

from models import tiny_model
from vkrt.cli.main import cli


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory):
    return tiny_model("tiny-qwen3moe", tmp_path_factory.mktemp("cli-moe"))


def run_json(model, *extra):
    result = CliRunner().invoke(cli, ["run", "-m", model, "-p", "one two three", "-n", "8", "--temp", "0", "--json",
                                      "-c", "128", "-ncmoe", "2", *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_expert_cache_sizes_give_the_same_tokens(device, moe_model):
    off = run_json(moe_model, "--expert-cache", "0")
    assert "expert_cache_hit_rate" not in off
    for size in ("auto", "64K"):   # every expert cached; 2 of 8 per layer
        out = run_json(moe_model, "--expert-cache", size)
        assert out["tokens"] == off["tokens"], size
        assert 0 < out["expert_cache_hit_rate"] < 1, size


def test_bad_expert_cache_is_one_clear_line(device, moe_model):
    result = CliRunner().invoke(cli, ["run", "-m", moe_model, "-p", "x", "-n", "1", "--expert-cache", "lots"])
    assert result.exit_code != 0
    assert "--expert-cache" in result.output and "Traceback" not in result.output


def test_bench_sweeps_n_cpu_moe(device, moe_model):
    result = CliRunner().invoke(cli, ["bench", "-m", moe_model, "-p", "16", "-n", "4", "-ncmoe", "0,2", "-r", "1",
                                      "-o", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert sorted({r["n_cpu_moe"] for r in rows}) == [0, 2]
    assert all(r["avg_ts"] > 0 for r in rows)


def test_bench_takes_the_model_cards_ub_spelling(device, moe_model):
    """`vkrt bench --ub 2048` (the spelling the seed's README uses) is -ub / --ubatch-size."""
    result = CliRunner().invoke(cli, ["bench", "-m", moe_model, "-p", "16", "-n", "0", "--ub", "8,16", "-r", "1",
                                      "-o", "json"])
    assert result.exit_code == 0, result.output
    assert sorted(r["n_ubatch"] for r in json.loads(result.output)) == [8, 16]


def test_bench_records_the_tuning_overrides(device, moe_model, monkeypatch):
    """`VKRT_TUNE=... vkrt bench` runs with the overrides and says so: `vkrt_tune` in every
    record, and under the markdown table."""
    monkeypatch.setenv("VKRT_TUNE", "mv_rows=2 fa_loads_first=0")
    args = ["bench", "-m", moe_model, "-p", "0", "-n", "2", "-r", "1"]
    result = CliRunner().invoke(cli, args + ["-o", "json"])
    assert result.exit_code == 0, result.output
    assert [r["vkrt_tune"] for r in json.loads(result.output)] == ["mv_rows=2 fa_loads_first=0"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0 and "tuning overrides VKRT_TUNE='mv_rows=2 fa_loads_first=0'" in result.output
    monkeypatch.delenv("VKRT_TUNE")
    result = CliRunner().invoke(cli, args + ["-o", "json"])
    assert [r["vkrt_tune"] for r in json.loads(result.output)] == [""]


def test_tune_ab_times_variants_against_the_table(device, moe_model):
    """bench/tune_ab.py: the table and each variant on their own device, the ratio to the table,
    and a variant the tuning refuses reported as refused (the others still run)."""
    import subprocess
    import sys
    from pathlib import Path
    script = Path(__file__).resolve().parents[1] / "bench" / "tune_ab.py"
    proc = subprocess.run([sys.executable, str(script), moe_model, "--tests", "tg16", "-r", "1", "--variant",
                           "fa_loads_first=0 mv_rows=2", "--variant", "fa_lods_first=3", "--json"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    table, variant, refused = json.loads(proc.stdout)["rows"]
    assert table["variant"] == "table" and table["tune"] == "" and table["tg16"] > 0
    assert variant["tune"] == "fa_loads_first=0 mv_rows=2" and variant["ratio_vs_table"]["tg16"] > 0
    assert "'fa_lods_first' is not a tuning field; did you mean fa_loads_first" in refused["error"]
