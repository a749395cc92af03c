"""What the bench scripts share: the settings read once from the environment, whether the run is
Polaris-class (the llama.cpp peer then runs with the same restrictions), models opened the way
the CLI, the server and the Python API open them (vkrt.engine.options), and the GPU brought to
its working clock before a timing, the generated recurrent model the catch-up benchmarks default
to, and their JSON output."""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import contextmanager

from vkrt.device import Arch, parse_arch, parse_tune
from vkrt.engine.options import EngineOptions, open_engine
from vkrt.model.synthetic import SyntheticSpec, write_model
from vkrt.settings import Settings


def bench_settings(sets: list[str] = (), **changes) -> Settings:
    """The VKRT_* environment as Settings, with `changes` (Settings fields) on top and a script's
    --set FIELD=VALUE items added after VKRT_TUNE's tuning overrides (vkrt/device/tune.py; a --set
    field wins over the same field in VKRT_TUNE, as a later item does). A --set item that does not
    parse is refused here, by that name."""
    settings = Settings.from_env().replace(**changes)
    if sets:
        parse_tune(" ".join(sets), "--set")
        settings = settings.replace(tune=" ".join((settings.tune, *sets)).strip())
    return settings


def polaris_class(settings: Settings) -> bool:
    """VKRT_ARCH=gcn: vkrt runs Polaris-class kernels, so the llama.cpp peer gets POLARIS_ENV."""
    return bool(settings.arch) and parse_arch(settings.arch) is Arch.AMD_GCN


@contextmanager
def opened(device, path: str, **options):
    """(model, engine) for `path` on `device` with EngineOptions `options` (no progress bars);
    both closed on exit, the engine first."""
    model, engine = open_engine(device, path, EngineOptions(**{"progress": False, **options}))
    try:
        yield model, engine
    finally:
        engine.close()
        model.close()


# seconds of untimed runs before a timing: a GPU left idle (while pipelines compile, or between
# short bursts) lowers its clocks, and short kernels timed straight away read up to 5x slow on an
# H200 (bench/matmul.py) and 4-10x on an H100 (bench/flash_attn_decode.py's quantised rows)
WARM_S = 2.0


def warm_up(*runs, seconds: float = WARM_S) -> None:
    """Call each of `runs` in turn (untimed) until `seconds` have passed."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for run in runs:
            run()


def model_error(exc: Exception, path: str) -> str:
    """The first line of `exc`, naming the model file `path` where it does not already."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text if path in text else f"{path}: {text}"


def delta_net_model(folder: str, n_layer: int) -> str:
    """A generated qwen35moe of n_layer layers (three DeltaNet layers to one gated attention;
    16-dim DeltaNet heads, conv 4, 8 experts) with tiny widths, written into `folder`."""
    return write_model(os.path.join(folder, f"qwen35moe-{n_layer}-layers.gguf"), SyntheticSpec(
        arch="qwen35moe", n_layer=n_layer, head_dim=32, rope_dims=8, full_attention_interval=4, ssm_head_dim=16,
        weight_type="Q8_0", seed=7, tokenizer_pre="qwen35", n_ff=0, n_expert=8, n_expert_used=2,
        n_ff_expert=32, n_ff_shared=32))


def lacks_delta_net(cfg, path: str) -> bool:
    """Whether the model has no DeltaNet layers (then says so on stderr: nothing to catch up)."""
    if cfg.linear_layers:
        return False
    print(f"{path}: no DeltaNet layers, nothing to catch up", file=sys.stderr)
    return True


def print_json(info: dict) -> None:
    """A benchmark's --json output: one object."""
    json.dump(info, sys.stdout, indent=1)
    print()
