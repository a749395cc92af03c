"""How much VRAM a configuration needs, and the --n-cpu-moe that makes it fit a budget."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import VkrtError
from ..device.tuning import Tuning
from ..model.config import ModelConfig
from ..model.loader import is_cpu_moe, layer_of
from ..model.scratch import scratch_bytes
from ..units import fmt_bytes
from .recurrent_state import keep_columns, kept_floats


DECODE_TOKENS = Tuning.mv_max_n   # decode steps (mat-vec sizes) stage this many tokens' experts


class DoesNotFit(VkrtError):
    """The model plus KV cache and buffers exceed the VRAM budget."""


@dataclass
class VramEstimate:
    weights: int
    kv_cache: int
    activations: int
    prefetch: int
    staging: int = 0
    recurrent: int = 0
    encoder: int = 0   # the vision tower (--mmproj): weights and its largest image's activations

    @property
    def total(self) -> int:
        return (self.weights + self.kv_cache + self.activations + self.prefetch + self.staging + self.recurrent
                + self.encoder)

    def describe(self) -> str:
        rec = f", recurrent state {fmt_bytes(self.recurrent)}" if self.recurrent else ""
        rec += f", vision encoder {fmt_bytes(self.encoder)}" if self.encoder else ""
        return (f"{fmt_bytes(self.total)} (weights {fmt_bytes(self.weights)}, KV cache {fmt_bytes(self.kv_cache)}"
                f"{rec}, activations {fmt_bytes(self.activations)}, expert prefetch slots {fmt_bytes(self.prefetch)}, "
                f"decode expert staging {fmt_bytes(self.staging)})")


def estimate(cfg: ModelConfig, tensors: dict, *, n_ctx: int, n_ubatch: int, n_cpu_moe: int, n_gpu_layers: int = 999,
             kv_bytes: float | tuple[float, float] = 2, flash_attn: bool = True, prefetch_slots: int = 0, n_seq_max: int = 1, device=None,
             split=None, stage: int = 0, encoder: int = 0, verify_tokens: int = 0) -> VramEstimate:
    """Bytes of VRAM a configuration takes; `tensors` maps names to objects with .nbytes (`device`:
    see scratch_bytes). With `split` (a LayerSplit), what its stage `stage` takes. `encoder`:
    a vision tower's bytes (model/vision_memory.py), on the main (output) stage. `verify_tokens`:
    as Engine's (the DeltaNet inputs a speculative step keeps)."""
    first_gpu = max(cfg.n_layer - n_gpu_layers, 0)
    layers = split.ranges[stage] if split is not None else range(cfg.n_layer)
    weights = 0
    if split is not None and stage == split.n_stages - 1 and "output.weight" not in tensors \
            and split.stage_of("token_embd.weight") != stage:   # the main device's copy of tied embeddings
        weights += tensors["token_embd.weight"].nbytes
    layer_experts: dict[int, int] = {}
    for name, t in tensors.items():
        il = layer_of(name)
        if il is not None and il >= cfg.n_layer:   # multi-token-prediction blocks are not loaded
            continue
        if split is not None and split.stage_of(name) != stage:
            continue
        if is_cpu_moe(name, n_cpu_moe):
            layer_experts[il] = layer_experts.get(il, 0) + t.nbytes
            continue
        if (il is not None and il < first_gpu) or (il is None and n_gpu_layers <= cfg.n_layer):
            continue
        weights += t.nbytes
    kb, vb = kv_bytes if isinstance(kv_bytes, tuple) else (kv_bytes, kv_bytes)   # bytes a value, K and V
    kv = int(len([il for il in cfg.kv_layers if il in layers]) * n_ctx * cfg.n_head_kv
             * (cfg.head_dim_k * kb + cfg.head_dim_v * vb))
    acts = scratch_bytes(cfg, n_ubatch, n_ctx, flash_attn, device, embd_input=encoder > 0)
    main = split is None or stage == split.n_stages - 1
    # each DeltaNet layer's state a sequence, and a short step's inputs kept (speculative steps' catch-up)
    kept = keep_columns(n_ubatch, verify_tokens) * kept_floats(cfg)
    recurrent = 4 * (cfg.recurrent_floats * max(1, n_seq_max) + kept) * len([il for il in cfg.linear_layers
                                                                            if il in layers])
    largest = max(layer_experts.values(), default=0)
    slots = prefetch_slots * largest
    staged = min(cfg.n_expert, cfg.n_expert_used * min(n_ubatch, DECODE_TOKENS)) if largest else 0
    return VramEstimate(weights, kv, acts, slots, staged * -(-largest // max(cfg.n_expert, 1)), recurrent,
                        encoder if main else 0)


def plan_n_cpu_moe(cfg: ModelConfig, tensors: dict, budget: int, *, requested: int | None, **kw) -> int:
    """The --n-cpu-moe to use under `budget`: the requested one if it fits (else DoesNotFit with a
    suggestion), or without a request the smallest that fits."""
    if requested is not None:
        est = estimate(cfg, tensors, n_cpu_moe=requested, **kw)
        if est.total <= budget:
            return requested
        fit = _smallest_fit(cfg, tensors, budget, kw)
        hint = f"; --n-cpu-moe {fit} would fit" if fit is not None else "; nothing fits: lower -c or -ub"
        raise DoesNotFit(f"the model needs {est.describe()} of VRAM with --n-cpu-moe {requested}, more than the "
                         f"budget of {fmt_bytes(budget)}{hint}")
    fit = _smallest_fit(cfg, tensors, budget, kw)
    if fit is None:
        est = estimate(cfg, tensors, n_cpu_moe=cfg.n_layer, **kw)
        raise DoesNotFit(f"even with every expert in host memory the model needs {est.describe()}, more than the "
                         f"budget of {fmt_bytes(budget)}: lower -c or -ub")
    return fit


def _smallest_fit(cfg, tensors, budget, kw) -> int | None:
    limit = cfg.n_layer if cfg.moe else 0
    for n in range(0, limit + 1):
        if estimate(cfg, tensors, n_cpu_moe=n, **kw).total <= budget:
            return n
    return None


CONTEXT_STEP = 256   # max_context's granularity (cells)


def max_context(cfg: ModelConfig, tensors: dict, budget: int, *, limit: int, **kw) -> int:
    """The largest context (a multiple of CONTEXT_STEP, at most `limit`) whose estimate fits in
    `budget` bytes with the other estimate keywords `kw` (n_cpu_moe, kv_bytes, ...); 0 when not
    even CONTEXT_STEP cells fit."""
    def fits(n_ctx: int) -> bool:
        return estimate(cfg, tensors, n_ctx=n_ctx, **kw).total <= budget

    lo, hi = 0, max(limit, CONTEXT_STEP) // CONTEXT_STEP   # in steps: lo fits (0 trivially), hi maybe
    if fits(hi * CONTEXT_STEP):
        return hi * CONTEXT_STEP
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid * CONTEXT_STEP) else (lo, mid)
    return lo * CONTEXT_STEP
