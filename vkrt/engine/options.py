"""How a model is opened and run, as one object the CLI, the server, the bench scripts and the
Python API share: EngineOptions, and open_engine(device, path, options) -> (Model, Engine)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True)
class EngineOptions:
    """The model options of `vkrt run` / `bench` / `serve` (same names and defaults): context
    `n_ctx`, batch `n_batch`, micro-batch `n_ubatch`, flash attention, `n_gpu_layers` in VRAM,
    `mmap` (False: read into anonymous memory), `pin` (None: import host memory where allowed),
    KV type, `n_cpu_moe` expert layers in host memory, a VRAM budget in bytes (places experts to
    fit), the expert cache in bytes (None: what is left, 0: off), `n_seq_max` sequences at once
    with `n_checkpoints` recurrent-state checkpoints, and whether to show progress bars."""

    n_ctx: int = 4096
    n_batch: int = 2048
    n_ubatch: int = 512
    flash_attn: bool = True
    n_gpu_layers: int = 999
    mmap: bool = True
    pin: bool | None = None
    kv_type: str = "f16"
    n_cpu_moe: int | None = None
    vram_budget: int | None = None
    expert_cache: int | None = None
    n_seq_max: int = 1
    n_checkpoints: int = 0
    progress: bool | None = None

    def __post_init__(self):
        if self.kv_type not in ("f16", "f32"):
            raise ConfigError(f"kv_type must be 'f16' or 'f32', got {self.kv_type!r}")
        for name in ("n_ctx", "n_batch", "n_ubatch", "n_seq_max"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("n_gpu_layers", "n_checkpoints"):
            if int(getattr(self, name)) < 0:
                raise ConfigError(f"{name} must not be negative, got {getattr(self, name)}")
        for name in ("n_cpu_moe", "vram_budget", "expert_cache"):
            if getattr(self, name) is not None and int(getattr(self, name)) < 0:
                raise ConfigError(f"{name} must not be negative, got {getattr(self, name)}")


def open_engine(device, path: str, options: EngineOptions = EngineOptions()):
    """Open the model at `path` and its engine as `options` say; returns (Model, Engine), each
    to be closed by the caller (the engine first). The environment's switches (fusions, prefetch
    slots, expert staging, caches) come from `device.settings`."""
    from ..model.config import ModelConfig
    from ..model.loader import Model
    from ..model.split_gguf import open_gguf
    from .engine import Engine
    from .placement import plan_n_cpu_moe
    from .prefetch import slots_requested

    o = options
    n_cpu_moe = o.n_cpu_moe
    if o.vram_budget is not None:
        device.vram_budget = o.vram_budget
        with open_gguf(path, progress=False) as f:
            cfg = ModelConfig.from_metadata(f.metadata, path)
            n_cpu_moe = plan_n_cpu_moe(cfg, f.tensors, o.vram_budget, requested=n_cpu_moe, n_ctx=o.n_ctx,
                                       n_ubatch=min(o.n_ubatch, o.n_batch), n_gpu_layers=o.n_gpu_layers,
                                       kv_bytes=2 if o.kv_type == "f16" else 4, flash_attn=o.flash_attn,
                                       prefetch_slots=slots_requested(None, device.settings), n_seq_max=o.n_seq_max, device=device)
    model = Model(device, path, mmap=o.mmap, n_gpu_layers=o.n_gpu_layers, n_cpu_moe=n_cpu_moe or 0, pin=o.pin,
                  progress=o.progress)
    try:
        engine = Engine(model, n_ctx=o.n_ctx, n_batch=o.n_batch, n_ubatch=o.n_ubatch, flash_attn=o.flash_attn,
                        kv_type=o.kv_type.upper(), expert_cache=o.expert_cache, n_seq_max=o.n_seq_max,
                        n_checkpoints=o.n_checkpoints)
    except BaseException:
        model.close()
        raise
    return model, engine
