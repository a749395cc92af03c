"""How a model is opened and run, as one object the CLI, the server, the bench scripts and the
Python API share: EngineOptions, and open_engine(device, path, options) -> (Model, Engine)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from ..errors import ConfigError
from ..ops.kv_quant import KV_QUANT, KV_TYPES, kv_type

log = logging.getLogger("vkrt")


CPU_EXPERTS = ("off", "auto", "all")


@dataclass(frozen=True)
class EngineOptions:
    """The model options of `vkrt run` / `bench` / `serve` (same names and defaults): context
    `n_ctx`, batch `n_batch`, micro-batch `n_ubatch`, flash attention, `n_gpu_layers` in VRAM,
    `mmap` (False: read into anonymous memory), `pin` (None: import host memory where allowed),
    KV type (`kv_type` f16/f32; `cache_type_k` / `cache_type_v`, llama.cpp's -ctk/-ctv, override
    it for K / V with any KV type: f32, f16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl), `n_cpu_moe`
    expert layers in host memory, a VRAM budget in bytes (places experts to fit), the expert cache in bytes (None: what is left, 0: off), `n_seq_max` sequences at once
    with `n_checkpoints` recurrent-state checkpoints, `verify_tokens` the most tokens a
    speculative step takes (Engine's), and whether to show progress bars.

    Several devices (open_engine given a list): `split_mode` "layer" (llama.cpp's default: each
    device runs a share of the layers) or "none" (only devices[main_gpu]); `tensor_split` the
    shares, one per device (default: each device's VRAM budget, else its free VRAM); `main_gpu`
    the device holding the output and sampling (default: the last with a layer split, else 0);
    `vram_budget` one size for every device or a tuple of one per device; `pipeline_steps`: a
    step of several sequences runs as groups pipelined over the devices (Engine).

    Host-resident experts (docs/host-experts.md): `cpu_experts` "off" (every chosen expert runs
    on the GPU, copied over the link), "auto" (each runs where the measured rates say is cheaper:
    the expert cache, the CPU or a copy) or "all" (every expert not in the cache on the CPU);
    `cpu_moe_threads` the CPU expert kernels' threads (None: the CPU's cores); `link_bandwidth`
    GB/s paces host-to-device expert traffic to that rate, as a slower link would (None: unpaced).

    Images (--mmproj): `mmproj` the vision projector file (None: none); its tower goes on the
    main device, before the engine's buffers, and counts in the VRAM budget (the engine then
    holds it: Engine.vision)."""

    n_ctx: int = 4096
    n_batch: int = 2048
    n_ubatch: int = 512
    flash_attn: bool = True
    n_gpu_layers: int = 999
    mmap: bool = True
    pin: bool | None = None
    kv_type: str = "f16"
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    n_cpu_moe: int | None = None
    vram_budget: int | None = None
    expert_cache: int | None = None
    n_seq_max: int = 1
    n_checkpoints: int = 0
    verify_tokens: int = 0
    progress: bool | None = None
    split_mode: str = "layer"
    tensor_split: tuple[float, ...] | None = None
    main_gpu: int | None = None
    pipeline_steps: bool = False
    cpu_experts: str = "auto"
    cpu_moe_threads: int | None = None
    link_bandwidth: float | None = None
    mmproj: str | None = None

    def __post_init__(self):
        if self.cpu_experts not in CPU_EXPERTS:
            raise ConfigError(f"cpu_experts must be one of {', '.join(CPU_EXPERTS)}, got {self.cpu_experts!r}")
        if self.cpu_moe_threads is not None and int(self.cpu_moe_threads) < 1:
            raise ConfigError(f"cpu_moe_threads must be at least 1, got {self.cpu_moe_threads}")
        if self.link_bandwidth is not None and not float(self.link_bandwidth) > 0:
            raise ConfigError(f"link_bandwidth must be a positive GB/s figure, got {self.link_bandwidth}")
        if self.kv_type not in ("f16", "f32"):
            raise ConfigError(f"kv_type must be 'f16' or 'f32', got {self.kv_type!r}")
        for name, flag in (("cache_type_k", "-ctk"), ("cache_type_v", "-ctv")):
            value = getattr(self, name)
            if value is not None and str(value).upper() not in KV_TYPES:
                raise ConfigError(f"{flag} / {name}: {value!r} is not a KV cache type; choose one of "
                                  f"{', '.join(t.lower() for t in KV_TYPES)}")
        if not self.flash_attn and any(t.upper() in KV_QUANT for t in self.kv_types):
            raise ConfigError("a quantised KV cache (-ctk/-ctv) is read by flash attention only: turn it on "
                              "(-fa on) or keep -ctk/-ctv f16")
        if self.split_mode == "row":
            raise ConfigError("split mode 'row' (each matrix split across devices) is not supported: use -sm layer "
                              "(each device runs a share of the layers)")
        if self.split_mode not in ("none", "layer"):
            raise ConfigError(f"split_mode must be 'none' or 'layer', got {self.split_mode!r}")
        if self.main_gpu is not None and self.main_gpu < 0:
            raise ConfigError(f"main_gpu must not be negative, got {self.main_gpu}")
        for name in ("n_ctx", "n_batch", "n_ubatch", "n_seq_max"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("n_gpu_layers", "n_checkpoints", "verify_tokens"):
            if int(getattr(self, name)) < 0:
                raise ConfigError(f"{name} must not be negative, got {getattr(self, name)}")
        for name in ("n_cpu_moe", "expert_cache"):
            if getattr(self, name) is not None and int(getattr(self, name)) < 0:
                raise ConfigError(f"{name} must not be negative, got {getattr(self, name)}")
        budgets = self.vram_budget if isinstance(self.vram_budget, tuple) else (self.vram_budget,)
        if any(b is not None and int(b) < 0 for b in budgets):
            raise ConfigError(f"vram_budget must not be negative, got {self.vram_budget}")

    @property
    def kv_types(self) -> tuple[str, str]:
        """The K and V cache types (upper case): -ctk / -ctv, else kv_type."""
        return tuple(str(t or self.kv_type).upper() for t in (self.cache_type_k, self.cache_type_v))

    def budgets(self, n_devices: int) -> list[int | None]:
        """The VRAM budget of each of n_devices devices (ConfigError where the per-device lists,
        --vram-budget and -ts, do not give one per device)."""
        if self.tensor_split is not None and len(self.tensor_split) != n_devices:
            raise ConfigError(f"-ts gives {len(self.tensor_split)} proportion(s) for {n_devices} device(s) "
                              "(--device); give one per device")
        if not isinstance(self.vram_budget, tuple):
            return [self.vram_budget] * n_devices
        if len(self.vram_budget) != n_devices:
            raise ConfigError(f"--vram-budget gives {len(self.vram_budget)} sizes for {n_devices} device(s); give "
                              "one for all, or one per device")
        return list(self.vram_budget)


def open_engine(device, path: str, options: EngineOptions = EngineOptions()):
    """Open the model at `path` and its engine as `options` say, on `device` (a Device, or a list
    of them / a DeviceGroup: split by layers, or one of them, as options.split_mode says);
    returns (Model, Engine), each to be closed by the caller (the engine first). The environment's
    switches (fusions, prefetch slots, expert staging, caches) come from the devices' settings."""
    from ..model.loader import Model
    from ..model.vision import Vision
    from .engine import Engine

    o = options
    devices = list(device) if isinstance(device, (list, tuple)) or hasattr(device, "devices") else [device]
    budgets = o.budgets(len(devices))
    split = None
    if len(devices) > 1 and o.split_mode == "layer":
        split, n_cpu_moe = plan_layer_split(devices, path, o, budgets)
        device = split.main
    else:
        main = o.main_gpu or 0
        if main >= len(devices):
            raise ConfigError(f"-mg {main}: the device list has {len(devices)} device(s) (0..{len(devices) - 1})")
        device = devices[main]
        n_cpu_moe = _plan_one(device, path, o, budgets[main])
    model = Model(device, path, mmap=o.mmap, n_gpu_layers=o.n_gpu_layers, n_cpu_moe=n_cpu_moe or 0, pin=o.pin,
                  progress=o.progress, split=split)
    warn_past_trained_context(model.cfg, path, o)
    try:
        vision = Vision(device, o.mmproj, model.cfg, path) if o.mmproj is not None else None
        engine = Engine(model, n_ctx=o.n_ctx, n_batch=o.n_batch, n_ubatch=o.n_ubatch, flash_attn=o.flash_attn,
                        kv_type=o.kv_types[0], kv_type_v=o.kv_types[1], expert_cache=o.expert_cache, n_seq_max=o.n_seq_max,
                        n_checkpoints=o.n_checkpoints, verify_tokens=o.verify_tokens, pipeline_steps=o.pipeline_steps, cpu_experts=o.cpu_experts,
                        cpu_moe_threads=o.cpu_moe_threads, link_bandwidth=o.link_bandwidth, vision=vision)
    except BaseException:
        model.close()
        raise
    return model, engine


