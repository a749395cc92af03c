"""`vkrt bench -d ... -ctk ... -ctv ...`: lists of depths and KV types run as their cross product
(llama-bench's way), each row saying its types (type_k / type_v, in the table and the JSON);
bad types are one-line usage errors naming the value and the choices."""

import dataclasses
import json

import pytest
from click.testing import CliRunner

from models import TINY
from vkrt.cli.common import KV_CACHE_TYPES
from vkrt.cli.main import cli
from vkrt.model.synthetic import write_model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("kvq_bench") / "llama-hd32.gguf")
    write_model(path, dataclasses.replace(TINY["tiny-llama"], head_dim=32))
    return path


def bench(*args):
    return CliRunner().invoke(cli, ["bench", *map(str, args)])


@pytest.mark.parametrize("opt,value,bad", [("-ctk", "q9_0", "q9_0"), ("-ctv", "f16,Q4_2", "Q4_2"),
                                           ("-ctk", "f16,", ""), ("--cache-type-v", "bf16", "bf16")])
def test_a_bad_type_is_one_line_naming_it_and_the_choices(model, opt, value, bad):
    short = "-ctk" if opt == "-ctk" else "-ctv"
    result = bench("-m", model, opt, value, "-p", 8, "-n", 0)
    assert result.exit_code == 2 and "Traceback" not in result.output
    line = [x for x in result.output.splitlines() if x.startswith("Error")]
    assert line == [f"Error: Invalid value: {short}: {bad!r} is not a KV cache type; choose from "
                    + ", ".join(KV_CACHE_TYPES)], result.output


def test_quantised_with_flash_attention_off_is_refused(model):
    result = bench("-m", model, "-ctk", "f16", "-ctv", "q4_0", "-fa", "0", "-p", 8, "-n", 0)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "-ctk/-ctv q4_0: a quantised KV cache is read by flash attention only" in result.output


def test_depths_and_types_cross_product(model, device):
    """-d 0,16 x -ctk f16,q8_0: four rows a test (depth outermost per type, as the tests run), the
    f16 rows without flash attention (-fa's default), the q8_0 rows with it."""
    result = bench("-m", model, "-d", "0,16", "-ctk", "f16,q8_0", "-p", 8, "-n", 2, "-r", 1, "-o", "json")
    assert result.exit_code == 0, result.output
    recs = json.loads(result.output)
    got = [(r["type_k"], r["type_v"], r["flash_attn"], r["n_depth"], r["n_prompt"], r["n_gen"]) for r in recs]
    assert got == [(k, "f16", k == "q8_0", d, p, g) for k in ("f16", "q8_0") for d in (0, 16)
                   for p, g in ((8, 0), (0, 2))]
    assert all(r["avg_ts"] > 0 for r in recs)
    table = bench("-m", model, "-d", "0,16", "-ctk", "f16,q8_0", "-ctv", "q4_0", "-p", 8, "-n", 0, "-r", 1)
    assert table.exit_code == 0, table.output
    lines = [x for x in table.output.splitlines() if x.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[-5:] == ["type_k", "type_v", "fa", "test", "t/s"], header
    rows = [[c.strip() for c in x.strip("|").split("|")] for x in lines[2:]]
    assert [tuple(r[-5:-1]) for r in rows] == [(k, "q4_0", "1", t) for k in ("f16", "q8_0") for t in ("pp8", "pp8 @ d16")]


def test_default_types_add_no_columns(model, device):
    """As llama-bench: type_k / type_v columns only where a list or a type other than f16 is given;
    the JSON always says them."""
    table = bench("-m", model, "-p", 8, "-n", 0, "-r", 1)
    assert table.exit_code == 0, table.output
    assert "type_k" not in table.output and "| fa |" not in table.output


def _peer():
    import importlib
    import sys
    from pathlib import Path
    bench_dir = str(Path(__file__).resolve().parents[1] / "bench")
    if bench_dir not in sys.path:
        sys.path.insert(0, bench_dir)
    return importlib.import_module("peer")


def test_peer_tests_at_depths_and_types():
    peer = _peer()
    assert peer.at_depths(["pp512", "tg128", "tg128@d4096"], [0, 4096, 65536]) == (
        ("pp512", 512, 0, 512, 0), ("pp512@d4096", 512, 0, 512, 4096), ("pp512@d65536", 512, 0, 512, 65536),
        ("tg128", 0, 128, 512, 0), ("tg128@d4096", 0, 128, 512, 4096), ("tg128@d65536", 0, 128, 512, 65536))
    assert peer.kv_types("F16,q8_0", "-ctk") == ["f16", "q8_0"]
    with pytest.raises(ValueError, match=r"-ctv: 'q3_k' is not a KV cache type; choose from f32, f16, q8_0"):
        peer.kv_types("f16,q3_k", "-ctv")
    with pytest.raises(ValueError, match="unknown test 'tg7'"):
        peer.at_depths(["tg7"], [0])
    assert peer.KV_TYPES == KV_CACHE_TYPES


def test_peer_rows_say_their_types(model, device, capsys, monkeypatch):
    """bench/peer.py -d 0,16 -ctk f16,q8_0: a row a model and K/V pair, each with its test@depth
    figures (no llama-server here: the peer's side says so)."""
    peer = _peer()
    monkeypatch.setattr("sys.argv", ["peer.py", model, "--tests", "tg16", "-d", "0,16", "-ctk", "f16,q8_0", "-r", "1",
                                     "--llama-server", "/nonexistent/llama-server", "--json"])
    monkeypatch.setattr(peer, "find_server", lambda path: None)
    monkeypatch.setattr(peer, "TESTS", peer.TESTS)   # main() sets it: put back after the test
    peer.main()
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["type_k"], r["type_v"]) for r in rows] == [("f16", "f16"), ("q8_0", "f16")]
    for r in rows:
        assert set(r["vkrt"]) >= {"tg16", "tg16@d16"} and r["vkrt"]["tg16@d16"] > 0
        assert r["llama.cpp"] == {"error": "no llama-server"}


def test_tune_ab_with_a_quantised_cache(model, device):
    """bench/tune_ab.py -ctk q8_0 -ctv q8_0: every side with that cache, the report says which,
    and the quantised caches' variant (fa_loads_first_by_type=none: the tile held a tile ahead
    where the table dequantises it into shared memory) is timed against the table."""
    import subprocess
    import sys
    from pathlib import Path
    script = Path(__file__).resolve().parents[1] / "bench" / "tune_ab.py"
    proc = subprocess.run([sys.executable, str(script), model, "--tests", "tg16", "-r", "1", "-ctk", "q8_0", "-ctv",
                           "q8_0", "--variant", "fa_loads_first_by_type=none", "--json"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["type_k"], report["type_v"]) == ("q8_0", "q8_0")
    table, variant = report["rows"]
    assert table["tg16"] > 0 and variant["tune"] == "fa_loads_first_by_type=none"
    assert variant["ratio_vs_table"]["tg16"] > 0
