"""The MoE options on the command line: --expert-cache on `vkrt run` (same tokens with the
cache off, automatic or tiny; a bad size is one clear error); on `vkrt bench` -ncmoe and the
host-expert lists (--cpu-experts, --cpu-moe-threads, --link-bandwidth), tg's random tokens and
the expert traffic of its timed runs; bench/cpu_moe_sweep.py."""

import json
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from file_modules import ROOT, load
from models import tiny_model
from vkrt.cli.main import cli
from vkrt.engine import engine as engine_module, options as options_module
from vkrt.engine.bench import BenchTest, run_test
from vkrt.model.loader import Model


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
    and a variant the tuning refuses reported as refused (the others still run); -ctk with two
    types is a usage error."""
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
    bad = subprocess.run([sys.executable, str(script), moe_model, "-ctk", "q8_0,f16"], capture_output=True, text=True,
                         timeout=600)
    assert bad.returncode == 2 and "-ctk and -ctv take one type each" in bad.stderr


def test_bench_tg_decodes_new_random_tokens(device, moe_model, monkeypatch):
    """tg feeds a new random token each step (one greedy step given the host's token), from
    another seeded sequence in the warm-up and each repetition, reproducibly; not the greedy
    chain, whose warm-up would leave in the expert cache exactly the experts it meets again."""
    with Model(device, moe_model, n_cpu_moe=2, progress=False) as m, engine_module.Engine(m, n_ctx=256) as e:
        greedy, fed = e.greedy, []

        def spy(token, seq_id=0, n=1, pipeline=None):
            fed.append((token, n))
            return greedy(token, seq_id, n, pipeline)
        monkeypatch.setattr(e, "greedy", spy)
        run_test(e, BenchTest(0, 6), 2)
        assert [n for _, n in fed] == [1] * 18
        warm_up, first, second = ([t for t, _ in fed[k:k + 6]] for k in (0, 6, 12))
        assert len({tuple(warm_up), tuple(first), tuple(second)}) == 3
        chain = [first[0], *greedy(first[0], 0, 5)]
        assert first != chain
        fed.clear()
        run_test(e, BenchTest(0, 6), 2)
        assert [t for t, _ in fed] == warm_up + first + second


class CountingEngine:
    """run_test's view of an engine whose expert-traffic counters (one live object, as a
    counter the engine keeps adding to) grow with each evaluated and each decoded token."""

    def __init__(self):
        self.model = SimpleNamespace(cfg=SimpleNamespace(vocab_size=50))
        self.counts = SimpleNamespace(tokens=0, pairs_cached=0, pairs_copied=0, pairs_cpu=0, bus_bytes=0)

    def reset(self):
        pass

    def snapshot(self, seq_id):
        pass

    def truncate(self, seq_id, length):
        return length

    def eval(self, tokens):
        self.counts.tokens += len(tokens)
        self.counts.bus_bytes += 1000 * len(tokens)

    def greedy(self, token, seq_id, n):
        c = self.counts
        c.tokens, c.pairs_cached, c.pairs_cpu, c.bus_bytes = c.tokens + 1, c.pairs_cached + 1, c.pairs_cpu + 3, \
            c.bus_bytes + 10
        yield 0

    def expert_traffic(self):
        return self.counts


def test_bench_counts_the_expert_traffic_of_the_timed_runs():
    """The counters' change over the timed steps only: not the warm-up, nor the untimed depth."""
    res = run_test(CountingEngine(), BenchTest(0, 4, n_depth=8), 2)
    assert res.traffic == dict(pairs_cached=8, pairs_copied=0, pairs_cpu=24, bus_bytes=80, tokens=8)
    assert res.expert_shares == (0.25, 0.0, 0.75) and res.bus_bytes_per_token == 10

    class Uncounted(CountingEngine):   # --cpu-experts off: the engine counts nothing
        def expert_traffic(self):
            return None
    res = run_test(Uncounted(), BenchTest(0, 4), 1)
    assert res.traffic is None and res.expert_shares is None and res.bus_bytes_per_token is None


def test_bench_host_expert_lists_reach_the_engine(device, moe_model, monkeypatch):
    """--cpu-experts, --cpu-moe-threads and --link-bandwidth take comma lists that expand into
    rows, each through EngineOptions to the Engine, and show as columns when given."""
    options, engines = [], []
    real_options, real_engine = options_module.EngineOptions, engine_module.Engine

    def spy_options(**kw):
        options.append(kw)
        return real_options(**kw)

    class SpyEngine(real_engine):
        def __init__(self, model, **kw):
            engines.append({k: kw[k] for k in ("cpu_experts", "cpu_moe_threads", "link_bandwidth")})
            super().__init__(model, **kw)
    monkeypatch.setattr(options_module, "EngineOptions", spy_options)
    monkeypatch.setattr(engine_module, "Engine", SpyEngine)
    args = ["bench", "-m", moe_model, "-p", "0", "-n", "2", "-r", "1", "-ncmoe", "2"]
    result = CliRunner().invoke(cli, args + ["--cpu-experts", "off,all", "--cpu-moe-threads", "2", "--link-bandwidth",
                                             "3,1.5", "-o", "json"])
    assert result.exit_code == 0, result.output
    want = [dict(cpu_experts=c, cpu_moe_threads=2, link_bandwidth=b) for c in ("off", "all") for b in (3.0, 1.5)]
    assert [{k: o[k] for k in ("cpu_experts", "cpu_moe_threads", "link_bandwidth")} for o in options] == want
    assert engines == want
    rows = json.loads(result.output)
    assert [(r["cpu_experts"], r["cpu_moe_threads"], r["link_gbps"], r["n_threads"]) for r in rows] == \
        [(c, 2, b, 2) for c in ("off", "all") for b in (3.0, 1.5)]
    assert all("experts_cpu_share" in r and "bus_bytes_per_token" in r for r in rows)
    from vkrt.engine import box_rates
    monkeypatch.setattr(box_rates, "box_rates", lambda *a, **k: None)   # no rates measured here
    monkeypatch.setattr(box_rates, "footer_line", lambda rates: "box")
    header = CliRunner().invoke(cli, args + ["--cpu-experts", "all"]).output.splitlines()[0]
    assert "| cpu_experts |" in header and "| MB/tok |" in header and "moe_threads" not in header


