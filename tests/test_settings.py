"""vkrt.settings: every VKRT_* variable parsed by one rule per type, read once into Settings,
and docs/environment.md's table generated from the declarations."""

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from file_modules import load
from vkrt.errors import ConfigError
from vkrt.settings import BY_NAME, VARIABLES, Settings, markdown_table, read_variable

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("text", ["1", "on", "ON", "true", "True", "yes", " yes "])
def test_flag_on_spellings(text):
    assert Settings.from_env({"VKRT_VALIDATE": text}).validate is True


@pytest.mark.parametrize("text", ["0", "off", "Off", "false", "FALSE", "no"])
def test_flag_off_spellings(text):
    """VKRT_VALIDATE=off once turned validation on."""
    s = Settings.from_env({"VKRT_VALIDATE": text, "VKRT_SHADER_CACHE": text})
    assert s.validate is False and s.shader_cache is False


@pytest.mark.parametrize("name", [v.name for v in VARIABLES if v.field and v.kind.startswith("flag")])
@pytest.mark.parametrize("text", ["2", "y", "enable", "-1"])
def test_every_flag_refuses_other_words(name, text):
    with pytest.raises(ConfigError, match=f"{name}={text!r} is not a flag"):
        Settings.from_env({name: text})


def test_unset_and_empty_take_the_default():
    blank = {v.name: "" for v in VARIABLES}
    assert Settings.from_env(blank) == Settings.from_env({}) == Settings()
    s = Settings()
    assert (s.validate, s.register_host, s.prefetch_slots, s.gpu_timeout, s.moe_stage, s.fa_mask_opt) == \
        (False, True, 3, 600.0, None, None)


def test_tristate_flags():
    assert Settings.from_env({"VKRT_MOE_STAGE": "yes", "VKRT_FA_MASK_OPT": "off"}).moe_stage is True
    assert Settings.from_env({"VKRT_FA_MASK_OPT": "off"}).fa_mask_opt is False


def test_sizes_counts_seconds_and_enums():
    s = Settings.from_env({"VKRT_IMPORT_CHUNK": "256M", "VKRT_VRAM_BUDGET": "7.5G", "VKRT_STAGING_THREADS": "2",
                           "VKRT_PREFETCH_SLOTS": "0", "VKRT_GPU_TIMEOUT": "2.5"})
    assert (s.import_chunk, s.vram_budget, s.staging_threads, s.prefetch_slots, s.gpu_timeout) == \
        (256 << 20, int(7.5 * (1 << 30)), 2, 0, 2.5)
    bad = [("VKRT_IMPORT_CHUNK", "lots", "is not a size"), ("VKRT_VRAM_BUDGET", "0", "more than 0"),
           ("VKRT_STAGING_THREADS", "0", "out of range"), ("VKRT_STAGING_THREADS", "two", "not a whole number"),
           ("VKRT_PREFETCH_SLOTS", "9", r"out of range \(0\.\.8\)"), ("VKRT_GPU_TIMEOUT", "soon", "seconds"),
           ("VKRT_GPU_TIMEOUT", "-1", "more than 0")]
    for name, text, why in bad:
        with pytest.raises(ConfigError, match=f"{name}={text!r}.*{why}"):
            Settings.from_env({name: text})


def test_a_layers_words_are_kept_as_text():
    """VKRT_ARCH and VKRT_TUNE name things of the device layer, which parses them when the device
    opens (tests/test_architecture.py, test_tune.py); the settings keep their text, unjudged."""
    s = Settings.from_env({"VKRT_ARCH": " Polaris ", "VKRT_TUNE": " mv_rows=2, fa_wg=wide "})
    assert (s.arch, s.tune) == ("Polaris", "mv_rows=2, fa_wg=wide")
    assert (Settings().arch, Settings().tune) == ("", "")
    assert "`gcn`, `intel`" in markdown_table()   # the names VKRT_ARCH takes, declared here


