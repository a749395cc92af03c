"""The box's rates (vkrt/engine/box_rates.py): the cache (read back without measuring, refreshed,
a missing CPU type measured and merged, a corrupt file replaced), interpolation over thread counts,
the real measurements at tiny sizes (imported and host-visible copy sources), and where they show
(`vkrt devices`)."""

import dataclasses
import json
import logging
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from vkrt.cli.main import cli
from vkrt.engine import box_rates as br
from vkrt.errors import VkrtError
from vkrt.owned import live_objects

TINY = br.Sizes(h2d_bytes=1 << 16, ram_bytes=1 << 16, expert_bytes=1 << 16, n_embd=256, n_ff=256, seconds=0.0,
                past_cache=0)


@pytest.fixture
def box_device(device, tmp_path, monkeypatch):
    """The session device with its cache under tmp_path."""
    monkeypatch.setattr(device, "settings", device.settings.replace(cache_dir=tmp_path))
    return device


@pytest.fixture
def fake(monkeypatch):
    """The measurements replaced by fast fakes that count their calls (calls[part] or calls[type])."""
    calls = {}

    def count(key):
        calls[key] = calls.get(key, 0) + 1

    def h2d(device, sizes):
        count("h2d")
        return 20.0, br.IMPORTED

    def ram(sizes):
        count("ram")
        return 50.0

    def cpu(type_name, sizes):
        count(type_name)
        return {1: 2.0, 4: 6.0}
    monkeypatch.setattr(br, "measure_h2d", h2d)
    monkeypatch.setattr(br, "measure_ram", ram)
    monkeypatch.setattr(br, "measure_cpu", cpu)
    return calls


def test_cache_round_trip(box_device, fake):
    first = br.box_rates(box_device, ["Q4_K"])
    assert fake == {"h2d": 1, "ram": 1, "Q4_K": 1}
    assert br.cache_path(box_device).is_file()
    again = br.box_rates(box_device, ["q4_k"])
    assert fake == {"h2d": 1, "ram": 1, "Q4_K": 1} and again == first
    assert first.cpu_gbps == {"Q4_K": {1: 2.0, 4: 6.0}} and first.h2d_path == br.IMPORTED
    assert br.cached_box_rates(box_device) == first


def test_refresh_measures_everything_again(box_device, fake):
    br.box_rates(box_device, ["Q4_K"])
    rates = br.box_rates(box_device, ["Q8_0"], refresh=True)
    assert fake == {"h2d": 2, "ram": 2, "Q4_K": 2, "Q8_0": 1}
    assert set(rates.cpu_gbps) == {"Q4_K", "Q8_0"}


def test_missing_type_is_measured_and_merged(box_device, fake):
    br.box_rates(box_device, ["Q4_K"])
    rates = br.box_rates(box_device, ["Q4_K", "Q6_K"])
    assert fake == {"h2d": 1, "ram": 1, "Q4_K": 1, "Q6_K": 1}
    assert set(rates.cpu_gbps) == {"Q4_K", "Q6_K"} and br.cached_box_rates(box_device) == rates


def test_unknown_type_is_skipped_with_a_line(box_device, fake, caplog):
    with caplog.at_level(logging.WARNING, logger="vkrt"):
        rates = br.box_rates(box_device, ["F16", "Q4_K"])
    assert set(rates.cpu_gbps) == {"Q4_K"} and "do not take F16" in caplog.text


def test_cpu_rate_interpolates():
    rates = br.BoxRates("cpu", 16, "gpu", "2025-01-01", 20.0, br.IMPORTED, 50.0, {"Q4_K": {1: 2.0, 8: 9.0, 16: 12.0}})
    assert rates.cpu_rate("Q4_K", 1) == 2.0
    assert rates.cpu_rate("Q4_K", 4) == pytest.approx(5.0)
    assert rates.cpu_rate("Q4_K", 12) == pytest.approx(10.5)
    assert rates.cpu_rate("Q4_K", 32) == 12.0
    with pytest.raises(VkrtError, match="no CPU expert rate for Q6_K.*measured: Q4_K"):
        rates.cpu_rate("Q6_K", 4)
    with pytest.raises(VkrtError, match="at least 1 thread"):
        rates.cpu_rate("Q4_K", 0)