@pytest.mark.parametrize("flag, value, says", [
    ("--cpu-experts", "off,maybe", "--cpu-experts: 'maybe' is not one of off, auto, all"),
    ("--cpu-moe-threads", "4,0", "--cpu-moe-threads: '4,0' holds 0; give at least 1"),
    ("--link-bandwidth", "12,fast", "--link-bandwidth: 'fast' is not a number of GB/s"),
    ("--link-bandwidth", "0", "--link-bandwidth: '0': the rate must be more than 0 GB/s"),
])
def test_bench_refuses_bad_host_expert_values(tmp_path, flag, value, says):
    model = tmp_path / "none.gguf"
    model.write_bytes(b"")
    result = CliRunner().invoke(cli, ["bench", "-m", str(model), flag, value])
    assert result.exit_code == 2 and says in result.output, result.output
    assert "Traceback" not in result.output


def test_bench_footer_gives_the_box_rates_with_host_experts_only(device, moe_model, monkeypatch):
    """Under the md table, the box's rates (vkrt.engine.box_rates) for a model with host-resident
    experts; nothing measured for one without."""
    from vkrt.engine import box_rates
    measured = []
    monkeypatch.setattr(box_rates, "box_rates", lambda dev: measured.append(dev) or "RATES")
    monkeypatch.setattr(box_rates, "footer_line", lambda rates: f"box: {rates}")
    args = ["bench", "-m", moe_model, "-p", "0", "-n", "2", "-r", "1", "--cpu-experts", "off"]
    result = CliRunner().invoke(cli, args + ["-ncmoe", "0"])
    assert result.exit_code == 0 and not measured and "box:" not in result.output, result.output
    result = CliRunner().invoke(cli, args + ["-ncmoe", "2"])
    assert result.exit_code == 0 and [d.profile.name for d in measured] == [device.profile.name], result.output
    build, box = result.output.rstrip().splitlines()[-2:]
    assert build.startswith("build: vkrt") and box == "box: RATES"


def _sweep(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    return load("bench", "cpu_moe_sweep")


def test_cpu_moe_sweep_parses_its_lists(monkeypatch):
    sweep = _sweep(monkeypatch)
    args = sweep.parse_args(["m.gguf", "-ncmoe", "4"])
    assert args.link_bandwidth == [None, 12.0, 3.0, 1.0] and args.cpu_experts == ["off", "auto", "all"]
    assert args.expert_cache == ["0", "card", "auto"] and args.card_budget == 8 << 30
    args = sweep.parse_args(["m.gguf", "-ncmoe", "4", "--cpu-moe-threads", "4,8", "--link-bandwidth", "unpaced,2.5",
                             "--expert-cache", "0,1G"])
    assert args.cpu_moe_threads == [4, 8] and args.link_bandwidth == [None, 2.5] and args.expert_cache == ["0", "1G"]
    rows = sweep.configs(args)   # off runs no CPU expert: once per link and cache, without threads
    assert len(rows) == 2 * 2 * (1 + 2 * 2)
    assert [r["threads"] for r in rows if r["cpu_experts"] == "off"] == [None] * 4
    for bad in (["--cpu-experts", "maybe"], ["--link-bandwidth", "0"], ["--cpu-moe-threads", "x"],
                ["--expert-cache", "lots"], []):
        with pytest.raises(SystemExit):
            sweep.parse_args(["m.gguf", *(["-ncmoe", "4"] if bad else []), *bad])


def test_cpu_moe_sweep_runs_vkrt_without_the_peer(device, moe_model, monkeypatch, capsys):
    """A tiny sweep in this process: a row per configuration with tg and pp, and the JSON names."""
    sweep = _sweep(monkeypatch)
    sweep.main([moe_model, "-ncmoe", "2", "-p", "16", "-n", "4", "-r", "1", "--link-bandwidth", "unpaced,2",
                "--cpu-experts", "off,all", "--cpu-moe-threads", "1", "--expert-cache", "0,card", "--card-budget", "1G",
                "--no-peer", "--json"])
    report = json.loads(capsys.readouterr().out)
    rows = report["rows"]
    assert [(r["link_gbps"], r["cpu_experts"], r["threads"], r["cache"]) for r in rows] == \
        [(link, cpu, threads, cache) for link in (None, 2.0) for cpu, threads in (("off", None), ("all", 1))
         for cache in ("0", "1.0 GiB card")]
    assert all(r["tg_ts"] > 0 and r["pp_ts"] > 0 and r["ratio_vs_llama_cpp"] == {} for r in rows), rows
    assert report["llama_cpp"] == [] and report["n_cpu_moe"] == 2
    assert "| unpaced | - | off | 0 |" in sweep.table(report)
