"""`vkrt devices` output, JSON, and clear errors for bad settings or missing Vulkan."""

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from vkrt.cli.main import cli


def test_devices_table(device):
    result = CliRunner().invoke(cli, ["devices"])
    assert result.exit_code == 0, result.output
    assert device.profile.name in result.output and "[selected]" in result.output
    for row in ("architecture", "subgroup", "fp16 math", "int8 dot", "matrix cores", "shared memory", "VRAM",
                "host import", "transfer queue"):
        assert row in result.output


def test_devices_json(device):
    result = CliRunner().invoke(cli, ["devices", "--json"])
    assert result.exit_code == 0
    data = json.loads(result.output)
    assert data["selected"] == device.profile.index
    first = data["devices"][0]
    assert first["architecture"] == device.profile.architecture.value
    assert first["tuning"]["wg_size"] == device.tuning.wg_size


def test_arch_override_is_shown(device, monkeypatch):
    monkeypatch.setenv("VKRT_ARCH", "gcn")
    result = CliRunner().invoke(cli, ["devices"])
    assert "AMD_GCN (VKRT_ARCH override" in result.output


def test_coopmat_setting_is_shown(device, monkeypatch):
    """The tuning row says which prompt GEMM the device gets; VKRT_COOPMAT=1 on a device without
    fp16 cooperative matrices is listed with the refusal opening it would give, and a command that
    opens it stops with that one line."""
    result = CliRunner().invoke(cli, ["devices"])
    want = "on cooperative matrices" if device.tuning.mm_coopmat else "fp32"
    assert f"prompt GEMM {want} ({device.tuning.mm_bm}x{device.tuning.mm_bn} tiles" in result.output
    if device.profile.coopmat_f16:
        return
    monkeypatch.setenv("VKRT_COOPMAT", "1")
    result = CliRunner().invoke(cli, ["devices"])
    assert result.exit_code == 0 and "opening it would fail: VKRT_COOPMAT=1" in result.output
    result = CliRunner().invoke(cli, ["bench", "-p", "8", "-n", "0"])
    assert result.exit_code != 0 and "lacks 16x16x16 fp16 cooperative matrices" in result.output
    assert "Traceback" not in result.output


def test_tuning_overrides_are_shown_and_refused_by_name(device, monkeypatch):
    """VKRT_TUNE (vkrt/device/tune.py): `vkrt devices` lists the overrides, or the refusal opening
    the device would give; a command that opens it stops with that one line."""
    monkeypatch.setenv("VKRT_TUNE", "mv_rows=2")
    result = CliRunner().invoke(cli, ["devices"])
    assert result.exit_code == 0 and "tuning overrides  VKRT_TUNE='mv_rows=2'" in result.output
    too_wide = device.profile.max_workgroup_invocations * 2
    monkeypatch.setenv("VKRT_TUNE", f"fa_wg={too_wide}")
    result = CliRunner().invoke(cli, ["devices"])
    assert result.exit_code == 0 and f"opening it would fail: VKRT_TUNE: fa_wg={too_wide} cannot" in result.output
    result = CliRunner().invoke(cli, ["bench", "-p", "8", "-n", "0"])
    assert result.exit_code == 1 and f"Error: VKRT_TUNE: fa_wg={too_wide} cannot be honoured" in result.output
    assert "Traceback" not in result.output and "--device" not in result.output
    monkeypatch.setenv("VKRT_TUNE", "fa_wg=wide")
    result = CliRunner().invoke(cli, ["devices"])
    assert result.exit_code == 1 and "VKRT_TUNE: 'fa_wg=wide': fa_wg takes a whole number" in result.output


