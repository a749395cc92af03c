"""`vkrt devices`: what the runtime sees and which tuning it picked."""

from __future__ import annotations

import dataclasses
import json

import click

from vkrt.units import fmt_bytes

from .common import KV_CACHE_TYPES, count, device_options, engine_options, open_devices, settings


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _rows(p, tuning, refused: str = "") -> list[tuple[str, str]]:
    transfer = p.transfer_family
    local = [h for h in p.heaps if h.device_local]
    vram = ", ".join(f"{fmt_bytes(h.size)} (heap {h.index}"
                     + (f", budget {fmt_bytes(h.budget)}" if h.budget is not None else "") + ")" for h in local)
    arch = p.architecture.value
    if p.architecture != p.detected_architecture:
        arch += f" (VKRT_ARCH override; detected {p.detected_architecture.value})"
    return [
        ("type", p.device_type),
        ("vendor", f"{p.vendor} (0x{p.vendor_id:04x}), device 0x{p.device_id:04x}"),
        ("driver", f"{p.driver_name} {p.driver_info} ({p.driver_version}), Vulkan {p.api_version}"),
        ("architecture", arch),
        ("subgroup", f"{p.subgroup_size} (min {p.subgroup_min}, max {p.subgroup_max}"
                     f"{', size control' if p.subgroup_size_control else ''})"),
        ("fp16 math", _yes(p.fp16_math)),
        ("16/8-bit storage", f"{_yes(p.storage_16bit)} / {_yes(p.storage_8bit)}"),
        ("int8 dot", _yes(p.int_dot) + (" (accelerated)" if p.int_dot_accelerated else "")),
        ("matrix cores", ("coopmat2" if p.coopmat2 else "coopmat" if p.coopmat else "no")
                         + (" (16x16x16 fp16)" if p.coopmat_f16 else "")),
        ("shared memory", fmt_bytes(p.shared_memory)),
        ("VRAM", vram or "none (host memory only)"),
        ("host import", f"yes, alignment {p.host_import_alignment}" if p.host_import else "no"),
        ("transfer queue", f"yes (family {transfer.index})" if transfer else "no (uploads use the compute queue)"),
        ("buffer limits", f"storage range {fmt_bytes(p.max_storage_buffer_range)}, buffer "
                          f"{fmt_bytes(p.max_buffer_size)}, allocation {fmt_bytes(p.max_allocation_size)}"),
        ("tuning", f"workgroup {tuning.wg_size}, subgroup {tuning.subgroup}, "
                   f"fp16 math {_yes(tuning.fp16_math)}, prompt GEMM "
                   + (f"on cooperative matrices ({tuning.mm_bm}x{tuning.mm_bn} tiles)" if tuning.mm_coopmat
                      else f"fp32 ({tuning.mm_bm}x{tuning.mm_bn} tiles"
                      + (f"; {tuning.mm_big_bm}x{tuning.mm_big_bn} past {tuning.mm_bn} token columns"
                         if tuning.mm_big_bn else "") + ")")
                   + ", prompt attention " + ("on cooperative matrices" if tuning.fa_coopmat else "fp32")
                   + (f"; {refused}" if refused else "")),
    ]


def _tuning(p, coopmat, tune):
    """(tuning, refusal): the tuning a device opened with VKRT_COOPMAT=`coopmat` and VKRT_TUNE's
    overrides `tune` (parse_tune's pairs) gets, or where the device refuses those settings, the
    table's and the refusal (the list shows every device)."""
    from vkrt.device.tune import tuning_for
    from vkrt.errors import ConfigError, UnsupportedDevice
    try:
        return tuning_for(p, coopmat, tune), ""
    except (UnsupportedDevice, ConfigError) as exc:
        return tuning_for(p), f"opening it would fail: {exc}"


