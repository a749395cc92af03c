"""What the bench scripts share: the settings read once from the environment, whether the run is
Polaris-class (the llama.cpp peer then runs with the same restrictions), models opened the way
the CLI, the server and the Python API open them (vkrt.engine.options), and the GPU brought to
its working clock before a timing."""

from __future__ import annotations

import time
from contextlib import contextmanager

from vkrt.device import Arch, parse_arch, parse_tune
from vkrt.engine.options import EngineOptions, open_engine
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
