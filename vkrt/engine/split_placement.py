"""Placing a layer split: which layers go to which device (-ts, else each device's VRAM), the
--n-cpu-moe that lets every device fit, and a clear error naming the device that does not."""

from __future__ import annotations

from ..model.config import ModelConfig
from ..model.layer_split import LayerSplit
from ..units import fmt_bytes
from .placement import DoesNotFit, VramEstimate, estimate


def stage_estimates(cfg: ModelConfig, tensors: dict, split: LayerSplit, n_cpu_moe: int, **kw) -> list[VramEstimate]:
    """The VRAM each stage of `split` takes (estimate()'s keywords)."""
    return [estimate(cfg, tensors, n_cpu_moe=n_cpu_moe, split=split, stage=k, **kw) for k in range(split.n_stages)]


def plan_split(cfg: ModelConfig, tensors: dict, devices: list, *, tensor_split=None, main_gpu: int | None = None,
               budgets: list[int | None] | None = None, requested: int | None = None,
               **kw) -> tuple[LayerSplit, int, list[VramEstimate]]:
    """(split, --n-cpu-moe, each stage's estimate) of `cfg` over `devices` (the --device order):
    layers in `tensor_split` proportions (default: each device's budget, else its free VRAM),
    the output on devices[main_gpu] (default: the last). With `budgets` (--vram-budget, one per
    device) and no `requested` --n-cpu-moe, the fewest layers' experts in host memory that let
    every device fit. DoesNotFit names the device that does not fit and by how many bytes."""
    n = len(devices)
    budgets = list(budgets) if budgets is not None else [None] * n
    caps = [b if b is not None else d.vram_free for b, d in zip(budgets, devices)]
    split = LayerSplit.plan(list(devices), cfg.n_layer, tensor_split if tensor_split is not None else caps,
                            n - 1 if main_gpu is None else main_gpu)
    where = [next(i for i, d in enumerate(devices) if d is dev) for dev in split.devices]

    def short(n_cpu_moe: int) -> list[tuple[int, VramEstimate]]:
        ests = stage_estimates(cfg, tensors, split, n_cpu_moe, **kw)
        return [(k, est) for k, est in enumerate(ests) if est.total > caps[where[k]]], ests

    def smallest_fit() -> int | None:
        return next((m for m in range(cfg.n_layer + 1 if cfg.moe else 1) if not short(m)[0]), None)

    if requested is None and cfg.moe and any(b is not None for b in budgets):
        fit = smallest_fit()
        if fit is not None:
            return split, fit, short(fit)[1]
        requested = cfg.n_layer
    n_cpu_moe = requested or 0
    bad, ests = short(n_cpu_moe)
    if not bad:
        return split, n_cpu_moe, ests
    k, est = bad[0]
    cap, dev = caps[where[k]], split.devices[k]
    fit = smallest_fit() if cfg.moe else None
    hint = (f"; --n-cpu-moe {fit} would fit" if fit is not None and fit > n_cpu_moe else
            "; give it fewer layers (-ts), add a device, or lower -c or -ub")
    what = "--vram-budget" if budgets[where[k]] is not None else "free VRAM"
    raise DoesNotFit(f"{dev.label} does not fit its part of the layer split ({split.describe()}): it needs "
                     f"{est.describe()}, {fmt_bytes(est.total - cap)} ({est.total - cap} bytes) more than its "
                     f"{fmt_bytes(cap)} of {what}{hint}")