def _parse_types(ctx, param, value: str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    from vkrt.cpu.dot_types import DOTS
    names = tuple(dict.fromkeys(v.strip().upper() for v in value.split(",") if v.strip()))
    bad = [n for n in names if n not in DOTS]
    if bad or not names:
        raise click.BadParameter(f"{', '.join(bad) or repr(value)}: the CPU expert kernels take {', '.join(DOTS)}")
    return names


class _BoxRequest:
    """What `vkrt devices` asked of the box's rates (vkrt/engine/box_rates.py): the CPU types
    (None: the default), whether to measure again, and whether to say so before measuring."""

    def __init__(self, types: tuple[str, ...] | None, remeasure: bool, announce: bool):
        self.types, self.remeasure, self.announce = types, remeasure, announce

    def measure(self, dev, default_types: tuple[str, ...]):
        """(rates, "") on the open device `dev`, or (None, why) where measuring failed."""
        from vkrt.engine.box_rates import box_rates
        from vkrt.errors import VkrtError
        try:
            return box_rates(dev, self.types or default_types, refresh=self.remeasure,
                             announce=click.echo if self.announce else None), ""
        except (VkrtError, OSError) as exc:
            return None, str(exc)

    def measure_default(self, usable: bool):
        """(rates, why not) on the device vkrt picks, opened for it."""
        from vkrt.device import Device
        from vkrt.errors import VkrtError
        if not usable:
            return None, "no usable device"
        try:
            with Device(validate=False, settings=settings()) as dev:
                return self.measure(dev, ("Q4_K",))
        except VkrtError as exc:
            return None, f"opening the device failed: {exc}"

    @staticmethod
    def show(rates, why: str) -> None:
        if rates is None:
            click.echo(f"box: not measured ({why})")
            return
        for line in rates.summary_lines():
            click.echo(line)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
@click.option("-m", "--model", "model", default=None,
              help="Show where this GGUF model's layers and buffers would go (with --device, -sm, -ts, -mg, ...).")
@device_options
@click.option("-c", "--ctx-size", "n_ctx", type=count(16), default=4096, show_default=True)
@click.option("-b", "--batch-size", "n_batch", type=count(1), default=2048, show_default=True)
@click.option("-ub", "--ubatch-size", "n_ubatch", type=count(1), default=512, show_default=True)
@click.option("-fa", "--flash-attn", "flash_attn", default="1", show_default=True)
@click.option("-ngl", "--n-gpu-layers", "n_gpu_layers", type=count(0), default=999)
@click.option("-ncmoe", "--n-cpu-moe", "n_cpu_moe", type=count(0), default=None)
@click.option("--kv-type", type=click.Choice(["f16", "f32"]), default="f16", show_default=True)
@click.option("-ctk", "--cache-type-k", "cache_type_k", type=click.Choice(KV_CACHE_TYPES), default=None,
              help="K cache type of the placement shown (default: --kv-type).")
@click.option("-ctv", "--cache-type-v", "cache_type_v", type=click.Choice(KV_CACHE_TYPES), default=None,
              help="V cache type of the placement shown (default: --kv-type).")
@click.option("--vram-budget", default=None, help="A size for every device, or one per device (8G,8G,4G).")
@click.option("-np", "--parallel", "n_parallel", type=count(1), default=1, show_default=True,
              help="Sequences at once (a server's slots: the recurrent state grows with them).")
@click.option("--remeasure", is_flag=True,
              help="Measure the box's rates (host -> GPU copy, RAM, CPU experts) again instead of reading the cache.")
@click.option("--types", "cpu_types", default=None, callback=_parse_types,
              help="GGUF weight types to measure the CPU expert FFN on, e.g. Q4_K,Q6_K (default: those of -m "
                   "MODEL's experts that the CPU kernels take, else Q4_K).")
def devices(as_json: bool, model: str | None, device: str | None, n_parallel: int, remeasure: bool,
            cpu_types: tuple[str, ...] | None, **plan_kw) -> None:
    """List Vulkan devices, their capabilities and the tuning vkrt picks, then this box's measured
    rates (cached); with -m, the placement of a model over --device (the layer split: layers and
    VRAM per device) and, on one device, the longest context that fits at each KV cache type."""
    box = _BoxRequest(cpu_types, remeasure, not as_json)
    if model is not None:
        _plan(model, device, n_parallel, as_json, plan_kw, box)
        return
    if device is not None or plan_kw["tensor_split"] is not None or plan_kw["main_gpu"] is not None:
        raise click.UsageError("--device, -ts and -mg show a placement: give the model with -m")
    from vkrt.device.instance import Instance
    from vkrt.device.selection import select_device
    from vkrt.device.tune import describe_tune, parse_tune
    from vkrt.errors import VkrtError

    with Instance(validate=False, settings=settings()) as instance:
        profiles = instance.profiles()
    coopmat, tune = instance.settings.coopmat, parse_tune(instance.settings.tune)
    try:
        selected = select_device(profiles, instance.settings.device).index
    except VkrtError:
        if not profiles:
            raise
        selected = None
    if as_json:
        out = {"selected": selected, "tune": describe_tune(tune),
               "devices": [{**p.to_dict(), "tuning": {k: (v.value if hasattr(v, "value") else v)
                                                      for k, v in dataclasses.asdict(_tuning(p, coopmat, tune)[0]).items()}}
                           for p in profiles]}
        rates, why = box.measure_default(selected is not None)
        out["box"] = rates.as_dict() if rates else None
        if why:
            out["box_error"] = why
        click.echo(json.dumps(out, indent=2))
        return
    for p in profiles:
        mark = "  [selected]" if p.index == selected else ""
        click.echo(f"Device {p.index}: {p.name}{mark}")
        rows = _rows(p, *_tuning(p, coopmat, tune))
        if tune:
            rows.append(("tuning overrides", f"VKRT_TUNE={describe_tune(tune)!r}"))
        width = max(len(k) for k, _ in rows)
        for key, value in rows:
            click.echo(f"  {key:<{width}}  {value}")
        click.echo()
    if selected is None:
        click.echo("No device meets vkrt's needs (Vulkan 1.2, timeline semaphores, a compute queue).")
    box.show(*box.measure_default(selected is not None))


def _plan(model: str, device: str | None, n_parallel: int, as_json: bool, plan_kw: dict, box: _BoxRequest) -> None:
    """Where `model` would go: per device its layers and the VRAM they take."""
    from vkrt.cpu.dot_types import DOTS
    from vkrt.engine.box_rates import expert_types
    from vkrt.engine.options import estimate_keywords, plan_layer_split
    from vkrt.engine.placement import estimate
    from vkrt.model.config import ModelConfig
    from vkrt.model.split_gguf import open_gguf

    o = engine_options(no_mmap=False, no_pin=False, n_seq_max=n_parallel, **plan_kw)
    with open_devices(device) as group:
        devs = list(group)
        budgets = o.budgets(len(devs))
        with open_gguf(model, progress=False) as f:
            cfg = ModelConfig.from_metadata(f.metadata, model)
            tensors = dict(f.tensors)
        rows, fits = [], None
        if len(devs) > 1 and o.split_mode == "layer":
            ests: list = []
            split, n_cpu_moe = plan_layer_split(devs, model, o, budgets, ests)
            for k, (dev, layers, est) in enumerate(zip(split.devices, split.ranges, ests)):
                rows.append((dev, layers, k == 0, k == split.n_stages - 1, est, budgets[devs.index(dev)]))
        else:
            main = o.main_gpu or 0
            if main >= len(devs):
                raise click.BadParameter(f"{main}: the device list has {len(devs)} device(s)", param_hint="-mg")
            n_cpu_moe = o.n_cpu_moe or 0
            keywords = estimate_keywords(o, devs[main])
            est = estimate(cfg, tensors, n_cpu_moe=n_cpu_moe, **keywords)
            rows.append((devs[main], range(cfg.n_layer), True, True, est, budgets[main]))
            available = budgets[main] if budgets[main] is not None else devs[main].vram_free
            fits = contexts_that_fit(cfg, tensors, available, n_cpu_moe, keywords)
        on_cpu = tuple(t for t in expert_types(tensors) if t in DOTS)
        rates, why = box.measure(rows[0][0], on_cpu or ("Q4_K",))
    out = {"model": model, "arch": cfg.arch, "n_layer": cfg.n_layer, "n_ctx_train": cfg.n_ctx_train,
           "split_mode": o.split_mode if len(devs) > 1 else "none", "n_cpu_moe": n_cpu_moe, "devices": []}
    for dev, layers, embed, output, est, budget in rows:
        out["devices"].append({
            "name": dev.label, "physical_index": dev.profile.index,
            "layers": [layers.start, layers.stop - 1] if len(layers) else [],
            "token_embd": embed, "output": output,
            "vram": {k: getattr(est, k) for k in ("weights", "kv_cache", "recurrent", "activations", "prefetch",
                                                  "staging")} | {"total": est.total},
            "available": budget if budget is not None else dev.vram_free,
            "available_is": "vram_budget" if budget is not None else "free_vram"})
    if fits is not None:
        out["devices"][0]["max_context_by_kv_type"] = fits
    out["box"] = rates.as_dict() if rates else None
    if why:
        out["box_error"] = why
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    click.echo(f"{model}: {cfg.arch}, {cfg.n_layer} layers, split mode {out['split_mode']}"
               + (f", --n-cpu-moe {n_cpu_moe}" if n_cpu_moe else ""))
    for d in out["devices"]:
        span = "no layers" if not d["layers"] else f"layers {d['layers'][0]}-{d['layers'][1]}"
        extra = "".join(f" + {what}" for what, on in (("token embedding", d["token_embd"]),
                                                      ("output and sampling", d["output"])) if on)
        v = d["vram"]
        click.echo(f"  {d['name']}: {span}{extra}")
        click.echo(f"    VRAM {fmt_bytes(v['total'])} of {fmt_bytes(d['available'])} "
                   f"({'--vram-budget' if d['available_is'] == 'vram_budget' else 'free'}): weights "
                   f"{fmt_bytes(v['weights'])}, KV cache {fmt_bytes(v['kv_cache'])}"
                   + (f", recurrent state {fmt_bytes(v['recurrent'])}" if v["recurrent"] else "")
                   + f", activations {fmt_bytes(v['activations'])}"
                   + (f", expert prefetch {fmt_bytes(v['prefetch'])}, staging {fmt_bytes(v['staging'])}"
                      if v["prefetch"] or v["staging"] else ""))
        if "max_context_by_kv_type" in d:
            click.echo(f"    longest context that fits, -ctk = -ctv (the model's trained context {cfg.n_ctx_train:,}): "
                       + ", ".join(f"{t} {n:,}" if n else f"{t} none" for t, n in d["max_context_by_kv_type"].items()))
    box.show(rates, why)


def contexts_that_fit(cfg, tensors: dict, available: int, n_cpu_moe: int, keywords: dict) -> dict[str, int]:
    """Per KV cache type (K and V alike), the longest context (a multiple of 256 cells, at most
    the trained context) the placement's estimate fits in `available` bytes; 0: none."""
    from vkrt.engine.placement import max_context
    from vkrt.ops.kv_quant import kv_type

    out = {}
    for name in KV_CACHE_TYPES:
        t = kv_type(name.upper())
        size = t.type_size / t.block_size
        out[name] = max_context(cfg, tensors, available, limit=cfg.n_ctx_train, n_cpu_moe=n_cpu_moe,
                                **{k: v for k, v in keywords.items() if k not in ("n_ctx", "kv_bytes")}, kv_bytes=(size, size))
    return out
