"""What the bench scripts share: the settings read once from the environment, whether the run is
Polaris-class (the llama.cpp peer then runs with the same restrictions), and models opened the
way the CLI, the server and the Python API open them (vkrt.engine.options)."""

from __future__ import annotations

from contextlib import contextmanager

from vkrt.device import Arch
from vkrt.engine.options import EngineOptions, open_engine
from vkrt.settings import Settings


def bench_settings(**changes) -> Settings:
    """The VKRT_* environment as Settings, with `changes` (Settings fields) on top."""
    return Settings.from_env().replace(**changes)


def polaris_class(settings: Settings) -> bool:
    """VKRT_ARCH=gcn: vkrt runs Polaris-class kernels, so the llama.cpp peer gets POLARIS_ENV."""
    return settings.arch is Arch.AMD_GCN


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