def test_bad_arch_is_one_clear_line(monkeypatch):
    monkeypatch.setenv("VKRT_ARCH", "vega")
    result = CliRunner().invoke(cli, ["devices"])
    assert result.exit_code == 1
    assert "VKRT_ARCH='vega'" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("name, text, says", [
    ("VKRT_ARCH", "vega", "VKRT_ARCH='vega' is not an architecture"),
    ("VKRT_TUNE", "fa_wg=wide", "VKRT_TUNE: 'fa_wg=wide': fa_wg takes a whole number"),
    ("VKRT_FUSE", "gate_upp", "VKRT_FUSE: 'gate_upp' is not a fusion"),
])
def test_bad_layer_words_stop_the_command_at_start(monkeypatch, name, text, says):
    """The settings keep VKRT_ARCH, VKRT_TUNE and VKRT_FUSE as text for their layers to parse; the
    CLI has those layers check them at start (common.check_settings), before any Vulkan instance."""
    from vkrt.device.instance import Instance

    def opened(*args, **kwargs):
        raise AssertionError("an instance was created before the settings were checked")
    monkeypatch.setattr(Instance, "__init__", opened)
    monkeypatch.setenv(name, text)
    result = CliRunner().invoke(cli, ["devices"])
    assert result.exit_code == 1 and f"Error: {says}" in result.output and "Traceback" not in result.output


def _run_vkrt(env_extra, tmp_path):
    env = {**os.environ, **env_extra}
    return subprocess.run([sys.executable, "-m", "vkrt.cli", "devices"], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)


def test_no_driver_says_what_to_install(tmp_path):
    proc = _run_vkrt({"VK_DRIVER_FILES": str(tmp_path / "none.json"), "VK_ICD_FILENAMES": str(tmp_path / "none.json")},
                     tmp_path)
    assert proc.returncode == 1
    assert "apt-get install" in proc.stderr and "Traceback" not in proc.stderr


def test_no_loader_says_what_to_install(tmp_path):
    fake = tmp_path / "fake" / "vulkan"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise OSError('Cannot find Vulkan SDK version')\n")
    proc = _run_vkrt({"PYTHONPATH": str(tmp_path / "fake")}, tmp_path)
    assert proc.returncode == 1
    assert "libvulkan" in proc.stderr and "apt-get install" in proc.stderr and "Traceback" not in proc.stderr


def test_bench_rejects_negative_sizes(tmp_path):
    """-p/-n take counts of 0 or more: a negative one is a usage error naming the option."""
    model = tmp_path / "none.gguf"
    model.write_bytes(b"")
    for opt in ("-p", "-n"):
        result = CliRunner().invoke(cli, ["bench", "-m", str(model), opt, "-5"])
        assert result.exit_code == 2 and f"{opt}: '-5' holds a negative count" in result.output, result.output
        assert "Traceback" not in result.output


def test_serve_refuses_a_negative_itl_ratio(tmp_path):
    model = tmp_path / "none.gguf"
    model.write_bytes(b"")
    result = CliRunner().invoke(cli, ["serve", "-m", str(model), "--max-itl-ratio", "-1"])
    assert result.exit_code == 2 and "--max-itl-ratio" in result.output and "is not in the range" in result.output


def test_context_past_the_buffer_limit_names_the_option(device, tmp_path):
    """A buffer past the device's limit: a ConfigError that says which option to lower."""
    import dataclasses

    from models import tiny_model
    from vkrt.engine.engine import Engine
    from vkrt.errors import ConfigError
    from vkrt.model.loader import Model

    path = tiny_model("tiny-llama", tmp_path)
    with Model(device, path, progress=False) as m:
        saved = device.profile
        device.profile = dataclasses.replace(saved, max_buffer_size=1 << 16)
        try:
            with pytest.raises(ConfigError, match=r"lower (-ub \(now 16\) or )?-c \(now 4096\)"):
                Engine(m, n_ctx=4096, n_ubatch=16)
        finally:
            device.profile = saved


def test_run_refuses_a_bad_sampler_chain(tmp_path):
    """--samplers / --sampling-seq: a chain vkrt cannot run is a usage error naming the option,
    before any model is opened."""
    model = tmp_path / "none.gguf"
    model.write_bytes(b"")
    for args, hint, what in ((["--samplers", "top_k;dry"], "--samplers", "must come before"),
                             (["--sampling-seq", "kq"], "--sampling-seq", "unknown sampler letter"),
                             (["--samplers", "top_k", "--sampling-seq", "k"], "not both", "not both")):
        result = CliRunner().invoke(cli, ["run", "-m", str(model), *args])
        assert result.exit_code == 2 and hint in result.output and what in result.output, result.output
        assert "Traceback" not in result.output