def test_cache_dir_follows_xdg(tmp_path):
    assert Settings.from_env({"XDG_CACHE_HOME": str(tmp_path)}).cache_dir == tmp_path / "vkrt"
    s = Settings.from_env({"XDG_CACHE_HOME": "/elsewhere", "VKRT_CACHE_DIR": str(tmp_path)})
    assert s.shader_cache_dir == tmp_path / "spirv" and s.tokenizer_cache_dir == tmp_path / "tokenizers"
    off = Settings.from_env({"VKRT_SHADER_CACHE": "0", "VKRT_TOKENIZER_CACHE": "off"})
    assert off.shader_cache_dir is None and off.tokenizer_cache_dir is None


def test_unknown_and_retired_variables_are_named(caplog):
    with caplog.at_level(logging.WARNING, logger="vkrt"):
        Settings.from_env({"VKRT_FUSE_GLUE": "1", "VKRT_CONCAT_GENERIC": "1", "VKRT_EXPECT_LAVAPIPE": "1",
                           "VKRT_FUSE_GATE_UP": "0", "VKRT_FUSE_QKV": "1"})
    assert "VKRT_FUSE_GLUE is set but ignored" in caplog.text
    assert "VKRT_FUSE_GATE_UP is set but ignored: VKRT_FUSE chooses the fusions now (e.g. VKRT_FUSE=all,-gate_up)" \
        in caplog.text
    assert "VKRT_FUSE_QKV is set but ignored: that fusion was deleted" in caplog.text
    assert "VKRT_CONCAT_GENERIC is set but ignored: pass path='generic'" in caplog.text
    assert "VKRT_EXPECT_LAVAPIPE" not in caplog.text   # declared (the tests read it)


def test_replace_refuses_unknown_fields():
    assert Settings().replace(validate=True).validate
    with pytest.raises(ConfigError, match="fuse_qvk"):
        Settings().replace(fuse_qvk=True)


def test_every_variable_is_declared_once_with_a_field():
    names = [v.name for v in VARIABLES]
    assert len(names) == len(set(names)) == len(BY_NAME)
    fields = {f for f in Settings.__dataclass_fields__}
    declared = [v.field for v in VARIABLES if v.field]
    assert sorted(declared) == sorted(fields)
    assert read_variable("VKRT_EXPECT_LAVAPIPE", {"VKRT_EXPECT_LAVAPIPE": "yes"}) is True


def test_no_layer_below_the_cli_reads_the_environment():
    """os.environ / getenv appear in vkrt/ only in settings.py (the one reader)."""
    readers = []
    for path in (ROOT / "vkrt").rglob("*.py"):
        if path.name != "settings.py":
            text = path.read_text()
            if "os.environ" in text or "getenv(" in text:
                readers.append(str(path.relative_to(ROOT)))
    assert not readers


def test_documented_table_is_generated_from_the_declarations():
    env_table = load("scripts", "env_table")
    doc = (ROOT / "docs" / "environment.md").read_text()
    assert env_table.BEGIN + markdown_table() + env_table.END in doc, \
        "docs/environment.md's table differs from the declarations: run scripts/env_table.py"
    assert env_table.rendered() == doc
    out = subprocess.run([sys.executable, "-m", "vkrt.settings", "--markdown"], capture_output=True, text=True,
                         check=True).stdout
    assert out == markdown_table()


def test_device_takes_its_settings(device):
    """A Device keeps the Settings it was given: the VRAM budget and the host-wait timeout."""
    from vkrt.device import Device
    from vkrt.errors import GpuTimeout
    with Device(settings=device.settings.replace(gpu_timeout=0.25, vram_budget=1 << 20)) as dev:
        assert dev.vram_budget == 1 << 20 and dev.settings.gpu_timeout == 0.25
        with pytest.raises(GpuTimeout, match="VKRT_GPU_TIMEOUT"):
            dev.compute.timeline.wait(dev.compute.last_submitted + 1)   # nothing will signal it
