"""`vkrt devices`: what the runtime sees and which tuning it picked."""

from __future__ import annotations

import dataclasses
import json

import click

from vkrt.units import fmt_bytes

from .common import settings


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _rows(p, tuning) -> list[tuple[str, str]]:
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
        ("matrix cores", "coopmat2" if p.coopmat2 else "coopmat" if p.coopmat else "no"),
        ("shared memory", fmt_bytes(p.shared_memory)),
        ("VRAM", vram or "none (host memory only)"),
        ("host import", f"yes, alignment {p.host_import_alignment}" if p.host_import else "no"),
        ("transfer queue", f"yes (family {transfer.index})" if transfer else "no (uploads use the compute queue)"),
        ("buffer limits", f"storage range {fmt_bytes(p.max_storage_buffer_range)}, buffer "
                          f"{fmt_bytes(p.max_buffer_size)}, allocation {fmt_bytes(p.max_allocation_size)}"),
        ("tuning", f"workgroup {tuning.wg_size}, subgroup {tuning.subgroup}, "
                   f"fp16 math {_yes(tuning.fp16_math)}"),
    ]


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
def devices(as_json: bool) -> None:
    """List Vulkan devices, their capabilities and the tuning vkrt picks."""
    from vkrt.device.instance import Instance
    from vkrt.device.selection import select_device
    from vkrt.device.tuning import tuning_for
    from vkrt.errors import VkrtError

    with Instance(validate=False, settings=settings()) as instance:
        profiles = instance.profiles()
    try:
        selected = select_device(profiles, instance.settings.device).index
    except VkrtError:
        if not profiles:
            raise
        selected = None
    if as_json:
        out = {"selected": selected,
               "devices": [{**p.to_dict(), "tuning": {k: (v.value if hasattr(v, "value") else v)
                                                      for k, v in dataclasses.asdict(tuning_for(p)).items()}}
                           for p in profiles]}
        click.echo(json.dumps(out, indent=2))
        return
    for p in profiles:
        mark = "  [selected]" if p.index == selected else ""
        click.echo(f"Device {p.index}: {p.name}{mark}")
        rows = _rows(p, tuning_for(p))
        width = max(len(k) for k, _ in rows)
        for key, value in rows:
            click.echo(f"  {key:<{width}}  {value}")
        click.echo()
    if selected is None:
        click.echo("No device meets vkrt's needs (Vulkan 1.2, timeline semaphores, a compute queue).")