def warn_past_trained_context(cfg, path: str, o: EngineOptions) -> None:
    """A warning (as llama.cpp's) where a sequence's cells reach past the context the model was
    trained on ({arch}.context_length): positions past it work, but the model has not seen them."""
    per_seq = o.n_ctx // max(1, o.n_seq_max)
    if per_seq > cfg.n_ctx_train:
        log.warning("%s: %d cells a sequence (-c %d over %d sequence(s)) reach past the model's trained context "
                    "of %d tokens (%s.context_length): output past it may degrade", os.path.basename(path), per_seq,
                    o.n_ctx, max(1, o.n_seq_max), cfg.n_ctx_train, cfg.arch)


def estimate_keywords(o: EngineOptions, device) -> dict:
    from ..model.vision_memory import encoder_vram
    from .prefetch import slots_requested
    return dict(n_ctx=o.n_ctx, n_ubatch=min(o.n_ubatch, o.n_batch), n_gpu_layers=o.n_gpu_layers,
                kv_bytes=tuple(kv_type(t).type_size / kv_type(t).block_size for t in o.kv_types),
                flash_attn=o.flash_attn, prefetch_slots=slots_requested(None, device.settings),
                n_seq_max=o.n_seq_max, device=device, encoder=encoder_vram(o.mmproj, device),
                verify_tokens=o.verify_tokens)