BAD_OPTION_VALUES = [
    *[(["run", "-hf", name], "-hf") for name in ("a/b/c:Q4", ":::", "owner/", "/name", "a b/c", "o/x..y", "o/..",
                                                  "-o/n", "o/n.", "o--w/n", "o/n:Q4 K", "o/n:x:Q4", "", "o/" + "n" * 97)],
    (["bench", "-hf", "o/n,a/b/c"], "-hf"),
    (["serve", "-hf", "a/b/c"], "-hf"),
    (["perplexity", "-hf", "owner/"], "-hf"),
    *[(["run", opt, "99999999999999999999999"], opt) for opt in ("-c", "-b", "-ub", "-n", "-ngl", "-ncmoe", "-mg",
                                                                  "--cpu-moe-threads", "--top-k", "--seed")],
    (["run", "-c", "2147483648"], "-c"),
    (["run", "--top-k", "-99999999999999999999999"], "--top-k"),
    (["run", "--seed", "-2"], "--seed"),
    *[(["run", opt, value], opt) for opt in ("--temp", "--top-p", "--min-p", "--repeat-penalty", "--link-bandwidth")
      for value in ("nan", "inf")],
    *[(["run", "-ts", value], "-ts") for value in ("nan,1", "inf,1", "-1,1", "0,0", "")],
    *[(["serve", opt, "99999999999999999999999"], opt) for opt in ("-c", "--port", "-np", "--body-limit",
                                                                    "--ctx-checkpoints", "--reasoning-budget")],
    (["serve", "--port", "65536"], "--port"),
    *[(["serve", opt, "nan"], opt) for opt in ("--shutdown-timeout", "-to", "--max-itl-ratio")],
    (["serve", "-to", "inf"], "-to"),
    *[(["serve", "--responses-store-max", value], "--responses-store-max") for value in ("0", "-1", "x",
                                                                                      "99999999999999999999999")],
    *[(["serve", "--responses-store-ttl", value], "--responses-store-ttl") for value in ("0", "-1", "nan", "inf")],
    (["perplexity", "--chunks", "99999999999999999999999"], "--chunks"),
    (["perplexity", "--chunks", "-2"], "--chunks"),
    *[(["devices", opt, "99999999999999999999999"], opt) for opt in ("-c", "-b", "-ub", "-ngl", "-ncmoe", "-np")],
    *[(["bench", opt, "99999999999999999999999"], opt) for opt in ("-p", "-n", "-d", "-b", "-ub", "-ngl", "-ncmoe",
                                                                    "-mg", "--cpu-moe-threads", "-r")],
    (["bench", "-p", "0-99999999999"], "-p"),
    (["bench", "-pg", "512,99999999999999999999999"], "-pg"),
    (["bench", "-ts", "nan/1"], "-ts"),
    (["bench", "--link-bandwidth", "inf"], "--link-bandwidth"),
    (["bench-h2d", "--iters", "99999999999999999999999"], "--iters"),
    (["bench-h2d", "--iters", "0"], "--iters"),
]


@pytest.mark.parametrize("args, option", BAD_OPTION_VALUES)
def test_bad_option_value_is_one_usage_line(tmp_path, monkeypatch, args, option):
    """Malformed -hf names and option values past what the engine takes (beyond 2^31-1, ports past
    65535, nan or inf) stop the command at start with one error line naming the option: no model
    is opened and the hub is never asked."""
    from vkrt.model import hub

    def asked(*args, **kwargs):
        raise AssertionError("the hub was asked about a malformed name")
    monkeypatch.setattr(hub, "list_files", asked)
    model = tmp_path / "none.gguf"
    model.write_bytes(b"")
    command, *rest = args
    model_args = [] if command == "bench-h2d" or "-hf" in rest else ["-m", str(model)]
    result = CliRunner().invoke(cli, [command, *model_args, *rest])
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert result.exit_code == 2, result.output
    assert len(errors) == 1 and option in errors[0], result.output
    assert "Traceback" not in result.output and "not a GGUF file" not in result.output