def test_text_forms():
    rates = br.BoxRates("Xeon", 16, "H100", "2025-01-01", 24.5, br.IMPORTED, 61.25, {"Q4_K": {1: 2.0, 16: 30.0}})
    lines = rates.summary_lines()
    assert "Xeon, 16 cores, H100" in lines[0] and "24.5 GB/s from imported host memory" in lines[1]
    assert "61.2 GB/s with 16 threads" in lines[2] and "30.0 GB/s with 16 threads" in lines[3]
    assert br.footer_line(rates) == ("box: Xeon, 16 cores; h2d 24.5 GB/s (imported host memory), RAM 61.2 GB/s, "
                                     "CPU Q4_K 30.0 GB/s")
    failed = dataclasses.replace(rates, h2d_gbps=None, h2d_path=None, ram_gbps=None, cpu_gbps={})
    assert "not measured" in failed.summary_lines()[1] and "h2d not measured" in br.footer_line(failed)
    assert br.BoxRates.from_dict(json.loads(json.dumps(rates.as_dict()))) == rates


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"version": 1, "cpu": "x"}',
                                  '{"version": 99}', "GOOD_BUT_NEGATIVE"])
def test_corrupt_cache_is_replaced(box_device, fake, caplog, text):
    path = br.cache_path(box_device)
    path.parent.mkdir(parents=True)
    if text == "GOOD_BUT_NEGATIVE":
        good = br.BoxRates("c", 2, "g", "2025-01-01", 1.0, br.IMPORTED, 1.0, {"Q4_K": {1: 1.0}}).as_dict()
        text = json.dumps({"version": br.CACHE_VERSION, **good, "ram_gbps": -3})
    path.write_text(text)
    with caplog.at_level(logging.WARNING, logger="vkrt"):
        rates = br.box_rates(box_device, ["Q4_K"])
    assert f"the cache file {path} is unreadable" in caplog.text
    assert fake == {"h2d": 1, "ram": 1, "Q4_K": 1}
    assert br.BoxRates.from_dict(json.loads(path.read_text())) == rates


def test_measurements_at_tiny_sizes(device):
    before = live_objects()
    gbps, path = br.measure_h2d(device, TINY)
    assert gbps > 0 and path == (br.IMPORTED if device.profile.host_import else br.HOST_VISIBLE)
    assert live_objects() == before
    assert br.measure_ram(TINY) > 0
    rates = br.measure_cpu("Q4_K", TINY)
    assert set(rates) == set(br.thread_counts(br.cpu_cores())) and all(r > 0 for r in rates.values())


def test_cpu_stack_spans_the_caches(monkeypatch):
    """The expert stack the CPU runs go round holds past_cache times the largest cache, so each
    run reads from RAM; a timed run reads expert_bytes of it."""
    seen = {}
    real = br.synthetic_ffn

    def spy(type_name, sizes, total_bytes):
        ffn, n_expert = real(type_name, sizes, total_bytes)
        seen.update(total=total_bytes, stack=n_expert * ffn.expert_bytes(), per_expert=ffn.expert_bytes())
        return ffn, n_expert
    monkeypatch.setattr(br, "largest_cache", lambda: 1 << 20)
    monkeypatch.setattr(br, "synthetic_ffn", spy)
    br.measure_cpu("Q4_K", dataclasses.replace(TINY, past_cache=2))
    assert seen["total"] == 2 << 20 and seen["stack"] >= 2 << 20
    assert seen["stack"] < (2 << 20) + br.GROUP * seen["per_expert"]


def test_copy_without_host_import_uses_a_host_visible_buffer(device, monkeypatch):
    monkeypatch.setattr(device, "profile", dataclasses.replace(device.profile, host_import=False))
    gbps, path = br.measure_h2d(device, TINY)
    assert gbps > 0 and path == br.HOST_VISIBLE


def test_failed_copy_is_none_and_a_line(device, monkeypatch, caplog):
    monkeypatch.setattr(br, "Buffer", lambda *a, **k: (_ for _ in ()).throw(VkrtError("no memory today")))
    monkeypatch.setattr(device, "profile", dataclasses.replace(device.profile, host_import=False))
    with caplog.at_level(logging.WARNING, logger="vkrt"):
        assert br.measure_h2d(device, TINY) == (None, None)
    assert "no memory today" in caplog.text


def test_expert_types():
    t = {n: SimpleNamespace(type=SimpleNamespace(name=q)) for n, q in
         [("blk.0.ffn_gate_exps.weight", "Q4_K"), ("blk.0.ffn_down_exps.weight", "Q6_K"),
          ("blk.0.attn_q.weight", "Q8_0"), ("blk.1.ffn_up_exps.weight", "Q4_K")]}
    assert br.expert_types(t) == ("Q4_K", "Q6_K")
    assert br.expert_types(t, ["blk.1.ffn_up_exps.weight", "blk.0.attn_q.weight"]) == ("Q4_K",)