def _plan_one(device, path: str, o: EngineOptions, budget: int | None) -> int | None:
    """The --n-cpu-moe on one device: the requested one, or under a budget the one that fits."""
    from ..model.config import ModelConfig
    from ..model.split_gguf import open_gguf
    from .placement import plan_n_cpu_moe

    if budget is None:
        return o.n_cpu_moe
    device.vram_budget = budget
    with open_gguf(path, progress=False) as f:
        cfg = ModelConfig.from_metadata(f.metadata, path)
        return plan_n_cpu_moe(cfg, f.tensors, budget, requested=o.n_cpu_moe, **estimate_keywords(o, device))


def plan_layer_split(devices: list, path: str, o: EngineOptions, budgets: list, estimates: list | None = None):
    """(LayerSplit, --n-cpu-moe) of a layer split over `devices` (budgets set on each device);
    `estimates` receives each stage's VramEstimate."""
    import logging

    from ..model.config import ModelConfig
    from ..model.split_gguf import open_gguf
    from .split_placement import plan_split

    for dev, budget in zip(devices, budgets):
        if budget is not None:
            dev.vram_budget = budget
    with open_gguf(path, progress=False) as f:
        cfg = ModelConfig.from_metadata(f.metadata, path)
        split, n_cpu_moe, ests = plan_split(cfg, f.tensors, devices, tensor_split=o.tensor_split,
                                            main_gpu=o.main_gpu, budgets=budgets, requested=o.n_cpu_moe,
                                            **estimate_keywords(o, devices[0]))
    if estimates is not None:
        estimates.extend(ests)
    logging.getLogger("vkrt").info("layer split: %s%s", split.describe(),
                                   f"; --n-cpu-moe {n_cpu_moe}" if n_cpu_moe else "")
    return split, n_cpu_moe