def test_devices_shows_the_box(device, fake, tmp_path, monkeypatch):
    monkeypatch.setenv("VKRT_CACHE_DIR", str(tmp_path))
    result = CliRunner().invoke(cli, ["devices", "--json", "--types", "q8_0,Q4_K"])
    assert result.exit_code == 0, result.output
    box = json.loads(result.output)["box"]
    assert box["device"] == device.profile.name and set(box["cpu_gbps"]) == {"Q8_0", "Q4_K"}
    result = CliRunner().invoke(cli, ["devices"])
    assert result.exit_code == 0 and "CPU experts Q8_0" in result.output and "measuring" not in result.output
    assert fake == {"h2d": 1, "ram": 1, "Q8_0": 1, "Q4_K": 1}
    result = CliRunner().invoke(cli, ["devices", "--remeasure", "--types", "Q4_K"])
    assert result.exit_code == 0 and "measuring this box's rates" in result.output
    assert fake == {"h2d": 2, "ram": 2, "Q8_0": 2, "Q4_K": 2}
    result = CliRunner().invoke(cli, ["devices", "--types", "Q4_K,Q9_Z"])
    assert result.exit_code == 2 and "Q9_Z: the CPU expert kernels take" in result.output


def test_devices_measures_for_real_where_import_fails(device, tmp_path, monkeypatch):
    """`vkrt devices --json` with the real measurements (tiny sizes) and every import refused."""
    def refuse(*args, **kwargs):
        raise br.HostImportError("refused for the test")
    monkeypatch.setenv("VKRT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(br, "DEFAULT_SIZES", TINY)
    monkeypatch.setattr(br, "ImportedBuffer", refuse)
    result = CliRunner().invoke(cli, ["devices", "--json"])
    assert result.exit_code == 0, result.output
    box = json.loads(result.output)["box"]
    assert box["h2d_path"] == br.HOST_VISIBLE and box["h2d_gbps"] > 0 and box["ram_gbps"] > 0
    assert box["cores"] == br.cpu_cores() and set(box["cpu_gbps"]) == {"Q4_K"}


def _model(device, host_tensors):
    weights = {n: SimpleNamespace(type=SimpleNamespace(name="Q4_K")) for n in
               ("blk.0.ffn_gate_exps.weight", "blk.0.attn_q.weight")}
    return SimpleNamespace(device=device, weights=weights, placement=SimpleNamespace(host_tensors=host_tensors))


def test_server_props_box(box_device, fake):
    """/props has `box` where the model keeps experts in host memory and the rates were measured
    (model_box_rates at start); a model with every expert in VRAM measures nothing and shows none."""
    from vkrt.server.routes import Api
    from vkrt.server.state import ServerConfig
    in_vram = _model(box_device, ["blk.0.attn_q.weight"])
    assert br.model_box_rates(in_vram) is None and \
        Api(SimpleNamespace(model=in_vram, config=ServerConfig()))._box() == {}
    on_host = _model(box_device, ["blk.0.ffn_gate_exps.weight"])
    api = Api(SimpleNamespace(model=on_host, config=ServerConfig()))
    assert api._box() == {}
    rates = br.model_box_rates(on_host)
    assert fake == {"h2d": 1, "ram": 1, "Q4_K": 1}
    assert api._box() == {"box": rates.as_dict()}


def test_devices_with_a_model_measures_its_expert_types(device, fake, tmp_path, monkeypatch):
    from models import tiny_model
    from vkrt.cpu.dot_types import DOTS
    from vkrt.model.split_gguf import open_gguf
    path = tiny_model("tiny-qwen3moe", tmp_path)
    with open_gguf(path, progress=False) as f:
        want = {t for t in br.expert_types(dict(f.tensors)) if t in DOTS} or {"Q4_K"}
    monkeypatch.setenv("VKRT_CACHE_DIR", str(tmp_path))
    result = CliRunner().invoke(cli, ["devices", "-m", path, "-ncmoe", "1", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert set(out["box"]["cpu_gbps"]) == want == {k for k in fake if k not in ("h2d", "ram")}
    fits = out["devices"][0]["max_context_by_kv_type"]   # shorter KV rows: at least as long a context
    assert fits["f32"] <= fits["f16"] <= fits["q8_0"] <= fits["q4_0"] <= out["n_ctx_train"]
    result = CliRunner().invoke(cli, ["devices", "-m", path, "-ncmoe", "1"])
    assert result.exit_code == 0 and "host -> GPU copy   20.0 GB/s" in result.output
    assert f"q8_0 {fits['q8_0']:,}" in result.output
